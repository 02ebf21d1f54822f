#!/usr/bin/env python3
"""The CUDA backend's resource check, without a GPU (`ninja cuda-check`).

    tests/tools/cuda_check.py --nvcc NVCC [--arch 75,80,...] [--binary tinytrain
        --expect-sass 75,80,... --expect-ptx 121] [-j N] -- NVCC_FLAGS...

1. Compiles every kernels/cuda/*.cu for each architecture (default sm_75, 80, 86, 89, 90, 100
   and 120) with warnings as errors (nvcc -Werror all-warnings, the host compiler's -Wall -Wextra
   -Werror) and ptxas's resource report (--resource-usage).
2. Reads every kernel's resources back from the object with cuobjdump --dump-resource-usage
   (registers, stack, shared, local) and -elf (EIATTR_MAX_THREADS, what __launch_bounds__ wrote),
   and ptxas's report (spill stores and loads).
3. Finds every launch in the sources: each goes through TT_LAUNCH(kernel, grid, block, shmem,
   stream, ...) (cuda_internal.h), and `block` and `shmem` must be compile-time constants (macros
   from the CUDA sources, resolved here).
4. Fails on: a compiler warning; a kernel missing from the TT_CUDA_KERNEL tables the backend's
   setup checks on the device (or listed there with another block size); a spill, a stack frame
   or local memory; a kernel that is never launched or launched with two block sizes; a kernel
   without __launch_bounds__ equal to its block size; registers x block size over the register file a block may use; more threads than 1024;
   static + dynamic shared memory over 48 KiB (what a block gets without opting in) or over the
   architecture's per-block maximum; dynamic shared memory only for the kernels DYNAMIC_SMEM
   names, whose static shared memory + cap must fit every architecture's opt-in maximum.
5. With --binary: cuobjdump --list-elf / --list-ptx on the linked program must show exactly the
   SASS architectures configure chose and PTX for the newest only.

Limits (CUDA C++ Programming Guide, "Compute Capabilities", technical specifications table; the
same for every architecture checked here unless listed): 64K 32-bit registers per block, at most
255 per thread, allocated per warp in units of 256 registers; 1024 threads per block; 48 KiB of
static shared memory per block; the per-block maximum with opt-in is below.
"""
import argparse
import concurrent.futures
import glob
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_ARCHS = ["75", "80", "86", "89", "90", "100", "120"]
REGS_PER_BLOCK = 65536
REGS_PER_THREAD = 255
REG_ALLOC_UNIT = 256  # registers, per warp
MAX_THREADS = 1024
STATIC_SMEM = 48 * 1024
# Kernels launched with dynamic shared memory sized at run time, and the macro capping it: the
# backend opts in up to the cap at setup (cudaFuncSetAttribute) and sizes each launch under it;
# here static + cap must fit every architecture's opt-in maximum per block. None: the cap is the
# device's opt-in limit less the kernel's static shared memory, read at setup
# (cudaDevAttrMaxSharedMemoryPerBlockOptin); here the static part must leave room under every
# architecture's limit.
DYNAMIC_SMEM = {"cuda_bn_res_fwd_k": None, "cuda_bn_res_bwd_k": None, "cuda_bnc_fwd_k": None, "cuda_bnc_bwd_k": None}
# Maximum shared memory per thread block (opt-in), KiB, per compute capability.
SMEM_PER_BLOCK_KIB = {"75": 64, "80": 163, "86": 99, "87": 163, "88": 99, "89": 99, "90": 227, "100": 227,
                      "103": 227, "110": 227, "120": 99, "121": 99}


