#!/usr/bin/env python3
"""Configure tinytrain: detect the toolchain and libraries, print what was found, write build.ninja.

    ./configure.py [--deps] [--cpu-only] [--debug] [--sanitize] [--builddir DIR] [--cuda-arch 80,90] [--cc gcc]

--deps       installs the Debian packages the build needs (apt-get; as root or through sudo)
--cpu-only   builds without CUDA even where nvcc is present
--debug      -O0 -g, and the runtime checks every arena plan with tt_arena_check
--sanitize   AddressSanitizer + UndefinedBehaviorSanitizer (CPU build); any finding, a leak included,
             fails the program that has it
--builddir   where objects, binaries and tests go (default build/, with ./build.ninja and ./tinytrain);
             another directory gets its own DIR/build.ninja and DIR/tinytrain, so a second variant
             (e.g. --cpu-only --sanitize --builddir build-san; ninja -f build-san/build.ninja test)
             leaves the normal build alone
--no-mpi     builds without MPI even where mpicc is found (one process; for a binary carried to a machine
             without MPI, e.g. tests/gpu/bundle.sh)
--cuda-arch  compute capabilities to build CUDA kernels for: a list (75,86), or `native` for the GPUs
             nvidia-smi sees; default: every architecture from 7.5 that nvcc supports
             (nvcc --list-gpu-arch). PTX of the newest one is always added, so a newer card JITs it.

Where clang links libFuzzer, build.ninja also has `ninja fuzz-build` (the fuzz targets of
tests/fuzz/, clang with ASan + UBSan, in build-fuzz/) and `ninja fuzz` (tests/fuzz/run.sh).

Standard library only. `python3 configure.py --amalgamate` (what `ninja amalgamation` runs)
joins core/ (its stage folders), arena/ and kernels/ into tinytrain.c + tinytrain.h.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
DEB_PACKAGES = ["ninja-build", "libopenblas-dev", "libdnnl-dev", "libstb-dev", "zlib1g-dev", "dataset-fashion-mnist",
                # the test that builds examples/embed against the installed library (tests/cli/test_install.sh)
                "pkg-config",
                "libturbojpeg0-dev",  # JPEG decoding (optional: without it stb_image decodes JPEG)
                "libpng-dev",  # PNG decoding with bounded memory (optional: without it stb_image decodes PNG)
                "libjpeg62-turbo-dev",  # its libjpeg API: decoding a crop box alone (optional)
                # the fuzz targets (tests/fuzz/): clang with libFuzzer (libclang-rt-dev) and its OpenMP
                "clang", "libclang-rt-dev", "libomp-dev",
                # multi-process training (core/runtime/dist.c): mpirun and MPI's headers and library
                "openmpi-bin", "libopenmpi-dev",
                # rsvg-convert: tests/compile/test_plan_svg.sh renders `plan --svg` to PNG (optional: SKIP without it)
                "librsvg2-bin"]

# Library sources (everything but the command line) in dependency order; the amalgamation keeps it.
# core/'s stage folders in the order of the flow (each includes only the folders before it;
# tests/test_layering.py holds that), then the arena planner and the CPU backends.
LIB_DIRS = ["core/base", "core/compile", "core/data", "core/runtime", "core/app", "arena", "kernels/ref", "kernels/cpu"]
CLI_SOURCES = ["core/app/main.c"]
# The C tests, tests/<stage>/<name>.c, each linked into build/tests/<name> (the binaries stay in one
# folder: the scripts, tests/gpu/ and the docs name them there).
TESTS = ["kernels/test_ops", "kernels/test_transformer_ops", "kernels/test_cpu_vs_ref", "compile/test_arena", "compile/test_recipe",
         "data/test_data", "data/test_safetensors", "compile/test_graph", "compile/test_lower", "runtime/test_step",
         "runtime/test_train", "compile/test_policy", "runtime/test_equiv", "runtime/test_precision", "kernels/test_cuda",
         "runtime/test_api", "runtime/test_finetune", "data/test_stream", "runtime/test_vit_torch", "compile/test_layout", "compile/test_layout_blk",
         "runtime/test_ostate"]
# A test built from several files: the ones beside its main file that match, linked into the same binary.
TEST_PARTS = {"test_cuda": "cuda_*.c"}
# The CUDA backend's own sources compiled as C++ against tests/cuda_emu (host emulation): test_cuda
# built against them runs without a GPU; emu_selftest checks the emulation's own checks.
EMU_TESTS = ["test_cuda_emu", "test_cuda_emu_self"]

# Not part of a --sanitize build's `ninja test`: test_step counts allocations by replacing
# malloc, which AddressSanitizer must own; test_torch_weights.sh runs ./tinytrain, not the
# sanitized binary, and PyTorch.
SANITIZE_SKIP = ["test_step", "tests/cli/test_torch_weights.sh", "tests/cli/test_install.sh"]


def test_sources(t):
    """The sources of C test t ("stage/name"): its main file, then its parts (TEST_PARTS), sorted."""
    main = "tests/%s.c" % t
    parts = TEST_PARTS.get(os.path.basename(t))
    if not parts:
        return [main]
    return [main] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, os.path.dirname(main), parts)))


def run(cmd):
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        return p.returncode, p.stdout.decode("utf-8", "replace")
    except (OSError, subprocess.TimeoutExpired):
        return 127, ""


def install_deps():
    apt = shutil.which("apt-get")
    if not apt:
        sys.exit("configure: --deps needs apt-get (Debian/Ubuntu); install by hand: " + " ".join(DEB_PACKAGES))
    prefix = []
    if os.geteuid() != 0:
        if not shutil.which("sudo"):
            sys.exit("configure: --deps must run as root or with sudo available")
        prefix = ["sudo"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    print("configure: installing " + " ".join(DEB_PACKAGES))
    for cmd in (prefix + [apt, "update", "-qq"], prefix + [apt, "install", "-y", "-qq"] + DEB_PACKAGES):
        if subprocess.call(cmd, env=env) != 0:
            sys.exit("configure: '%s' failed" % " ".join(cmd))


def first_existing(paths):
    for p in paths:
        if p and os.path.exists(p):
            return p
    return None


def header_define(path, name):
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    m = re.search(r"#\s*define\s+%s\s+(.+)" % name, text)
    return m.group(1).strip().strip('"').strip() if m else None


def find_cc(requested):
    for cc in [requested, os.environ.get("CC"), "cc", "gcc", "clang"]:
        if cc and shutil.which(cc):
            rc, out = run([cc, "--version"])
            if rc == 0:
                return cc, out.splitlines()[0]
    sys.exit("configure: no C compiler found (set CC or install gcc)")


def find_cxx(requested_cc):
    """The C++ compiler matching the C one (the CUDA emulation test needs it); None if absent."""
    cands = [os.environ.get("CXX")]
    if requested_cc and "clang" in os.path.basename(requested_cc):
        cands.append("clang++")
    cands += ["g++", "c++", "clang++"]
    for cxx in cands:
        if cxx and shutil.which(cxx):
            rc, out = run([cxx, "--version"])
            if rc == 0:
                return cxx, out.splitlines()[0]
    return None, None


def find_openblas():
    inc = first_existing(["/usr/include/x86_64-linux-gnu/openblas-pthread", "/usr/include/aarch64-linux-gnu/openblas-pthread",
                          "/usr/include/openblas", "/usr/local/include/openblas"])
    if inc is None and os.path.exists("/usr/include/cblas.h"):
        inc = "/usr/include"
    if inc is None:
        return None
    cfg = first_existing([os.path.join(inc, "openblas_config.h"), "/usr/include/x86_64-linux-gnu/openblas_config.h"])
    ver = header_define(cfg, "OPENBLAS_VERSION") if cfg else None
    ver = (ver or "unknown").replace("OpenBLAS", "").strip()
    return {"inc": inc, "version": ver}


def find_dnnl():
    """oneDNN (Debian: libdnnl-dev), the CPU backend's primitives: its header and version."""
    inc = None
    for d in ["/usr/include", "/usr/local/include"]:
        if os.path.exists(os.path.join(d, "oneapi", "dnnl", "dnnl.h")):
            inc = d
            break
    if inc is None:
        return None
    vh = os.path.join(inc, "oneapi", "dnnl", "dnnl_version.h")
    ver = ".".join(str(header_define(vh, "DNNL_VERSION_" + k)) for k in ("MAJOR", "MINOR", "PATCH"))
    cfg = header_define(os.path.join(inc, "oneapi", "dnnl", "dnnl_config.h"), "DNNL_CPU_RUNTIME") or "?"
    libs = glob.glob("/usr/lib/*-linux-gnu/libdnnl.so") + glob.glob("/usr/lib/libdnnl.so") + glob.glob("/usr/local/lib*/libdnnl.so")
    if not libs:
        return None
    return {"inc": inc, "version": ver, "runtime": cfg.replace("DNNL_RUNTIME_", ""), "lib": libs[0]}


