#!/bin/bash
# tests/cli/test_bundle.sh — the GPU bundle (tests/gpu/bundle.sh) runs with nothing of this machine
# but the C runtime and CUDA's libraries, and what packs and runs it behaves without a GPU:
#   - configure.py finds cuDNN and NCCL in a Python environment's wheels (nvidia/<lib>/{include,lib},
#     versioned sonames only) and links them as -l:libcudnn.so.9; --no-mpi leaves MPI out;
#   - tests/gpu/acceptance.sh --bundle FILE without a GPU says so, checks its prerequisites, exits 0;
#   - the bundle itself (gpu-bundle/*.tar.xz, which .ci/run builds after `ninja test`: building it
#     takes minutes on 2 cores, so this test skips where it is absent) unpacked, and its
#     tinytrain --version and a CPU `plan` run in a private mount namespace (unshare -m) where the
#     system's oneDNN, OpenCL loader, OpenBLAS, libgfortran, TurboJPEG, libjpeg, libpng, zlib and
#     MPI are /dev/null (bind mounts): the build's own ./tinytrain fails there, the bundle's runs.
# Prints PASS/FAIL/SKIP lines; exits 1 if anything failed.
. "$(dirname "$0")/../tt_test.sh" bundle
# ---- configure: cuDNN and NCCL from a wheel's versioned sonames ----
SP=$TMP/venv/lib/python3.12/site-packages
mkdir -p "$SP/nvidia/cudnn/include" "$SP/nvidia/cudnn/lib" "$SP/nvidia/nccl/include" "$SP/nvidia/nccl/lib"
printf '#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 10\n#define CUDNN_PATCHLEVEL 2\n' >"$SP/nvidia/cudnn/include/cudnn_version.h"
printf '#define NCCL_MAJOR 2\n#define NCCL_MINOR 27\n#define NCCL_PATCH 3\n' >"$SP/nvidia/nccl/include/nccl.h"
: >"$SP/nvidia/cudnn/lib/libcudnn.so.9"
: >"$SP/nvidia/cudnn/lib/libcudnn_ops.so.9"
: >"$SP/nvidia/nccl/lib/libnccl.so.2"
out=$(VIRTUAL_ENV=$TMP/venv python3 - "$SP" <<'EOF' 2>&1
import sys
sys.path.insert(0, ".")
import configure as c
sp = sys.argv[1]
assert any(d == sp for d in c.python_site_dirs()), "site-packages of $VIRTUAL_ENV not searched: %s" % c.python_site_dirs()
pairs = c.wheel_dirs("cudnn")
assert (sp + "/nvidia/cudnn/include", sp + "/nvidia/cudnn/lib") in pairs, pairs
assert c.lib_flag(sp + "/nvidia/cudnn/lib", "cudnn") == "-l:libcudnn.so.9", c.lib_flag(sp + "/nvidia/cudnn/lib", "cudnn")
assert c.lib_flag(sp + "/nvidia/cudnn/lib", "cudnn_ops") == "-l:libcudnn_ops.so.9"
assert c.lib_flag(sp + "/nvidia/cudnn/lib", "cublas") is None
open(sp + "/nvidia/cudnn/lib/libcudnn.so", "w").close()
assert c.lib_flag(sp + "/nvidia/cudnn/lib", "cudnn") == "-lcudnn"
n = c.find_nccl({"home": "/nonexistent", "libdir": "/nonexistent"})
assert n and n["flag"] == "-l:libnccl.so.2" and n["version"] == "2.27.3", n
print("ok")
EOF
)
if [ "$out" = ok ]; then pass bundle_configure_wheels; else fail bundle_configure_wheels "$out"; fi
if ./configure.py --help 2>&1 | grep -q -- "--no-mpi"; then pass bundle_configure_no_mpi; else fail bundle_configure_no_mpi "configure.py has no --no-mpi"; fi