def find_cuobjdump(nvcc):
    """The toolkit's cuobjdump, else one on PATH, else the nvidia-cuda-cuobjdump wheel's."""
    cands = [os.path.join(os.path.dirname(os.path.realpath(nvcc)), "cuobjdump"), shutil.which("cuobjdump")]
    dirs = set()
    for d in (site.getsitepackages() if hasattr(site, "getsitepackages") else []) + [site.getusersitepackages(),
                                                                                     sysconfig.get_paths()["purelib"]]:
        dirs.add(d)
    dirs.update(glob.glob("/usr/local/lib/python3*/*-packages") + glob.glob("/usr/lib/python3*/*-packages"))
    for d in sorted(dirs):
        cands += sorted(glob.glob(os.path.join(d, "nvidia", "cu*", "bin", "cuobjdump")))
        cands += sorted(glob.glob(os.path.join(d, "nvidia", "cuda_cuobjdump", "bin", "cuobjdump")))
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def split_args(s):
    """Splits a macro argument list at top-level commas."""
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def balanced(text, start):
    """text[start] is '('; returns the contents up to the matching ')'."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[start + 1:i]
    raise ValueError("unbalanced parentheses")


class Sources:
    def __init__(self, files, headers):
        self.defines = {}
        self.kernels = {}   # name -> (file, line, launch-bounds expression or None)
        self.launches = {}  # name -> [(file, line, block expr, shmem expr)]
        self.table = {}     # name -> [threads expr] from TT_CUDA_KERNEL(kernel, threads) entries
        for path in headers + files:
            text = strip_comments(open(path).read())
            for m in re.finditer(r"^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]+([^\n]+)$", text, flags=re.M):
                self.defines[m.group(1)] = m.group(2).strip()
        for path in files:
            text = strip_comments(open(path).read())
            for m in re.finditer(r"__global__\s+void\s+(?:(TT_LAUNCH_BOUNDS|__launch_bounds__)\s*\(([^)]*)\)\s*)?(\w+)\s*\(",
                                 text):
                line = text.count("\n", 0, m.start()) + 1
                self.kernels[m.group(3)] = (os.path.relpath(path, ROOT), line, m.group(2))
            for m in re.finditer(r"\bTT_CUDA_KERNEL\s*\(\s*(\w+)\s*,\s*([^)]+)\)", text):
                self.table.setdefault(m.group(1), []).append(m.group(2).strip())
            for m in re.finditer(r"\bTT_LAUNCH\s*\(", text):
                if re.match(r"\s*#\s*define", text[text.rfind("\n", 0, m.start()) + 1:m.start()]):
                    continue
                args = split_args(balanced(text, m.end() - 1))
                line = text.count("\n", 0, m.start()) + 1
                self.launches.setdefault(args[0], []).append((os.path.relpath(path, ROOT), line, args[2], args[3]))

    def value(self, expr, seen=()):
        """A constant expression of integers and macros, evaluated; None if it is not one."""
        expr = expr.strip()
        def sub(m):
            name = m.group(0)
            if name in seen or name not in self.defines:
                raise KeyError(name)
            v = self.value(self.defines[name], seen + (name,))
            if v is None:
                raise KeyError(name)
            return str(v)
        try:
            e = re.sub(r"[A-Za-z_]\w*", sub, expr)
        except KeyError:
            return None
        e = re.sub(r"(\d+)[uUlL]+", r"\1", e)
        if not re.fullmatch(r"[\d\s+\-*/()]+", e):
            return None
        return int(eval(e.replace("/", "//")))  # digits and operators only


def demangle_name(mangled):
    m = re.match(r"_Z(\d+)", mangled)
    if not m:
        return mangled
    n = int(m.group(1))
    return mangled[m.end():m.end() + n]


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return p.returncode, p.stdout.decode("utf-8", "replace")


def compile_one(nvcc, flags, src, arch, outdir):
    obj = os.path.join(outdir, "sm_%s" % arch, os.path.basename(src) + ".o")
    os.makedirs(os.path.dirname(obj), exist_ok=True)
    cmd = [nvcc] + flags + ["-gencode", "arch=compute_%s,code=sm_%s" % (arch, arch), "--resource-usage",
                            "-Werror", "all-warnings", "-Xcompiler", "-Wall,-Wextra,-Wno-unused-parameter,-Werror",
                            "-c", src, "-o", obj]
    rc, out = run(cmd)
    return src, arch, obj, rc, out, " ".join(cmd)


def ptx_one(nvcc, flags, src, arch, outdir):
    """The file's PTX for one architecture (ptx_hazards reads it)."""
    out = os.path.join(outdir, "ptx", os.path.basename(src) + ".ptx")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    rc, msg = run([nvcc] + flags + ["-arch=compute_%s" % arch, "-ptx", src, "-o", out])
    text = open(out).read() if rc == 0 and os.path.exists(out) else ""
    return src, rc, msg, text