def find_stb():
    inc = first_existing(["/usr/include/stb", "/usr/local/include/stb"])
    if not inc or not os.path.exists(os.path.join(inc, "stb_image.h")):
        return None
    ver = "unknown"
    with open(os.path.join(inc, "stb_image.h"), errors="replace") as f:
        m = re.search(r"stb_image - v(\S+)", f.read(4000))
        if m:
            ver = m.group(1)
    return {"inc": inc, "version": ver}


# TurboJPEG (libturbojpeg0-dev): compile and link flags when found, empty otherwise (the fuzz and
# emulation link lines use them too).
JPEG = {"cflags": "", "libs": ""}


def find_turbojpeg():
    h = first_existing(["/usr/include/turbojpeg.h", "/usr/local/include/turbojpeg.h"])
    libs = glob.glob("/usr/lib/*-linux-gnu/libturbojpeg.so") + glob.glob("/usr/lib/libturbojpeg.so") + \
        glob.glob("/usr/local/lib*/libturbojpeg.so")
    if not h or not libs:
        return None
    rc, out = run(["pkg-config", "--modversion", "libturbojpeg"]) if shutil.which("pkg-config") else (1, "")
    ver = out.strip() if rc == 0 and out.strip() else "unknown version"
    tj = {"version": ver, "lib": libs[0], "cflags": " -DTT_HAVE_TURBOJPEG=1", "libs": " -lturbojpeg", "libjpeg": False}
    # its libjpeg API (libjpeg62-turbo-dev) decodes a crop box alone (core/data/decode_jpeg_crop.c)
    if first_existing(["/usr/include/jpeglib.h", "/usr/local/include/jpeglib.h"]) and \
            glob.glob("/usr/lib/*-linux-gnu/libjpeg.so") + glob.glob("/usr/lib/libjpeg.so"):
        tj.update(cflags=tj["cflags"] + " -DTT_HAVE_LIBJPEG=1", libs=tj["libs"] + " -ljpeg", libjpeg=True)
    return tj


# libpng (libpng-dev): PNG decoded row by row into the header's size, whatever its data inflates to.
def find_libpng():
    h = first_existing(["/usr/include/png.h", "/usr/local/include/png.h"])
    libs = glob.glob("/usr/lib/*-linux-gnu/libpng.so") + glob.glob("/usr/lib/libpng.so") + glob.glob("/usr/local/lib*/libpng.so")
    if not h or not libs:
        return None
    return {"version": header_define(h, "PNG_LIBPNG_VER_STRING"), "lib": libs[0]}


def find_zlib():
    h = first_existing(["/usr/include/zlib.h", "/usr/local/include/zlib.h"])
    return {"version": header_define(h, "ZLIB_VERSION")} if h else None


def find_mpi():
    """MPI for multi-process training (Debian: openmpi-bin, libopenmpi-dev): the compile and link flags
    of mpicc --showme (or pkg-config ompi-c), the version mpirun reports, and whether mpirun is there."""
    flags = None
    mpicc = shutil.which("mpicc")
    if mpicc:
        rc1, comp = run([mpicc, "--showme:compile"])
        rc2, link = run([mpicc, "--showme:link"])
        if rc1 == 0 and rc2 == 0:
            flags = (comp.strip(), link.strip())
    if flags is None and shutil.which("pkg-config"):
        rc1, comp = run(["pkg-config", "--cflags", "ompi-c"])
        rc2, link = run(["pkg-config", "--libs", "ompi-c"])
        if rc1 == 0 and rc2 == 0:
            flags = (comp.strip(), link.strip())
    if flags is None:
        return None
    mpirun = shutil.which("mpirun")
    ver = "unknown"
    if mpirun:
        rc, out = run([mpirun, "--version"])
        m = re.search(r"(Open MPI|MPICH|HYDRA)\S*\)?\s*(?:Version:)?\s*(\d+\.\d+(?:\.\d+)?)", out)
        if m:
            ver = "%s %s" % (m.group(1), m.group(2))
    return {"cflags": flags[0], "libs": flags[1], "version": ver, "mpirun": mpirun}


def python_site_dirs():
    """Every Python environment's site-packages that may hold NVIDIA's wheels (nvidia-cudnn-cu*,
    nvidia-nccl-cu*, nvidia-cublas-cu*): the running interpreter's, $VIRTUAL_ENV's, venvs under
    /opt/*/ and ~/, and the system's and the user's."""
    dirs = []
    try:
        import site
        import sysconfig
        dirs += [sysconfig.get_paths().get(k) for k in ("purelib", "platlib")]
        dirs += list(getattr(site, "getsitepackages", lambda: [])()) + [getattr(site, "getusersitepackages", lambda: None)()]
    except Exception:
        pass
    pats = ["/usr/lib/python3*/*-packages", "/usr/local/lib/python3*/*-packages", "/opt/*/lib/python3*/site-packages",
            "/opt/*/.venv/lib/python3*/site-packages", "/opt/*/venv/lib/python3*/site-packages",
            "/opt/*/*/lib/python3*/site-packages",
            os.path.expanduser("~/.local/lib/python3*/site-packages"), os.path.expanduser("~/.venv/lib/python3*/site-packages"),
            os.path.expanduser("~/.pyenv/versions/*/lib/python3*/site-packages")]
    if os.environ.get("VIRTUAL_ENV"):
        pats.append(os.path.join(os.environ["VIRTUAL_ENV"], "lib/python3*/site-packages"))
    for pat in pats:
        dirs += sorted(glob.glob(pat))
    out = []
    for d in dirs:
        if d and os.path.isdir(os.path.join(d, "nvidia")) and os.path.realpath(d) not in [os.path.realpath(o) for o in out]:
            out.append(d)
    return out


def wheel_dirs(name):
    """(include, lib) pairs of NVIDIA's wheels in every site-packages: nvidia/<name>/{include,lib}
    (cu12 wheels) and nvidia/cu13/{include,lib} (the CUDA 13 wheels' common tree)."""
    pairs = []
    for sp in python_site_dirs():
        for sub in (name, "cu13", "cu12"):
            pairs.append((os.path.join(sp, "nvidia", sub, "include"), os.path.join(sp, "nvidia", sub, "lib")))
    return pairs


