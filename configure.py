#!/usr/bin/env python3
"""Configure tinytrain: detect the toolchain and libraries, print what was found, write build.ninja.

    ./configure.py [--deps] [--cpu-only] [--debug] [--sanitize] [--cuda-arch 80,90] [--cc gcc]

--deps       installs the Debian packages the build needs (apt-get; as root or through sudo)
--cpu-only   builds without CUDA even where nvcc is present
--debug      -O0 -g, and the runtime checks every arena plan with arena_check
--sanitize   AddressSanitizer + UndefinedBehaviorSanitizer (CPU build)
--cuda-arch  compute capabilities to build CUDA kernels for (default: the GPU found, else 80,90)

Standard library only. `python3 configure.py --amalgamate` (what `ninja amalgamation` runs)
joins core/, arena/ and kernels/ into tinytrain.c + tinytrain.h.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
DEB_PACKAGES = ["ninja-build", "libopenblas-dev", "libdnnl-dev", "libstb-dev", "zlib1g-dev", "dataset-fashion-mnist"]

# Library sources (everything but the command line) in dependency order; the amalgamation keeps it.
LIB_DIRS = ["core", "arena", "kernels/ref", "kernels/cpu"]
CLI_SOURCES = ["core/main.c"]
TESTS = ["test_ops", "test_cpu_vs_ref", "test_arena", "test_recipe", "test_data", "test_safetensors", "test_graph",
         "test_lower", "test_step", "test_train", "test_sched", "test_cuda"]


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


def find_zlib():
    h = first_existing(["/usr/include/zlib.h", "/usr/local/include/zlib.h"])
    return {"version": header_define(h, "ZLIB_VERSION")} if h else None


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
    cublas = first_existing([os.path.join(d, "libcublas.so") for d in libdirs])
    cuda["cublas"] = cublas
    if cublas:
        h = first_existing([os.path.join(home, "include", "cublas_api.h")])
        if h:
            cuda["cublas_version"] = "%s.%s.%s" % (header_define(h, "CUBLAS_VER_MAJOR"), header_define(h, "CUBLAS_VER_MINOR"),
                                                    header_define(h, "CUBLAS_VER_PATCH"))
    # cuDNN: under the toolkit, in system paths, or in a Python wheel (nvidia-cudnn-cu*).
    cands = [(os.path.join(home, "include"), cuda["libdir"]),
             ("/usr/include", "/usr/lib/x86_64-linux-gnu"),
             ("/usr/include/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu")]
    for sp in sorted(set(glob.glob("/usr/lib/python3*/*-packages") + glob.glob("/usr/local/lib/python3*/*-packages") +
                         glob.glob(os.path.expanduser("~/.local/lib/python3*/site-packages")) +
                         glob.glob(os.path.expanduser("~/.pyenv/versions/*/lib/python3*/site-packages")))):
        cands.append((os.path.join(sp, "nvidia", "cudnn", "include"), os.path.join(sp, "nvidia", "cudnn", "lib")))
    for inc, lib in cands:
        vh = os.path.join(inc, "cudnn_version.h")
        if os.path.exists(vh) and (glob.glob(os.path.join(lib, "libcudnn.so*"))):
            cuda["cudnn"] = {"inc": inc, "lib": lib, "version": "%s.%s.%s" % (
                header_define(vh, "CUDNN_MAJOR"), header_define(vh, "CUDNN_MINOR"), header_define(vh, "CUDNN_PATCHLEVEL"))}
            break
    return cuda


def gpu_arch():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    rc, out = run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"])
    caps = sorted(set(l.strip().replace(".", "") for l in out.splitlines() if re.match(r"^\d+\.\d+$", l.strip())))
    return caps or None


def sources(dirs, ext):
    out = []
    for d in dirs:
        out += sorted(glob.glob(os.path.join(ROOT, d, "*" + ext)))
    return [os.path.relpath(p, ROOT) for p in out if os.path.relpath(p, ROOT) not in CLI_SOURCES]


def amalgamate():
    """Joins the library into tinytrain.h (public header) + tinytrain.c (every module)."""
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

    for src in sources(LIB_DIRS, ".c"):
        emit(src)
    with open(os.path.join(ROOT, "tinytrain.c"), "w") as f:
        f.write("/* tinytrain.c — amalgamated by configure.py --amalgamate; do not edit. Build:\n"
                " *   cc -O2 -fopenmp -c tinytrain.c -I/usr/include/x86_64-linux-gnu/openblas-pthread -I/usr/include/stb\n"
                " * and link with -fopenmp -ldnnl -lopenblas -lz -lm -lpthread (oneDNN from libdnnl-dev, OpenBLAS from\n"
                " * libopenblas-dev, stb_image.h from libstb-dev). */\n")
        f.write("\n".join(out) + "\n")
    with open(os.path.join(ROOT, "core", "tinytrain.h")) as f:
        hdr = f.read()
    with open(os.path.join(ROOT, "tinytrain.h"), "w") as f:
        f.write(hdr)
    print("wrote tinytrain.c (%d lines) and tinytrain.h" % len(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deps", action="store_true")
    ap.add_argument("--cpu-only", action="store_true")
    ap.add_argument("--debug", action="store_true")
    ap.add_argument("--sanitize", action="store_true")
    ap.add_argument("--cuda-arch", default=None)
    ap.add_argument("--cc", default=None)
    ap.add_argument("--amalgamate", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.amalgamate:
        amalgamate()
        return
    if args.deps:
        install_deps()

    cc, ccver = find_cc(args.cc)
    blas, dnnl, stb, zlib = find_openblas(), find_dnnl(), find_stb(), find_zlib()
    cuda = None if args.cpu_only else find_cuda()
    print("C compiler : %s (%s)" % (cc, ccver))
    print("OpenBLAS   : %s" % (("%s (%s)" % (blas["version"], blas["inc"])) if blas else "NOT FOUND"))
    print("oneDNN     : %s" % (("%s, %s runtime (%s)" % (dnnl["version"], dnnl["runtime"], dnnl["lib"])) if dnnl else "NOT FOUND"))
    print("stb        : %s" % (("stb_image v%s (%s)" % (stb["version"], stb["inc"])) if stb else "NOT FOUND"))
    print("zlib       : %s" % (zlib["version"] if zlib else "NOT FOUND"))
    if args.cpu_only:
        print("CUDA       : disabled (--cpu-only)")
    elif not cuda:
        print("CUDA       : not found (building the CPU backend only)")
    else:
        print("CUDA       : %s (%s)" % (cuda["version"], cuda["nvcc"]))
        print("cuBLAS     : %s" % (cuda.get("cublas_version") or ("found" if cuda["cublas"] else "NOT FOUND")))
        print("cuDNN      : %s" % (("%s (%s)" % (cuda["cudnn"]["version"], cuda["cudnn"]["inc"])) if cuda.get("cudnn") else "NOT FOUND"))
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
        arch = args.cuda_arch.replace(" ", "").split(",") if args.cuda_arch else (gpu_arch() or ["80", "90"])
        print("CUDA arch  : %s" % ",".join("sm_" + a for a in arch))

    opt = "-O0 -g" if args.debug else "-O2 -g"
    cflags = "%s -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -fopenmp -pthread -I. -I%s -I%s" % (
        opt, blas["inc"], stb["inc"])
    ldflags = "-fopenmp -pthread"
    libs = "-ldnnl -lopenblas -lz -lm"
    if args.debug:
        cflags += " -DTT_DEBUG=1"
    if args.sanitize:
        cflags += " -fsanitize=address,undefined -fno-omit-frame-pointer"
        ldflags += " -fsanitize=address,undefined"
    nvflags = ""
    if use_cuda:
        cflags += " -DTT_HAVE_CUDA=1 -I%s/include -I%s" % (cuda["home"], cuda["cudnn"]["inc"])
        gencode = " ".join("-gencode arch=compute_%s,code=sm_%s" % (a, a) for a in arch)
        nvflags = "%s -std=c++17 %s -I. -I%s/include -I%s -DTT_HAVE_CUDA=1 -Xcompiler -fopenmp" % (
            "-O0 -g" if args.debug else "-O2", gencode, cuda["home"], cuda["cudnn"]["inc"])
        # NVML (libnvidia-ml, part of the driver) is opened with dlopen at run time, and
        # libcudart loads libcuda itself, so the binary starts on a machine without a driver.
        libs += " -L%s -L%s -Wl,-rpath,%s -Wl,-rpath,%s -lcudnn -lcublas -lcudart -ldl -lstdc++" % (
            cuda["libdir"], cuda["cudnn"]["lib"], cuda["libdir"], cuda["cudnn"]["lib"])

    lib_src = sources(LIB_DIRS, ".c")
    cu_src = sources(["kernels/cuda"], ".cu") if use_cuda else []
    n = []
    n.append("# generated by configure.py %s — do not edit; rerun ./configure.py" % " ".join(sys.argv[1:]))
    n.append("ninja_required_version = 1.7")
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
    n.append("rule test\n  command = python3 tests/run_tests.py $tests\n  description = TEST\n  pool = console")
    n.append("rule amalgamate\n  command = python3 configure.py --amalgamate\n  description = AMALGAMATE")
    n.append("rule configure\n  command = python3 configure.py %s\n  generator = 1\n  description = CONFIGURE" % " ".join(
        a for a in sys.argv[1:] if a != "--deps"))
    objs = []
    for s in lib_src:
        o = "build/obj/" + s.replace("/", "_")[:-2] + ".o"
        n.append("build %s: cc %s" % (o, s))
        objs.append(o)
    for s in cu_src:
        o = "build/obj/" + s.replace("/", "_")[:-3] + ".cu.o"
        n.append("build %s: nvcc %s" % (o, s))
        objs.append(o)
    n.append("build build/libtinytrain.a: ar %s" % " ".join(objs))
    cli_objs = []
    for s in CLI_SOURCES:
        if os.path.exists(os.path.join(ROOT, s)):
            o = "build/obj/" + s.replace("/", "_")[:-2] + ".o"
            n.append("build %s: cc %s" % (o, s))
            cli_objs.append(o)
    n.append("build tinytrain: link %s build/libtinytrain.a" % " ".join(cli_objs))
    test_bins = []
    for t in TESTS:
        src = "tests/%s.c" % t
        if not os.path.exists(os.path.join(ROOT, src)):
            continue
        o = "build/obj/tests_%s.o" % t
        n.append("build %s: cc %s" % (o, src))
        n.append("build build/tests/%s: link %s build/libtinytrain.a" % (t, o))
        test_bins.append("build/tests/%s" % t)
    bench_bins = []
    for b in sorted(glob.glob(os.path.join(ROOT, "tests/bench/*.c"))):
        name = os.path.basename(b)[:-2]
        o = "build/obj/bench_%s.o" % name
        n.append("build %s: cc %s" % (o, os.path.relpath(b, ROOT)))
        n.append("build build/bench/%s: link %s build/libtinytrain.a" % (name, o))
        n.append("build bench_%s: phony build/bench/%s" % (name, name))
        bench_bins.append("build/bench/%s" % name)
    # `ninja bench` builds every benchmark; `ninja test` builds them too, so they always compile
    # and are never stale beside a rebuilt library.
    n.append("build bench: phony %s" % " ".join(bench_bins))
    scripts = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "tests/test_*.sh")))
    n.append("build test: test | tinytrain %s\n  tests = %s" % (" ".join(test_bins + bench_bins), " ".join(test_bins + ["'bash %s'" % s for s in scripts])))
    n.append("build amalgamation: amalgamate | %s core/tinytrain.h" % " ".join(lib_src))
    n.append("build build.ninja: configure configure.py")
    n.append("default tinytrain")
    with open(os.path.join(ROOT, "build.ninja"), "w") as f:
        f.write("\n".join(n) + "\n")
    print("wrote build.ninja (%s build%s)" % ("CUDA + CPU" if use_cuda else "CPU-only", ", debug" if args.debug else ""))


if __name__ == "__main__":
    main()