# PTX that a ptxas miscompiled on a device: (pattern, why). CUDA 13.0's ptxas turned a 64-bit
# bfi.b64 assembly of four packed fp16/bf16 into a store of an unset register on sm_90 (the first
# H100 run, docs/gpu.md#first-runs-on-a-gpu); the kernels build such words as uint2 pairs.
PTX_HAZARDS = [(re.compile(r"\bbfi\.b64\b"), "bfi.b64 (a 64-bit word assembled with shifts and ORs: use a uint2 pair, "
                                             "tt_cuda_st8w; CUDA 13.0's ptxas miscompiled it for sm_90)")]


def parse_per_function(text, head, row):
    """{function: row(line)} from a report where a line matching the regex head (group 1: the
    function) opens a function and the first later line that row maps to a value (not None)
    closes it."""
    res, cur = {}, None
    for line in text.splitlines():
        m = re.search(head, line)
        if m:
            cur = m.group(1)
            continue
        v = row(line) if cur else None
        if v is not None:
            res[cur] = v
            cur = None
    return res


def parse_ptxas(out):
    """Spill stores/loads and stack frame per mangled function from ptxas's report."""
    def row(line):
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        return {"frame": int(m.group(1)), "spill_st": int(m.group(2)), "spill_ld": int(m.group(3))} if m else None
    return parse_per_function(out, r"Function properties for (\S+)", row)


def parse_resources(text):
    """The REG:, SHARED: ... counts per function from cuobjdump -res-usage."""
    def row(line):
        return dict((k, int(v)) for k, v in re.findall(r"(\w+(?:\[\d+\])?):(\d+)", line)) if "REG:" in line else None
    return parse_per_function(text, r"^\s*Function (\S+):", row)


def parse_max_threads(text):
    """EIATTR_MAX_THREADS per function from cuobjdump -elf (present when __launch_bounds__ is)."""
    res, cur = {}, None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"\s*\.nv\.info\.(\S+)", line)
        if m:
            cur = m.group(1)
            continue
        if cur and "EIATTR_MAX_THREADS" in line:
            for j in range(i + 1, min(i + 4, len(lines))):
                m = re.search(r"Value:\s*(0x[0-9a-fA-F]+)\s+(0x[0-9a-fA-F]+)\s+(0x[0-9a-fA-F]+)", lines[j])
                if m:
                    res[cur] = int(m.group(1), 16) * int(m.group(2), 16) * int(m.group(3), 16)
                    break
    return res