def lib_flag(libdir, name):
    """How to link lib<name> from libdir: -l<name> where the unversioned libname.so (the -dev link)
    exists, else -l:libname.so.N of the highest version there (wheels ship only versioned sonames);
    None when neither exists."""
    if os.path.exists(os.path.join(libdir, "lib%s.so" % name)):
        return "-l" + name
    vers = [os.path.basename(p) for p in glob.glob(os.path.join(libdir, "lib%s.so.*" % name))]
    vers = [v for v in vers if re.match(r"^lib%s\.so\.\d+$" % re.escape(name), v)]
    if not vers:
        return None
    vers.sort(key=lambda v: int(v.rsplit(".", 1)[1]))
    return "-l:" + vers[-1]


def find_nccl(cuda):
    """NCCL (the CUDA toolkit's, libnccl-dev, or a Python wheel's nvidia-nccl-cu*): header, library, version."""
    for inc, lib in [(os.path.join(cuda["home"], "include"), cuda["libdir"]),
                     ("/usr/include", "/usr/lib/x86_64-linux-gnu"), ("/usr/include", "/usr/lib/aarch64-linux-gnu")] + \
            wheel_dirs("nccl"):
        h = os.path.join(inc, "nccl.h")
        flag = lib_flag(lib, "nccl") if os.path.exists(h) else None
        if flag:
            ver = "%s.%s.%s" % (header_define(h, "NCCL_MAJOR"), header_define(h, "NCCL_MINOR"), header_define(h, "NCCL_PATCH"))
            return {"inc": inc, "lib": lib, "version": ver, "flag": flag}
    return None


