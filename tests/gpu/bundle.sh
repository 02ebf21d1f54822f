#!/usr/bin/env bash
# tests/gpu/bundle.sh — builds tinytrain for one GPU architecture here and packs what
# tests/gpu/acceptance.sh needs into one .tar.xz that runs on a machine with a GPU and no
# toolchain: the lent device machine of docs/gpu.md (CUDA 13 with cuBLAS, cuDNN and NCCL only in a
# Python environment's wheels, no oneDNN, OpenBLAS, TurboJPEG, libpng or MPI).
#
#   tests/gpu/bundle.sh [--arch 90] [--no-build] [--full-data] [--out gpu-bundle/FILE.tar.xz]
#
# Builds in build-bundle/ (./configure.py --builddir build-bundle --cuda-arch ARCH --no-mpi; the
# normal build/ is left alone), then packs, under tinytrain-bundle/:
#   bin/tinytrain, build/tests/test_cuda      the binaries (no rpath to this machine needed)
#   lib/libtinytrain_cuda.so                  the CUDA backend they open with dlopen
#   tinytrain, tt-env                         wrappers: tt-env CMD... runs CMD with LD_LIBRARY_PATH
#                                             = the bundle's lib/ + every nvidia/*/lib of the Python
#                                             environments there (cuDNN, NCCL from the wheels)
#   lib/                                      every shared library the binaries load that is not
#                                             libc/libm/libstdc++/libgcc/ld.so or CUDA's (ldd):
#                                             oneDNN, OpenCL loader, OpenBLAS, libgfortran, libquadmath,
#                                             libgomp, TurboJPEG, libjpeg, libpng, zlib
#   tests/gpu/*.sh and *.py (acceptance.sh, lease.sh, memprobe.py), tests/bench/resnet50_vs_torch.py,
#   tests/tools/st_compare.py, examples/*/*.recipe,
#   tests/fixtures/small_cnn.*, build/data/fashion-mnist (20000 training images and the 10000 test
#   images of Fashion-MNIST; --full-data: all 60000), MANIFEST (what, from where, versions)
# into gpu-bundle/tinytrain-bundle-smARCH.tar.xz (git-ignored), refused over 48 MiB.
# Carry it to the device machine (run's carry: gpu-bundle) and run
#   tests/gpu/acceptance.sh --bundle gpu-bundle/tinytrain-bundle-sm90.tar.xz
set -euo pipefail
cd "$(dirname "$0")/../.."
ARCH=90
BUILD=1
FULL=0
OUTF=""
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) ARCH=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --full-data) FULL=1; shift ;;
    --out) OUTF=$2; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "bundle.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
B=build-bundle
OUTF=${OUTF:-gpu-bundle/tinytrain-bundle-sm$ARCH.tar.xz}
LIMIT=$((48 * 1024 * 1024))
mkdir -p "$B" "$(dirname "$OUTF")"

if [ $BUILD = 1 ]; then
  ./configure.py --builddir "$B" --cuda-arch "$ARCH" --no-mpi >"$B/configure.log" 2>&1 || { cat "$B/configure.log" >&2; exit 1; }
  grep -q "CUDA + CPU build" "$B/configure.log" || { echo "bundle.sh: configure found no CUDA build (nvcc, cuBLAS, cuDNN):" >&2; cat "$B/configure.log" >&2; exit 1; }
  ninja -f "$B/build.ninja" "$B/tinytrain" "$B/tests/test_cuda" "$B/libtinytrain_cuda.so" >"$B/ninja.log" 2>&1 || { tail -n 40 "$B/ninja.log" >&2; exit 1; }
fi
for f in "$B/tinytrain" "$B/tests/test_cuda" "$B/libtinytrain_cuda.so"; do [ -x "$f" ] || { echo "bundle.sh: $f missing (run without --no-build)" >&2; exit 1; }; done