def block_regs(regs, threads):
    warps = (threads + 31) // 32
    per_warp = ((regs * 32 + REG_ALLOC_UNIT - 1) // REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    return per_warp * warps


def check_binary(cuobjdump, binary, sass, ptx, errors):
    rc, elf = run([cuobjdump, "--list-elf", binary])
    rc2, ptxl = run([cuobjdump, "--list-ptx", binary])
    if rc or rc2:
        errors.append("cuobjdump could not list %s: %s%s" % (binary, elf.strip()[-300:], ptxl.strip()[-300:]))
        return
    got_sass = sorted(set(re.findall(r"\.sm_(\d+)[a-z]?\.cubin", elf)), key=int)
    got_ptx = sorted(set(re.findall(r"\.sm_(\d+)[a-z]?\.ptx", ptxl)), key=int)
    print("binary %s: SASS for %s; PTX for %s" % (binary, ", ".join("sm_" + a for a in got_sass) or "none",
                                                   ", ".join("compute_" + a for a in got_ptx) or "none"))
    if got_sass != sorted(set(sass), key=int):
        errors.append("%s holds SASS for %s, configure chose %s" % (binary, got_sass, sorted(set(sass), key=int)))
    if got_ptx != sorted(set(ptx), key=int):
        errors.append("%s holds PTX for %s, expected PTX for %s only (the newest architecture, so newer cards JIT it)"
                      % (binary, got_ptx, sorted(set(ptx), key=int)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    ap.add_argument("--find-cuobjdump", action="store_true", help="print the cuobjdump used, or exit 1 if none")
    ap.add_argument("--arch", default=",".join(DEFAULT_ARCHS))
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "cuda-check"))
    ap.add_argument("--binary")
    ap.add_argument("--expect-sass", default="")
    ap.add_argument("--expect-ptx", default="")
    ap.add_argument("-j", type=int, default=os.cpu_count() or 2)
    ap.add_argument("flags", nargs="*", help="nvcc flags (includes, defines), after --")
    a = ap.parse_args()
    t0 = time.time()
    cuobjdump = find_cuobjdump(a.nvcc)
    if a.find_cuobjdump:
        print(cuobjdump or "no cuobjdump")
        sys.exit(0 if cuobjdump else 1)
    if not cuobjdump:
        sys.exit("cuda-check: no cuobjdump (not beside nvcc, not on PATH, no nvidia-cuda-cuobjdump wheel); "
                 "pip install nvidia-cuda-cuobjdump")
    archs = [x.strip() for x in a.arch.split(",") if x.strip()]
    files = sorted(glob.glob(os.path.join(ROOT, "kernels", "cuda", "*.cu")))
    headers = sorted(glob.glob(os.path.join(ROOT, "kernels", "cuda", "*.h")))
    src = Sources(files, headers)
    errors = []

    # launches: constant block and shared-memory sizes, one block size per kernel
    block = {}
    for k, (f, line, lb) in sorted(src.kernels.items()):
        sites = src.launches.get(k)
        if not sites:
            errors.append("%s:%d: kernel %s is never launched through TT_LAUNCH" % (f, line, k))
            continue
        vals = set()
        for sf, sl, b, sh in sites:
            v, s = src.value(b), src.value(sh)
            if v is None:
                errors.append("%s:%d: launch of %s: block size '%s' is not a compile-time constant" % (sf, sl, k, b))
            else:
                vals.add(v)
            if k in DYNAMIC_SMEM:
                pass  # sized at run time within its cap (checked per architecture below)
            elif s is None:
                errors.append("%s:%d: launch of %s: shared memory '%s' is not a compile-time constant" % (sf, sl, k, sh))
            elif s > 0:
                errors.append("%s:%d: launch of %s asks %d bytes of dynamic shared memory; budget it here first"
                              % (sf, sl, k, s))
        if len(vals) > 1:
            errors.append("%s:%d: kernel %s is launched with block sizes %s; one per kernel, matching its "
                          "__launch_bounds__" % (f, line, k, sorted(vals)))
        if vals:
            block[k] = max(vals)
        lbv = src.value(lb.split(",")[0]) if lb else None
        if lb is None:
            errors.append("%s:%d: kernel %s has no __launch_bounds__ (TT_LAUNCH_BOUNDS); it is launched with %s threads"
                          % (f, line, k, "/".join(str(v) for v in sorted(vals)) or "?"))
        elif lbv is None:
            errors.append("%s:%d: kernel %s: launch bounds '%s' is not a compile-time constant" % (f, line, k, lb))
        elif vals and lbv != max(vals):
            errors.append("%s:%d: kernel %s: __launch_bounds__(%d) but launched with %d threads" % (f, line, k, lbv,
                                                                                                    max(vals)))
        ent = src.table.get(k, [])
        if len(ent) != 1:
            errors.append("%s:%d: kernel %s is in %d TT_CUDA_KERNEL table entries; exactly one, so the backend's setup "
                          "checks it on the device" % (f, line, k, len(ent)))
        elif vals and src.value(ent[0]) != max(vals):
            errors.append("%s:%d: kernel %s: its TT_CUDA_KERNEL entry says %s threads, the launch uses %d"
                          % (f, line, k, ent[0], max(vals)))
        for v in vals:
            if v > MAX_THREADS or v % 32:
                errors.append("%s:%d: kernel %s launched with %d threads (at most %d, a multiple of 32)"
                              % (f, line, k, v, MAX_THREADS))
    for k, sites in sorted(src.launches.items()):
        if k not in src.kernels:
            errors.append("%s:%d: TT_LAUNCH of %s, which is not a __global__ function of kernels/cuda" % (sites[0][0],
                                                                                                        sites[0][1], k))

    # compile every file for every architecture
    jobs = [(f, arch) for arch in archs for f in files]
    results = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.j)) as ex:
        futs = [ex.submit(compile_one, a.nvcc, a.flags, f, arch, a.out) for f, arch in jobs]
        for fu in futs:
            results.append(fu.result())
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.j)) as ex:
        ptx_results = [fu.result() for fu in [ex.submit(ptx_one, a.nvcc, a.flags, f, archs[-1], a.out) for f in files]]
    for f, rc, msg, text in ptx_results:
        rel = os.path.relpath(f, ROOT)
        if rc != 0:
            errors.append("%s: nvcc -ptx failed: %s" % (rel, msg.strip()[-400:]))
        for pat, why in PTX_HAZARDS:
            n = len(pat.findall(text))
            if n:
                errors.append("%s: %d x %s" % (rel, n, why))
    per_arch = {}
    for f, arch, obj, rc, out, cmd in results:
        rel = os.path.relpath(f, ROOT)
        if rc != 0:
            errors.append("%s for sm_%s does not compile cleanly (warnings are errors):\n  %s\n%s" % (rel, arch, cmd,
                                                                                                   out.strip()))
            continue
        ptx = parse_ptxas(out)
        rc1, ru = run([cuobjdump, "--dump-resource-usage", obj])
        rc2, elf = run([cuobjdump, "-elf", obj])
        if rc1 or rc2:
            errors.append("cuobjdump failed on %s: %s" % (obj, (ru + elf).strip()[-400:]))
            continue
        res, mt = parse_resources(ru), parse_max_threads(elf)
        for mangled, r in sorted(res.items()):
            k = demangle_name(mangled)
            if k not in src.kernels:
                continue  # a device function, not an entry
            sp = ptx.get(mangled, {})
            thr = block.get(k)
            regs, shared, local, stack = r.get("REG", 0), r.get("SHARED", 0), r.get("LOCAL", 0), r.get("STACK", 0)
            row = {"regs": regs, "threads": thr, "shared": shared, "local": local, "stack": stack,
                   "spill": sp.get("spill_st", 0) + sp.get("spill_ld", 0), "max_threads": mt.get(mangled)}
            per_arch.setdefault(k, {})[arch] = row
            where = "%s (%s, sm_%s)" % (k, rel, arch)
            if row["spill"] or sp.get("frame", 0):
                errors.append("%s spills: %d bytes stored, %d loaded, %d-byte stack frame" % (
                    where, sp.get("spill_st", 0), sp.get("spill_ld", 0), sp.get("frame", 0)))
            if local or stack:
                errors.append("%s uses local memory: LOCAL %d, STACK %d bytes" % (where, local, stack))
            if regs > REGS_PER_THREAD:
                errors.append("%s uses %d registers per thread (at most %d)" % (where, regs, REGS_PER_THREAD))
            if thr:
                need = block_regs(regs, thr)
                if need > REGS_PER_BLOCK:
                    errors.append("%s: %d registers x %d threads = %d registers per block (allocated per warp in units "
                                  "of %d) > %d: every launch fails with 'too many resources requested for launch'"
                                  % (where, regs, thr, need, REG_ALLOC_UNIT, REGS_PER_BLOCK))
                if row["max_threads"] is not None and row["max_threads"] != thr:
                    errors.append("%s: the binary's launch bound is %d threads, the launch uses %d" % (
                        where, row["max_threads"], thr))
                elif row["max_threads"] is None and src.kernels[k][2] is not None:
                    errors.append("%s: the binary has no launch bound (EIATTR_MAX_THREADS); launched with %d threads"
                                  % (where, thr))
            limit = min(STATIC_SMEM, SMEM_PER_BLOCK_KIB.get(arch, 48) * 1024)
            if shared > limit:
                errors.append("%s uses %d bytes of shared memory per block (limit %d)" % (where, shared, limit))
            if k in DYNAMIC_SMEM:
                optin = SMEM_PER_BLOCK_KIB.get(arch, 48) * 1024
                cap = src.value(DYNAMIC_SMEM[k]) if DYNAMIC_SMEM[k] else None
                if DYNAMIC_SMEM[k] is None:
                    if shared + 16 > optin:
                        errors.append("%s: %d bytes of static shared memory leave no dynamic shared memory under "
                                      "the architecture's opt-in maximum per block (%d)" % (where, shared, optin))
                elif cap is None:
                    errors.append("%s: its dynamic shared memory cap %s is not a compile-time constant"
                                  % (where, DYNAMIC_SMEM[k]))
                elif shared + cap > optin:
                    errors.append("%s: %d bytes of static shared memory + its dynamic cap %s (%d) > %d, the "
                                  "architecture's opt-in maximum per block" % (where, shared, DYNAMIC_SMEM[k], cap, optin))

    # the per-kernel table: registers on each architecture (threads x registers per block)
    print("kernel resources (registers per thread on %s; block = threads; 'regs/block' the worst architecture):"
          % ", ".join("sm_" + x for x in archs))
    for k in sorted(per_arch):
        rows = per_arch[k]
        thr = block.get(k) or 0
        worst = max((block_regs(r["regs"], thr) if thr else 0) for r in rows.values())
        regs = " ".join("%3d" % rows[x]["regs"] if x in rows else "  -" for x in archs)
        sh = max(r["shared"] for r in rows.values())
        sp = max(r["spill"] + r["local"] + r["stack"] for r in rows.values())
        print("  %-26s threads %4d  regs %s  regs/block %6d  smem %5d  spill+local %d" % (k, thr, regs, worst, sh, sp))

    # tests/gpu/cudnn_probe.c (a diagnostic built on a GPU machine, never by ninja) must still
    # compile against this cuDNN: its host C, syntax only, with the same include paths
    probe = os.path.join(ROOT, "tests", "gpu", "cudnn_probe.c")
    if os.path.exists(probe):
        incs = [f for f in a.flags if f.startswith("-I")]
        rc, msg = run(["cc", "-std=c11", "-fsyntax-only", "-Wall", "-Werror"] + incs + [probe])
        if rc != 0:
            errors.append("tests/gpu/cudnn_probe.c does not compile against this cuDNN: %s" % msg.strip()[-400:])

    if a.binary:
        sass = [x for x in a.expect_sass.split(",") if x]
        ptx = [x for x in a.expect_ptx.split(",") if x]
        check_binary(cuobjdump, a.binary, sass, ptx, errors)

    dt = time.time() - t0
    if errors:
        print("\ncuda-check: %d problem(s):" % len(errors))
        for e in errors:
            print("  " + e)
        print("cuda-check FAILED (%d files x %d architectures, %.0f s, cuobjdump %s)" % (len(files), len(archs), dt,
                                                                                        cuobjdump))
        sys.exit(1)
    print("cuda-check passed: %d kernels in %d files x %d architectures, no spill, no local memory, every launch "
          "within its architecture's limits (%.0f s)" % (len(per_arch), len(files), len(archs), dt))


if __name__ == "__main__":
    main()