def find_cuda():
    nvcc = shutil.which("nvcc") or first_existing(["/usr/local/cuda/bin/nvcc"])
    if not nvcc:
        return None
    rc, out = run([nvcc, "--version"])
    m = re.search(r"release (\d+\.\d+)", out)
    home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    cuda = {"nvcc": nvcc, "home": home, "version": m.group(1) if m else "unknown"}
    libdirs = [os.path.join(home, d) for d in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib")]
    cuda["libdir"] = first_existing(libdirs) or os.path.join(home, "lib64")
    # cuBLAS: the toolkit's, else a wheel's (nvidia-cublas-cu*: versioned sonames only)
    cuda["cublas"], cuda["cublas_flag"], cuda["cublas_lib"] = None, None, None
    for inc, lib in [(os.path.join(home, "include"), d) for d in libdirs] + wheel_dirs("cublas"):
        flag = lib_flag(lib, "cublas")
        h = os.path.join(inc, "cublas_api.h")
        if flag and os.path.exists(h):
            cuda["cublas"], cuda["cublas_flag"], cuda["cublas_lib"], cuda["cublas_inc"] = lib, flag, lib, inc
            cuda["cublas_version"] = "%s.%s.%s" % (header_define(h, "CUBLAS_VER_MAJOR"), header_define(h, "CUBLAS_VER_MINOR"),
                                                    header_define(h, "CUBLAS_VER_PATCH"))
            break
    # cuDNN: under the toolkit, in system paths, or in any Python environment's wheel (nvidia-cudnn-cu*)
    cands = [(os.path.join(home, "include"), cuda["libdir"]),
             ("/usr/include", "/usr/lib/x86_64-linux-gnu"),
             ("/usr/include/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu")] + wheel_dirs("cudnn")
    for inc, lib in cands:
        vh = os.path.join(inc, "cudnn_version.h")
        flag = lib_flag(lib, "cudnn") if os.path.exists(vh) else None
        if flag:
            cuda["cudnn"] = {"inc": inc, "lib": lib, "flag": flag, "version": "%s.%s.%s" % (
                header_define(vh, "CUDNN_MAJOR"), header_define(vh, "CUDNN_MINOR"), header_define(vh, "CUDNN_PATCHLEVEL"))}
            break
    return cuda


def nvcc_archs(nvcc):
    """Compute capabilities nvcc can build SASS for, from 7.5 up (CUDA 13 dropped everything older)."""
    rc, out = run([nvcc, "--list-gpu-arch"])
    caps = sorted({int(m) for m in re.findall(r"\bcompute_(\d+)\b", out)}) if rc == 0 else []
    return [str(c) for c in caps if c >= 75]


def choose_archs(requested, supported):
    """SASS architectures to build and the one to add PTX for (the newest)."""
    if requested is None:
        if not supported:
            sys.exit("configure: nvcc --list-gpu-arch listed no architecture from 7.5; give --cuda-arch")
        archs = supported
    elif requested.strip() == "native":
        archs = gpu_arch()
        if not archs:
            sys.exit("configure: --cuda-arch native: nvidia-smi found no GPU; give the list, e.g. --cuda-arch 75,86")
    else:
        archs = [a.strip().replace(".", "").replace("sm_", "") for a in requested.split(",") if a.strip()]
    bad = [a for a in archs if not a.isdigit() or int(a) < 75 or (supported and a not in supported)]
    if bad:
        sys.exit("configure: --cuda-arch %s: not buildable by this nvcc (it builds %s; CUDA 13 needs 7.5 or newer)" % (
            ",".join(bad), ",".join(supported) or "nothing from 7.5"))
    archs = sorted(set(archs), key=int)
    return archs, archs[-1]


def gpu_arch():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    rc, out = run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"])
    caps = sorted(set(l.strip().replace(".", "") for l in out.splitlines() if re.match(r"^\d+\.\d+$", l.strip())))
    return caps or None


FUZZ_TARGETS = ["recipe", "safetensors", "checkpoint", "image", "npy", "npy_set"]


def find_fuzzer():
    """clang that links -fsanitize=fuzzer,address,undefined with OpenMP, or (None, why)."""
    cc = os.environ.get("FUZZ_CC") or "clang"
    if not shutil.which(cc):
        return None, "no %s" % cc
    rc, out = run([cc, "--version"])
    ver = out.splitlines()[0] if rc == 0 and out else "unknown"
    d = os.path.join(ROOT, "build-fuzz")
    os.makedirs(d, exist_ok=True)
    src = os.path.join(d, "probe.c")
    with open(src, "w") as f:
        f.write("#include <stddef.h>\n#include <stdint.h>\n#include <omp.h>\n"
                "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; return (int)n * 0 + omp_get_max_threads() * 0; }\n")
    rc, out = run([cc, "-fsanitize=fuzzer,address,undefined", "-fopenmp", src, "-o", os.path.join(d, "probe")])
    if rc != 0:
        return None, "%s cannot link -fsanitize=fuzzer with -fopenmp (%s)" % (cc, (out.strip().splitlines() or ["?"])[-1])
    return {"cc": cc, "version": ver}, None


def fuzz_rules(fz, why, blas, stb, lib_src):
    """build.ninja lines for `ninja fuzz-build` (the targets, in build-fuzz/) and `ninja fuzz` (runs them)."""
    n = []
    bins = ["build-fuzz/fuzz_%s" % t for t in FUZZ_TARGETS]
    if not fz:
        msg = "fuzz: %s; install clang, libclang-rt-dev and libomp-dev (./configure.py --deps)" % why
        n.append("rule fuzzmissing\n  command = echo '%s' && false\n  description = FUZZ (unavailable)" % msg.replace("'", ""))
        n.append("build fuzz-build: fuzzmissing\nbuild fuzz: fuzzmissing")
        return n
    # The library again, with clang, coverage for libFuzzer and ASan + UBSan (every UB report fatal),
    # CPU only; objects apart from the gcc build's.
    n.append("fuzzcc = %s" % fz["cc"])
    n.append("fuzzflags = -O1 -g -std=c11 -D_GNU_SOURCE -Wall -Werror=implicit-function-declaration -Wno-unused-parameter "
             "-fopenmp -pthread -I. -I%s -I%s "
             "-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer%s"
             % (blas["inc"], stb["inc"], JPEG["cflags"]))
    n.append("rule fuzzcc\n  command = $fuzzcc -MMD -MF $out.d $fuzzflags -c $in -o $out\n  depfile = $out.d\n"
             "  deps = gcc\n  description = FUZZCC $out")
    n.append("rule fuzzlink\n  command = $fuzzcc -fsanitize=fuzzer,address,undefined -fopenmp -pthread $in -o $out "
             "-ldnnl -lopenblas -lz -lm%s\n  description = FUZZLINK $out" % JPEG["libs"])
    # ninja has built the targets already (the implicit inputs of `fuzz`): run.sh must not
    # start a second ninja inside this one
    n.append("rule fuzzrun\n  command = TT_FUZZ_BUILT=1 bash tests/fuzz/run.sh\n  description = FUZZ\n  pool = console")
    objs = []
    for src in lib_src:
        o = "build-fuzz/obj/" + src.replace("/", "_")[:-2] + ".o"
        n.append("build %s: fuzzcc %s" % (o, src))
        objs.append(o)
    n.append("build build-fuzz/libtinytrain.a: ar %s" % " ".join(objs))
    for t in FUZZ_TARGETS:
        o = "build-fuzz/obj/fuzz_%s.o" % t
        n.append("build %s: fuzzcc tests/fuzz/fuzz_%s.c" % (o, t))
        n.append("build build-fuzz/fuzz_%s: fuzzlink %s build-fuzz/libtinytrain.a" % (t, o))
    n.append("build fuzz-build: phony %s" % " ".join(bins))
    n.append("build fuzz: fuzzrun | %s" % " ".join(bins))
    return n


def sources(dirs, ext):
    out = []
    for d in dirs:
        out += sorted(glob.glob(os.path.join(ROOT, d, "*" + ext)))
    return [os.path.relpath(p, ROOT) for p in out if os.path.relpath(p, ROOT) not in CLI_SOURCES]


def amalgamate(out_dir=None):
    """Joins the library into tinytrain.h (public header) + tinytrain.c (every module, the CUDA
    backend behind #ifdef TT_HAVE_CUDA, which nvcc defines): in the repository root, or out_dir."""
    seen = set()
    out = []

    def emit(path):
        path = os.path.normpath(path)
        if path in seen:
            return
        seen.add(path)
        with open(os.path.join(ROOT, path)) as f:
            lines = f.read().splitlines()
        out.append("/* ---- %s ---- */" % path)
        for line in lines:
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if m:
                inc = m.group(1)
                for base in (os.path.dirname(path), "."):
                    cand = os.path.normpath(os.path.join(base, inc))
                    if os.path.exists(os.path.join(ROOT, cand)):
                        emit(cand)
                        break
                else:
                    out.append(line)
                continue
            out.append(line)

    # compiled by nvcc (-x cu): the CUDA backend too; by cc: the CPU backends alone
    out.append("#if defined(__CUDACC__) && !defined(TT_HAVE_CUDA)\n#define TT_HAVE_CUDA 1\n#endif")
    for src in sources(LIB_DIRS, ".c"):
        emit(src)
    out.append("#ifdef TT_HAVE_CUDA /* ---- the CUDA backend (nvcc -x cu) ---- */")
    for src in sources(["kernels/cuda"], ".cu"):
        emit(src)
    out.append("#endif /* TT_HAVE_CUDA */")
    dest = os.path.join(ROOT, out_dir) if out_dir else ROOT
    os.makedirs(dest, exist_ok=True)
    with open(os.path.join(dest, "tinytrain.c"), "w") as f:
        f.write("/* tinytrain.c — amalgamated by configure.py --amalgamate; do not edit. Build for the CPU:\n"
                " *   cc -O2 -std=c11 -D_GNU_SOURCE -fopenmp -c tinytrain.c -I/usr/include/x86_64-linux-gnu/openblas-pthread\n"
                " *      -I/usr/include/stb\n"
                " * and link with -fopenmp -ldnnl -lopenblas -lz -lm -lpthread (oneDNN from libdnnl-dev, OpenBLAS from\n"
                " * libopenblas-dev, stb_image.h from libstb-dev). With the CUDA backend:\n"
                " *   nvcc -x cu -std=c++17 -O2 -Xcompiler -fopenmp -arch=sm_80 -c tinytrain.c -I<cudnn include> (same -I)\n"
                " * and link with the same plus -lcudnn -lcublas -lcudart -ldl -lstdc++. */\n")
        f.write("\n".join(out) + "\n")
    with open(os.path.join(ROOT, "core", "tinytrain.h")) as f:
        hdr = f.read()
    with open(os.path.join(dest, "tinytrain.h"), "w") as f:
        f.write(hdr)
    print("wrote tinytrain.c (%d lines) and tinytrain.h" % len(out))


SYSTEM_PREFIXES = ("/usr", "/usr/local")


def install_system(prefix, destdir):
    """Whether an install lands in a directory the dynamic linker searches by itself (no DESTDIR,
    PREFIX /usr or /usr/local): then ldconfig refreshes its cache, and tinytrain.pc needs no rpath."""
    return not destdir and os.path.normpath(prefix) in SYSTEM_PREFIXES


def pc_text(prefix, version, libs):
    """tinytrain.pc: Libs with an rpath under a prefix the dynamic linker does not search, so a
    program built with it runs as built; Libs.private: every library libtinytrain.a needs, with
    their -L and rpaths (`pkg-config --static --libs tinytrain`)."""
    rpath = "" if os.path.normpath(prefix) in SYSTEM_PREFIXES else " -Wl,-rpath,${libdir}"
    return ("prefix=%s\nexec_prefix=${prefix}\nlibdir=${exec_prefix}/lib\nincludedir=${prefix}/include\n\n"
            "Name: tinytrain\nDescription: trains image classifiers on GPUs with little memory\nVersion: %s\n"
            "Libs: -L${libdir}%s -ltinytrain\nLibs.private: %s\nCflags: -I${includedir}\n" % (prefix, version, rpath, libs))


def install(builddir):
    """`ninja install`: the binary, libtinytrain.so (versioned soname), libtinytrain.a, the header and
    tinytrain.pc under $DESTDIR$PREFIX (PREFIX default /usr/local), from what configure recorded."""
    import json
    with open(os.path.join(ROOT, builddir, "install.json")) as f:
        info = json.load(f)
    prefix = os.environ.get("PREFIX") or "/usr/local"
    root = os.environ.get("DESTDIR", "") + prefix
    dirs = {k: os.path.join(root, k) for k in ("bin", "lib", "include", "lib/pkgconfig")}
    for d in dirs.values():
        os.makedirs(d, exist_ok=True)
    so, soname = info["so"], info["soname"]

    def put(src, dst, mode):
        tmp = dst + ".tmp"
        shutil.copyfile(os.path.join(ROOT, src), tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, dst)

    put(info["bin"], os.path.join(dirs["bin"], "tinytrain"), 0o755)
    put(os.path.join(builddir, so), os.path.join(dirs["lib"], so), 0o755)
    put(os.path.join(builddir, "libtinytrain.a"), os.path.join(dirs["lib"], "libtinytrain.a"), 0o644)
    if info.get("cuda_so"):  # the CUDA backend, opened when a GPU is used (core/runtime/cuda_load.c)
        put(os.path.join(builddir, info["cuda_so"]), os.path.join(dirs["lib"], info["cuda_so"]), 0o755)
    put("core/tinytrain.h", os.path.join(dirs["include"], "tinytrain.h"), 0o644)
    for link in (soname, "libtinytrain.so"):
        p = os.path.join(dirs["lib"], link)
        if os.path.lexists(p):
            os.remove(p)
        os.symlink(so, p)
    with open(os.path.join(dirs["lib/pkgconfig"], "tinytrain.pc"), "w") as f:
        f.write(pc_text(prefix, info["version"], info["libs"]))
    print("installed tinytrain %s under %s" % (info["version"], root))
    if install_system(prefix, os.environ.get("DESTDIR", "")):
        # a new libtinytrain.so.0 under /usr/local/lib is not found until the cache is rebuilt
        if subprocess.call(["ldconfig"]) == 0:
            print("ran ldconfig")
        else:
            print("ldconfig failed: run it as root before running programs linked to libtinytrain.so")


def library_rules(n, B, tt_bin, lib, objs, lib_src, opt, blas, stb, sanitize, use_cuda, nvcc_amal=None, extra_libs="",
                  all_libs=None, cuda_cflags="", cuda_so=None):
    """build.ninja lines for the shared library (versioned soname), the amalgamation compiled with cc
    and examples/embed linked against it, and `ninja install`; records what install needs in
    B/install.json. Returns what `ninja test` must build first."""
    import json
    version = header_define(os.path.join(ROOT, "core", "tinytrain.h"), "TT_VERSION") or "0.0.0"
    soname, so = "libtinytrain.so.%s" % version.split(".")[0], "libtinytrain.so.%s" % version
    n.append("rule solink\n  command = $cc -shared -Wl,-soname,%s $ldflags $in -o $out $libs\n  description = LINK $out" % soname)
    n.append("build %s/%s: solink %s" % (B, so, " ".join(objs)))
    amal = B + "/amalg"
    deps = lib_src + sources(["kernels/cuda"], ".cu")
    for d in LIB_DIRS + ["kernels", "kernels/cuda"]:
        deps += sources([d], ".h")
    n.append("rule amalgamate_dir\n  command = python3 configure.py --amalgamate --amalgamate-dir $dir > /dev/null\n"
             "  description = AMALGAMATE $dir")
    n.append("build %s/tinytrain.c %s/tinytrain.h: amalgamate_dir | configure.py %s\n  dir = %s"
             % (amal, amal, " ".join(sorted(set(deps))), amal))
    # the amalgamation as a user builds it: cc, no project flags beyond the libraries' include paths
    amalflags = "%s -std=c11 -D_GNU_SOURCE -fopenmp -pthread -I%s -I%s" % (opt, blas["inc"], stb["inc"])
    if sanitize:
        amalflags += " -fsanitize=address,undefined -fno-omit-frame-pointer"
    n.append("rule amalcc\n  command = $cc -MMD -MF $out.d %s $incl -c $in -o $out\n  depfile = $out.d\n  deps = gcc\n"
             "  description = CC (amalgamation) $out" % amalflags)
    n.append("rule amallink\n  command = $cc $ldflags $in -o $out -ldnnl -lopenblas -lz -lm\n  description = LINK $out")
    n.append("build %s/tinytrain.o: amalcc %s/tinytrain.c" % (amal, amal))
    n.append("build %s/obj/examples_embed.o: amalcc examples/embed/embed.c | %s/tinytrain.h\n  incl = -I%s" % (B, amal, amal))
    n.append("build %s/examples/embed: amallink %s/obj/examples_embed.o %s/tinytrain.o" % (B, B, amal))
    extra = []
    if nvcc_amal:  # the same tinytrain.c through nvcc -x cu: the CUDA backend compiles in it too
        n.append("rule amalnvcc\n  command = $nvcc -x cu %s -c $in -o $out\n  description = NVCC (amalgamation) $out" % nvcc_amal)
        n.append("build %s/tinytrain_cuda.o: amalnvcc %s/tinytrain.c" % (amal, amal))
        extra.append("%s/tinytrain_cuda.o" % amal)
    n.append("rule install\n  command = python3 configure.py --install %s\n  description = INSTALL\n  pool = console" % B)
    n.append("build install: install | %s %s/%s %s%s" % (tt_bin, B, so, lib, " " + cuda_so if cuda_so else ""))
    os.makedirs(os.path.join(ROOT, B), exist_ok=True)
    with open(os.path.join(ROOT, B, "install.json"), "w") as f:
        json.dump({"bin": tt_bin, "so": so, "soname": soname, "version": version, "cuda_cflags": cuda_cflags,
                   "cuda_so": os.path.basename(cuda_so) if cuda_so else None,
                   "libs": "-fopenmp -pthread " + all_libs if all_libs else
                           "-fopenmp -pthread -ldnnl -lopenblas -lz -lm" +
                           (" -lcudnn -lcublas -lcudart -ldl -lstdc++" if use_cuda else "") + extra_libs}, f)
    return ["%s/examples/embed" % B, "%s/%s" % (B, so), lib] + extra


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deps", action="store_true")
    ap.add_argument("--cpu-only", action="store_true")
    ap.add_argument("--debug", action="store_true")
    ap.add_argument("--sanitize", action="store_true")
    ap.add_argument("--builddir", default="build")
    ap.add_argument("--cuda-arch", default=None)
    ap.add_argument("--no-mpi", action="store_true")
    ap.add_argument("--cc", default=None)
    ap.add_argument("--amalgamate", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--amalgamate-dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--install", default=None, metavar="BUILDDIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.install:
        install(args.install)
        return
    if args.amalgamate:
        amalgamate(args.amalgamate_dir)
        return
    if args.deps:
        install_deps()

    cc, ccver = find_cc(args.cc)
    cxx, cxxver = find_cxx(cc)
    blas, dnnl, stb, zlib = find_openblas(), find_dnnl(), find_stb(), find_zlib()
    cuda = None if args.cpu_only else find_cuda()
    print("C compiler : %s (%s)" % (cc, ccver))
    print("C++        : %s" % (("%s (%s); CUDA backend tested under host emulation" % (cxx, cxxver)) if cxx else
                               "NOT FOUND: the CUDA emulation tests (test_cuda_emu) are not built"))
    print("OpenBLAS   : %s" % (("%s (%s)" % (blas["version"], blas["inc"])) if blas else "NOT FOUND"))
    print("oneDNN     : %s" % (("%s, %s runtime (%s)" % (dnnl["version"], dnnl["runtime"], dnnl["lib"])) if dnnl else "NOT FOUND"))
    print("stb        : %s" % (("stb_image v%s (%s)" % (stb["version"], stb["inc"])) if stb else "NOT FOUND"))
    print("zlib       : %s" % (zlib["version"] if zlib else "NOT FOUND"))
    mpi = None if args.no_mpi else find_mpi()
    print("MPI        : %s" % (("%s (%s)" % (mpi["version"], mpi["mpirun"] or "no mpirun: multi-process tests skipped"))
                               if mpi else "disabled (--no-mpi): one process only" if args.no_mpi else
                               "not found: one process only (openmpi-bin, libopenmpi-dev: ./configure.py --deps)"))
    tj = find_turbojpeg()
    JPEG.update(tj or {})
    png = find_libpng()
    if png:  # the image decoders' flags travel together (JPEG's cflags/libs are on every link line)
        JPEG.update(cflags=JPEG["cflags"] + " -DTT_HAVE_LIBPNG=1", libs=JPEG["libs"] + " -lpng")
    print("libpng     : %s" % (("%s (%s)" % (png["version"], png["lib"])) if png else
                               "not found: PNG decoded by stb_image, whose memory a PNG bomb can exhaust "
                               "(apt-get install libpng-dev)"))
    print("TurboJPEG  : %s" % (("libjpeg-turbo %s (%s)%s" % (tj["version"], tj["lib"], ", crop decoding through its libjpeg API"
                                                              if tj["libjpeg"] else "")) if tj else
                               "not found: JPEG decoded by stb_image (slower; apt-get install libturbojpeg0-dev)"))
    fuzz, fuzz_why = find_fuzzer()
    print("libFuzzer  : %s" % (("%s (ninja fuzz)" % fuzz["version"]) if fuzz else "not available (%s)" % fuzz_why))
    if args.cpu_only:
        print("CUDA       : disabled (--cpu-only)")
    elif not cuda:
        print("CUDA       : not found (building the CPU backend only)")
    else:
        print("CUDA       : %s (%s)" % (cuda["version"], cuda["nvcc"]))
        print("cuBLAS     : %s" % (cuda.get("cublas_version") or ("found" if cuda["cublas"] else "NOT FOUND")))
        print("cuDNN      : %s" % (("%s (%s, linked %s)" % (cuda["cudnn"]["version"], cuda["cudnn"]["lib"], cuda["cudnn"]["flag"]))
                                   if cuda.get("cudnn") else "NOT FOUND"))
        cuda["nccl"] = find_nccl(cuda)
        print("NCCL       : %s" % (("%s (%s, linked %s)" % (cuda["nccl"]["version"], cuda["nccl"]["lib"], cuda["nccl"]["flag"]))
                                   if cuda["nccl"] else
                                   "not found: multi-process training on GPUs unavailable (libnccl-dev)"))
    missing = [n for n, v in (("OpenBLAS (libopenblas-dev)", blas), ("oneDNN (libdnnl-dev)", dnnl), ("stb (libstb-dev)", stb),
                              ("zlib (zlib1g-dev)", zlib)) if not v]
    if dnnl and dnnl["runtime"] != "OMP":
        sys.exit("configure: oneDNN was built for the %s CPU runtime; tinytrain needs its OpenMP build (Debian's libdnnl-dev)" %
                 dnnl["runtime"])
    if missing:
        sys.exit("configure: missing required: %s; run ./configure.py --deps" % ", ".join(missing))
    use_cuda = bool(cuda and cuda["cublas"] and cuda.get("cudnn")) and bool(glob.glob(os.path.join(ROOT, "kernels/cuda/*.cu")))
    if cuda and not use_cuda and not args.cpu_only:
        print("CUDA       : cuBLAS/cuDNN or kernels/cuda missing: building the CPU backend only")
    arch = None
    if use_cuda:
        arch, ptx = choose_archs(args.cuda_arch, nvcc_archs(cuda["nvcc"]))
        print("CUDA arch  : %s + PTX compute_%s" % (",".join("sm_" + a for a in arch), ptx))

    opt = "-O0 -g" if args.debug else "-O2 -g"
    # -fvisibility=hidden: libtinytrain.so exports what core/tinytrain.h marks TT_API and nothing
    # else (tests/test_exports.sh); the static library and what links it are unaffected.
    # -Werror=implicit-function-declaration: a call with no prototype in sight links only in the
    # builds that happen to define it (a CPU-only build once failed at link time on one)
    cflags = "%s -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror=implicit-function-declaration -Wno-unused-parameter -fPIC " \
             "-fvisibility=hidden -fopenmp -pthread " \
             "-I. -I%s -I%s" % (opt, blas["inc"], stb["inc"])
    ldflags = "-fopenmp -pthread"
    libs = "-ldnnl -lopenblas -lz -lm" + JPEG["libs"]
    cflags += JPEG["cflags"]
    if args.debug:
        cflags += " -DTT_DEBUG=1"
    mpilibs = ""
    if mpi:  # core/runtime/dist.c: multi-process training under mpirun
        cflags += " -DTT_HAVE_MPI=1 " + mpi["cflags"]
        mpilibs = mpi["libs"]
        libs += " " + mpilibs
    if args.sanitize:
        cflags += " -fsanitize=address,undefined -fno-omit-frame-pointer"
        ldflags += " -fsanitize=address,undefined"
    nvflags = ""
    cuda_libs = ""  # libtinytrain_cuda.so's: nothing else links the CUDA libraries (core/runtime/cuda_load.c)
    if use_cuda:
        cflags += " -DTT_HAVE_CUDA=1 -DTT_CUDA_DLOPEN=1 -I%s/include -I%s" % (cuda["home"], cuda["cudnn"]["inc"])
        libs += " -ldl"
        gencode = " ".join("-gencode arch=compute_%s,code=sm_%s" % (a, a) for a in arch)
        gencode += " -gencode arch=compute_%s,code=compute_%s" % (ptx, ptx)
        # TT_CUDA_ARCHS: named in the message when the card has no kernel image in this build
        nvflags = "%s -std=c++17 %s -I. -I%s/include -I%s -DTT_HAVE_CUDA=1 -DTT_CUDA_ARCHS=\\\"%s\\\" -Xcompiler -fopenmp -Xcompiler -fPIC -Xcompiler -fvisibility=hidden" % (
            "-O0 -g" if args.debug else "-O2", gencode, cuda["home"], cuda["cudnn"]["inc"], ",".join(arch))
        if cuda.get("nccl"):  # kernels/cuda/cuda_nccl.cu: the all-reduce between GPUs
            nvflags += " -DTT_HAVE_NCCL=1 -I%s" % cuda["nccl"]["inc"]
            cflags += " -DTT_HAVE_NCCL=1"
            cuda_libs += " -L%s -Wl,-rpath,%s %s" % (cuda["nccl"]["lib"], cuda["nccl"]["lib"], cuda["nccl"]["flag"])
        # NVML (libnvidia-ml, part of the driver) is opened with dlopen at run time, and
        # libcudart loads libcuda itself, so the binary starts on a machine without a driver.
        # Wheels ship versioned sonames only (libcudnn.so.9): then -l:libcudnn.so.9 (lib_flag).
        libdirs = []
        for d in (cuda["libdir"], cuda["cublas_lib"], cuda["cudnn"]["lib"]):
            if d not in libdirs:
                libdirs.append(d)
        cuda_libs += " " + " ".join("-L%s -Wl,-rpath,%s" % (d, d) for d in libdirs)
        cuda_libs += " %s %s -lcudart -ldl -lstdc++" % (cuda["cudnn"]["flag"], cuda["cublas_flag"])

    ptx_arch = [ptx] if use_cuda else []
    cuda_check_flags = ""
    glob_h = []
    if use_cuda:
        cuda_check_flags = "-std=c++17 -O2 -I. -I%s/include -I%s -DTT_HAVE_CUDA=1" % (cuda["home"], cuda["cudnn"]["inc"])
        if cuda.get("nccl"):
            cuda_check_flags += " -DTT_HAVE_NCCL=1 -I%s" % cuda["nccl"]["inc"]
        glob_h = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "kernels/cuda/*.h")))
    B = args.builddir.rstrip("/") or "build"
    default_dir = os.path.normpath(B) == "build"
    tt_bin = "tinytrain" if default_dir else B + "/tinytrain"
    ninja_file = "build.ninja" if default_dir else B + "/build.ninja"
    lib_src = sources(LIB_DIRS, ".c")
    cu_src = sources(["kernels/cuda"], ".cu") if use_cuda else []
    n = []
    n.append("# generated by configure.py %s — do not edit; rerun ./configure.py" % " ".join(sys.argv[1:]))
    n.append("ninja_required_version = 1.7")
    if not default_dir:
        n.append("builddir = %s" % B)  # its own .ninja_log and .ninja_deps
    n.append("cc = %s" % cc)
    n.append("cflags = %s" % cflags)
    n.append("ldflags = %s" % ldflags)
    n.append("libs = %s" % libs)
    n.append("rule cc\n  command = $cc -MMD -MF $out.d $cflags -c $in -o $out\n  depfile = $out.d\n  deps = gcc\n  description = CC $out")
    n.append("rule link\n  command = $cc $ldflags $in -o $out $libs\n  description = LINK $out")
    n.append("rule ar\n  command = rm -f $out && ar crs $out $in\n  description = AR $out")
    if use_cuda:
        n.append("nvcc = %s\nnvflags = %s" % (cuda["nvcc"], nvflags))
        n.append("rule nvcc\n  command = $nvcc -MD -MF $out.d $nvflags -c $in -o $out\n  depfile = $out.d\n  deps = gcc\n  description = NVCC $out")
    if cxx:
        # The CUDA emulation: kernels/cuda/<name>.cu as C++ against the stub headers in
        # tests/cuda_emu/include (never the toolkit's), whether or not nvcc is installed.
        emuflags = "%s -std=c++17 -D_GNU_SOURCE -D__CUDACC__ -DTT_CUDA_EMULATION=1 -DTT_HAVE_CUDA=1 -Wall -Wextra " \
                   "-Wno-unused-parameter -I. -Itests/cuda_emu/include" % opt
        if args.sanitize:
            emuflags += " -fsanitize=address,undefined -fno-omit-frame-pointer"
        n.append("cxx = %s\nemuflags = %s" % (cxx, emuflags))
        n.append("rule emucxx\n  command = $cxx -MMD -MF $out.d $emuflags -x c++ -c $in -o $out\n  depfile = $out.d\n"
                 "  deps = gcc\n  description = CXX (emulated CUDA) $out")
        n.append("rule emulink\n  command = $cxx $ldflags $in -o $out -ldnnl -lopenblas -lz -lm -ldl%s %s\n" % (JPEG["libs"], mpilibs) +
                 "  description = LINK $out")
    # The shell tests run the binary named by TT. A sanitizer build reports leaks too, and every
    # finding makes the program exit non-zero, so the test that ran it fails.
    # tests/sanitize.supp names the findings in code that is not ours (a test's JPEG writer).
    # TT_TEST_SANITIZE=1 (tt_test_sanitized() in tests/tt_test.h) tells the long tests to run
    # their numerical sweeps shorter: under the sanitizers the value is every code path, not
    # many steps of it, which the plain build asserts (docs/testing.md).
    test_env = "TT=%s TT_BUILD=%s" % (tt_bin if "/" in tt_bin else "./" + tt_bin, B)
    if args.sanitize:
        test_env += (" ASAN_OPTIONS=detect_leaks=1:abort_on_error=0"
                     " UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=tests/sanitize.supp"
                     " TT_TEST_SANITIZE=1")
    n.append("rule test\n  command = %s python3 tests/run_tests.py $tests\n  description = TEST\n  pool = console" % test_env)
    n.append("rule amalgamate\n  command = python3 configure.py --amalgamate\n  description = AMALGAMATE")
    n.append("rule configure\n  command = python3 configure.py %s\n  generator = 1\n  description = CONFIGURE" % " ".join(
        a for a in sys.argv[1:] if a != "--deps"))
    objs = []
    for s in lib_src:
        o = B + "/obj/" + s.replace("/", "_")[:-2] + ".o"
        n.append("build %s: cc %s" % (o, s))
        objs.append(o)
    cu_objs = []
    for s in cu_src:
        o = B + "/obj/" + s.replace("/", "_")[:-3] + ".cu.o"
        n.append("build %s: nvcc %s" % (o, s))
        cu_objs.append(o)
    lib = B + "/libtinytrain.a"
    n.append("build %s: ar %s" % (lib, " ".join(objs)))
    # The CUDA backend in a library of its own, opened with dlopen when a GPU is used
    # (core/runtime/cuda_load.c): the binary and libtinytrain start without cudart, cuBLAS,
    # cuDNN and NCCL. Built with the binary; found beside it, or in ../lib when installed.
    cuda_so = B + "/libtinytrain_cuda.so" if use_cuda else None
    if use_cuda:
        n.append("rule cudalink\n  command = $cc -shared $ldflags $in -o $out%s\n  description = LINK $out" % cuda_libs)
        n.append("build %s: cudalink %s" % (cuda_so, " ".join(cu_objs)))
    cuda_dep = " | " + cuda_so if cuda_so else ""
    cli_objs = []
    for s in CLI_SOURCES:
        if os.path.exists(os.path.join(ROOT, s)):
            o = B + "/obj/" + s.replace("/", "_")[:-2] + ".o"
            n.append("build %s: cc %s" % (o, s))
            cli_objs.append(o)
    n.append("build %s: link %s %s%s" % (tt_bin, " ".join(cli_objs), lib, cuda_dep))
    test_bins = []
    test_cmds = []  # commands beside the binaries (an environment, arguments), quoted
    emu_cli = []  # build/tinytrain_emu where the emulated device is built (not under the sanitizers)
    for t in TESTS:
        name = os.path.basename(t)
        if not os.path.exists(os.path.join(ROOT, "tests/%s.c" % t)) or (args.sanitize and name in SANITIZE_SKIP):
            continue
        tobjs = []
        for src in test_sources(t):
            o = B + "/obj/" + src.replace("/", "_")[:-2] + ".o"
            n.append("build %s: cc %s" % (o, src))
            tobjs.append(o)
        n.append("build %s/tests/%s: link %s %s%s" % (B, name, " ".join(tobjs), lib, cuda_dep))
        test_bins.append("%s/tests/%s" % (B, name))
    if cxx:
        host_lib = B + "/libtinytrain_host.a"
        host_objs = objs
        n.append("build %s: ar %s" % (host_lib, " ".join(host_objs)))
        emu_objs = []
        for src in sources(["kernels/cuda"], ".cu") + sources(["tests/cuda_emu"], ".cc"):
            if src.endswith("emu_selftest.cc"):
                continue
            o = B + "/obj/emu/" + src.replace("/", "_").rsplit(".", 1)[0] + ".o"
            n.append("build %s: emucxx %s" % (o, src))
            emu_objs.append(o)
        cuda_test_objs = []
        for src in test_sources("kernels/test_cuda"):
            o = B + "/obj/emu/" + src.replace("/", "_")[:-2] + ".o"
            n.append("build %s: cc %s\n"
                     "  cflags = $cflags -DTT_HAVE_CUDA=1 -DTT_CUDA_EMULATION=1 -Itests/cuda_emu" % (o, src))
            cuda_test_objs.append(o)
        n.append("build %s/obj/emu/tests_cuda_emu_emu_selftest.o: emucxx tests/cuda_emu/emu_selftest.cc" % B)
        # test_cuda_emu plans on the emulated device too (cuda_precision_auto_sm75_sm80): the session
        # and dist objects built with TT_HAVE_CUDA come before the host library, whose own copies
        # (without it in a build without nvcc) are then not linked.
        n.append("build %s/obj/emu/core_runtime_session.o: cc core/runtime/session.c\n  cflags = $cflags -DTT_HAVE_CUDA=1" % B)
        n.append("build %s/obj/emu/core_runtime_dist.o: cc core/runtime/dist.c\n  cflags = $cflags -DTT_HAVE_CUDA=1" % B)
        emu_host = "%s/obj/emu/core_runtime_session.o %s/obj/emu/core_runtime_dist.o" % (B, B)
        n.append("build %s/tests/test_cuda_emu: emulink %s %s %s %s"
                 % (B, " ".join(cuda_test_objs), emu_host, " ".join(emu_objs), host_lib))
        n.append("build %s/tests/test_cuda_emu_self: emulink %s/obj/emu/tests_cuda_emu_emu_selftest.o %s %s"
                 % (B, B, " ".join(emu_objs), host_lib))
        test_bins += ["%s/tests/%s" % (B, t) for t in EMU_TESTS]
        # (acceptance.sh's racecheck runs the op tests alone, `--only kernels`: that they call no
        # cuDNN or cuBLAS is counted around each such test in the full run, test_cuda.c's hooks,
        # so ninja test does not run them a second time)
        # test_cuda_traffic: the same kernels with every load and store calling the traffic counter
        # (GCC's thread sanitizer instrumentation, its runtime not linked; tests/traffic/emu_traffic.h).
        # Not in a sanitizer build.
        if not args.sanitize:
            n.append("rule emutraffic\n  command = $cxx -MMD -MF $out.d $emuflags -fsanitize=thread "
                     "-x c++ -c $in -o $out\n  depfile = $out.d\n  deps = gcc\n  description = CXX (traffic-counted CUDA) $out")
            tr_objs = []
            for src in sources(["kernels/cuda"], ".cu"):
                o = B + "/obj/emutraffic/" + src.replace("/", "_").rsplit(".", 1)[0] + ".o"
                n.append("build %s: emutraffic %s" % (o, src))
                tr_objs.append(o)
            tr_objs += [o for o in emu_objs if "/tests_cuda_emu_" in o]
            n.append("build %s/obj/emu/tests_traffic_emu_traffic.o: emucxx tests/traffic/emu_traffic.cc\n"
                     "  emuflags = $emuflags -Itests/cuda_emu" % B)
            n.append("build %s/obj/emu/tests_kernels_test_cuda_traffic.o: cc tests/kernels/test_cuda_traffic.c\n"
                     "  cflags = $cflags -DTT_HAVE_CUDA=1 -DTT_CUDA_EMULATION=1 -Itests/cuda_emu" % B)
            n.append("build %s/tests/test_cuda_traffic: emulink %s/obj/emu/tests_kernels_test_cuda_traffic.o "
                     "%s/obj/emu/tests_traffic_emu_traffic.o %s %s" % (B, B, B, " ".join(tr_objs), host_lib))
            test_bins.append("%s/tests/test_cuda_traffic" % B)
        # The command line on the emulated device (build/tinytrain_emu): core/runtime/session.c
        # chooses the CUDA backend only when built with TT_HAVE_CUDA. `ninja test` builds it outside a
        # sanitizer build for tests/cli/test_replan_emu.sh and test_offload_emu.sh (about 50 s of runs;
        # they skip where it is not built).
        n.append("build %s/tinytrain_emu: emulink %s %s %s %s"
                 % (B, " ".join(cli_objs), emu_host, " ".join(emu_objs), host_lib))
        if not args.sanitize:
            emu_cli = ["%s/tinytrain_emu" % B]
    bench_bins = []
    for b in sorted(glob.glob(os.path.join(ROOT, "tests/bench/*.c"))):
        name = os.path.basename(b)[:-2]
        o = B + "/obj/bench_%s.o" % name
        n.append("build %s: cc %s" % (o, os.path.relpath(b, ROOT)))
        n.append("build %s/bench/%s: link %s %s" % (B, name, o, lib))
        n.append("build bench_%s: phony %s/bench/%s" % (name, B, name))
        bench_bins.append("%s/bench/%s" % (B, name))
    # `ninja bench` builds every benchmark; `ninja test` builds them too, so they always compile
    # and are never stale beside a rebuilt library.
    n.append("build bench: phony %s" % " ".join(bench_bins))
    test_deps = library_rules(n, B, tt_bin, lib, objs, lib_src, opt, blas, stb, args.sanitize, use_cuda,
                              ("-std=c++17 -O1 -arch=sm_%s -Xcompiler -fopenmp -D_GNU_SOURCE -I%s -I%s -I%s/include -I%s" % (
                                  ptx, blas["inc"], stb["inc"], cuda["home"], cuda["cudnn"]["inc"])) if use_cuda else None,
                              extra_libs=JPEG["libs"] + (" " + mpilibs if mpilibs else "") +
                                         ((" " + cuda["nccl"]["flag"]) if use_cuda and cuda.get("nccl") else ""),
                              all_libs=libs, cuda_so=cuda_so,
                              cuda_cflags=" ".join(dict.fromkeys(["-I%s/include" % cuda["home"], "-I%s" % cuda["cudnn"]["inc"]] +
                                                                 (["-I%s" % cuda["nccl"]["inc"]] if cuda.get("nccl") else [])))
                                          if use_cuda else "")
    # tests/test_*.sh (the repository's own checks), then each stage's, tests/<stage>/test_*.sh
    scripts = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "tests/test_*.sh")))
    scripts += sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "tests/*/test_*.sh")))
    if args.sanitize:
        scripts = [s for s in scripts if s not in SANITIZE_SKIP]
    n.append("build test: test | %s %s\n  tests = %s" % (tt_bin, " ".join(test_bins + bench_bins + test_deps + emu_cli), " ".join(test_bins + test_cmds + ["'bash %s'" % s for s in scripts])))
    if use_cuda:
        # `ninja cuda-check`: every .cu for the architectures CI checks, warnings as errors, resources
        # against each architecture's limits, and the linked binary's SASS/PTX list (tests/tools/cuda_check.py)
        n.append("rule cuda_check\n  command = python3 tests/tools/cuda_check.py --nvcc $nvcc --binary %s "
                 "--expect-sass=%s --expect-ptx=%s -- %s\n  description = CUDA-CHECK\n  pool = console" % (
                     cuda_so, ",".join(arch), ",".join(ptx_arch), cuda_check_flags))
        n.append("build cuda-check: cuda_check | %s tests/tools/cuda_check.py %s" % (cuda_so, " ".join(cu_src + glob_h)))
    n.append("build amalgamation: amalgamate | %s core/tinytrain.h" % " ".join(lib_src))
    if default_dir:  # the fuzz targets have their own directory, build-fuzz/: one set of rules for them
        n += fuzz_rules(fuzz, fuzz_why, blas, stb, lib_src)
    n.append("build %s: configure configure.py" % ninja_file)
    n.append("default %s" % tt_bin)
    os.makedirs(os.path.join(ROOT, B), exist_ok=True)
    with open(os.path.join(ROOT, ninja_file), "w") as f:
        f.write("\n".join(n) + "\n")
    print("wrote %s (%s build%s%s)" % (ninja_file, "CUDA + CPU" if use_cuda else "CPU-only", ", debug" if args.debug else "",
                                        ", sanitizers" if args.sanitize else ""))


if __name__ == "__main__":
    main()