TMP=$(mktemp -d /tmp/tt_bundle.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
S=$TMP/tinytrain-bundle
mkdir -p "$S"/{bin,lib,build/tests,build/data/fashion-mnist,tests/gpu,tests/bench,tests/tools,tests/fixtures}
cp "$B/tinytrain" "$S/bin/tinytrain"
cp "$B/tests/test_cuda" "$S/build/tests/test_cuda"
# the CUDA backend, which tinytrain and test_cuda open with dlopen (core/runtime/cuda_load.c looks
# beside the program, in its parent directory and in ../lib): lib/ for bin/tinytrain, and a link
# in build/ for build/tests/test_cuda
cp "$B/libtinytrain_cuda.so" "$S/lib/libtinytrain_cuda.so"
ln -s ../lib/libtinytrain_cuda.so "$S/build/libtinytrain_cuda.so"
cp tests/gpu/*.sh tests/gpu/*.py "$S/tests/gpu/" # acceptance.sh, lease.sh, memprobe.py, ...
cp tests/bench/resnet50_vs_torch.py "$S/tests/bench/"
cp tests/tools/st_compare.py "$S/tests/tools/"
cp tests/fixtures/small_cnn.recipe "$S/tests/fixtures/"
for r in examples/*/*.recipe; do mkdir -p "$S/$(dirname "$r")"; cp "$r" "$S/$r"; done

# The shared libraries the target lacks: what ldd resolves here, less the C/C++ runtime (every
# Linux has it) and CUDA's own libraries (the driver, the toolkit's runtime and cuBLAS, and the
# wheels' cuDNN and NCCL are there, and must match the driver).
SKIP='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libutil|libstdc\+\+|libgcc_s|libcuda\.so|libcudart|libcublas|libcublasLt|libcudnn|libnccl|libnvidia|libnvrtc)'
for bin in "$S/bin/tinytrain" "$S/build/tests/test_cuda" "$S/lib/libtinytrain_cuda.so"; do
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if echo "$name" | grep -Eq "$SKIP"; then continue; fi
  cp -L "$path" "$S/lib/$name"
done
missing=$(for bin in "$S/bin/tinytrain" "$S/build/tests/test_cuda" "$S/lib/libtinytrain_cuda.so"; do ldd "$bin" | grep "not found" || true; done)
[ -z "$missing" ] || { echo "bundle.sh: libraries not found here: $missing" >&2; exit 1; }

cat >"$S/tt-env" <<'EOF'
#!/usr/bin/env bash
# tt-env CMD [ARGS]: runs CMD with the bundle's libraries and the CUDA libraries of the Python
# environments here (cuDNN, NCCL, cuBLAS wheels: nvidia/*/lib) on LD_LIBRARY_PATH.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
p=$here/lib
for d in $(python3 -c 'import site,sysconfig; print(" ".join(site.getsitepackages()+[sysconfig.get_paths()["purelib"]]))' 2>/dev/null) \
         /opt/*/.venv/lib/python3*/site-packages /opt/*/lib/python3*/site-packages /usr/local/lib/python3*/dist-packages; do
  for l in "$d"/nvidia/*/lib; do
    [ -d "$l" ] && case ":$p:" in *":$l:"*) ;; *) p=$p:$l ;; esac
  done
done
export LD_LIBRARY_PATH=$p${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
exec "$@"
EOF
cat >"$S/tinytrain" <<'EOF'
#!/usr/bin/env bash
# the bundled tinytrain with its libraries (tt-env)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$here/tt-env" "$here/bin/tinytrain" "$@"
EOF
chmod +x "$S/tt-env" "$S/tinytrain"

# Fashion-MNIST: the test set whole, the first 20000 training images (--full-data: all)
FASH=""
for d in "${TT_FASHION_DIR:-}" /usr/share/datasets/fashion-mnist build/data/fashion-mnist; do
  if [ -n "$d" ] && [ -f "$d/train-images-idx3-ubyte.gz" ]; then FASH=$d; break; fi
done
if [ -n "$FASH" ]; then
  python3 - "$FASH" "$S/build/data/fashion-mnist" "$FULL" <<'EOF'
import gzip, shutil, struct, sys, os
src, dst, full = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
    s, d = os.path.join(src, name + ".gz"), os.path.join(dst, name + ".gz")
    if full or name.startswith("t10k"):
        shutil.copyfile(s, d)
        continue
    data = gzip.open(s).read()
    n = 20000
    if "images" in name:
        magic, cnt, h, w = struct.unpack(">IIII", data[:16])
        out = struct.pack(">IIII", magic, n, h, w) + data[16:16 + n * h * w]
    else:
        magic, cnt = struct.unpack(">II", data[:8])
        out = struct.pack(">II", magic, n) + data[8:8 + n]
    with gzip.open(d, "wb", compresslevel=9) as f:
        f.write(out)
EOF
else
  rmdir "$S/build/data/fashion-mnist"
fi

{
  echo "tinytrain GPU bundle, sm_$ARCH, built $(date -u '+%Y-%m-%d %H:%M UTC') from commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  echo "configure: ./configure.py --builddir $B --cuda-arch $ARCH --no-mpi"
  grep -E '^(CUDA|cuBLAS|cuDNN|NCCL|oneDNN|OpenBLAS|MPI)' "$B/configure.log" 2>/dev/null || true
  echo "needs on the target: an NVIDIA driver for CUDA 13 (>= 580), libcudart.so.13 and libcublas.so.13 (toolkit or wheel), libcudnn.so.9 (cuDNN >= the version above, e.g. nvidia-cudnn-cu13), libnccl.so.2"
  echo "Fashion-MNIST: ${FASH:-none (the acceptance uses a synthetic set)}$([ -n "$FASH" ] && [ $FULL = 0 ] && echo ', 20000 training images + the 10000 test images')"
  echo "files:"
  (cd "$S" && find . -type f | sort | xargs ls -l | awk '{print "  " $5, $9}')
} >"$S/MANIFEST"

tar -C "$TMP" -cf - tinytrain-bundle | xz -T2 -6 >"$OUTF.tmp"
size=$(stat -c %s "$OUTF.tmp")
if [ "$size" -gt $LIMIT ]; then
  rm -f "$OUTF.tmp"
  echo "bundle.sh: the bundle is $((size / 1048576)) MiB, over the 48 MiB limit" >&2
  exit 1
fi
mv "$OUTF.tmp" "$OUTF"
echo "bundle.sh: wrote $OUTF ($(awk -v s="$size" 'BEGIN {printf "%.1f", s / 1048576}') MiB; $(ls "$S/lib" | wc -l) libraries: $(ls "$S/lib" | tr '\n' ' '))"