# ---- acceptance.sh --bundle without a GPU ----
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  skip bundle_acceptance_no_gpu "this machine has a GPU"
else
  : >"$TMP/empty.tar.xz"
  OUT=$TMP/out timeout 120 bash tests/gpu/acceptance.sh --bundle "$TMP/empty.tar.xz" >"$TMP/acc" 2>&1
  rc=$?
  if [ $rc = 0 ] && grep -q "no GPU here" "$TMP/acc" && grep -q "prerequisites" "$TMP/acc" && [ -f "$TMP/out/gpu-acceptance.md" ]; then
    pass bundle_acceptance_no_gpu
  else
    fail bundle_acceptance_no_gpu "exit $rc: $(tail -n 5 "$TMP/acc" | tr '\n' ' ')"
  fi
fi

# ---- the bundle, with the system's libraries hidden ----
BUNDLE=$(ls -t gpu-bundle/tinytrain-bundle-*.tar.xz 2>/dev/null | head -n 1)
if [ -z "$BUNDLE" ]; then
  skip bundle_hidden_libs "no gpu-bundle/tinytrain-bundle-*.tar.xz (tests/gpu/bundle.sh builds it; .ci/run does after ninja test)"
  exit $FAILED
fi
if [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null; then
  skip bundle_hidden_libs "unshare -m needs root here"
  exit $FAILED
fi
size=$(stat -c %s "$BUNDLE")
if [ "$size" -le $((48 * 1024 * 1024)) ]; then pass bundle_size; else fail bundle_size "$BUNDLE is $size bytes, over 48 MiB"; fi
newer=$(find core kernels arena -newer "$BUNDLE" -name '*.[ch]*' 2>/dev/null | head -n 3 | tr '\n' ' ')
[ -z "$newer" ] || echo "  note: $BUNDLE is older than $newer(rebuild: tests/gpu/bundle.sh)"
tar -C "$TMP" -xJf "$BUNDLE" || { fail bundle_unpack "tar -xJf $BUNDLE failed"; exit 1; }
U=$TMP/tinytrain-bundle
# what the lent image lacks, as this machine's real files (symbolic links resolved)
hide=""
for pat in 'libdnnl.so*' 'libOpenCL.so*' 'libopenblas*.so*' 'libgfortran.so*' 'libquadmath.so*' 'libturbojpeg.so*' \
           'libjpeg.so*' 'libpng16.so*' 'libz.so*' 'libmpi.so*' 'libopen-rte.so*' 'libopen-pal.so*'; do
  for f in /usr/lib/x86_64-linux-gnu/$pat /usr/lib/x86_64-linux-gnu/*/$pat; do
    [ -e "$f" ] && hide="$hide $(readlink -f "$f")"
  done
done
hide=$(echo "$hide" | tr ' ' '\n' | sort -u | tr '\n' ' ')
cat >"$TMP/inside.sh" <<EOF
for f in $hide; do mount --bind /dev/null "\$f" || exit 3; done
cd "$U"
echo "== the build's ./tinytrain with the system's libraries hidden (must fail)"
if [ -x "$PWD/tinytrain" ]; then "$PWD/tinytrain" --version >/dev/null 2>&1 && echo "HIDING-FAILED" || echo "hidden ok"; fi
echo "== ldd of the bundled binaries"
./tt-env ldd bin/tinytrain build/tests/test_cuda | grep -E "not found|=> /" | grep -v "=> $U/lib/" | grep -vE "libc\.so|libm\.so|libstdc|libgcc_s|libpthread|libdl\.so|librt\.so|ld-linux|libcud|libcublas|libnccl"
echo "== version"
./tinytrain --version || exit 4
echo "== plan"
./tinytrain plan --device cpu --vram 4G examples/fashion_mnist/lenet.recipe || exit 5
EOF
t0=$(date +%s%N)
unshare -m bash "$TMP/inside.sh" >"$TMP/inside" 2>&1
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
if [ $rc = 0 ] && grep -q "hidden ok" "$TMP/inside" && ! grep -q "HIDING-FAILED\|not found" "$TMP/inside" &&
   grep -q "^tinytrain " "$TMP/inside" && grep -qi "micro-batch" "$TMP/inside"; then
  pass "bundle_hidden_libs ($(echo $hide | wc -w) system libraries hidden, $ms ms; $(grep '^backends' "$TMP/inside" | cut -c1-80))"
else
  fail bundle_hidden_libs "exit $rc: $(sed -n '1,40p' "$TMP/inside" | tr '\n' '|')"
fi
exit $FAILED
