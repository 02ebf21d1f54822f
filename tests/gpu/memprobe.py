#!/usr/bin/env python3
"""tests/gpu/memprobe.py — what a CUDA context costs on this device, before tinytrain's or PyTorch's
own memory: the lease's first step (tests/gpu/acceptance.sh, issue 41 item 6).

    python3 tests/gpu/memprobe.py [--json FILE]

Through the driver API (libcuda.so.1, which every driver installs; nothing of the toolkit is
needed): the device's used memory (cuMemGetInfo) before any context of this process, with the
primary context made current, and after cuCtxSetLimit(CU_LIMIT_STACK_SIZE) lowers the per-thread
stack from the default to 0, 16 (tinytrain's floor) and 256 bytes in turn (the driver may refuse 0), since the driver reserves
local memory for the stack of every thread the device can hold; tinytrain's kernels use no stack
(`ninja cuda-check` fails on any), so what that frees is the margin issue 41 item 6 would take
back. The limit is read back after each set. Then, unless --no-torch, PyTorch's context in a
process of its own (tests/bench/resnet50_vs_torch.py's worker: NVML's figure for that process
less what its allocator holds, after cuBLAS and cuDNN are up).

Prints one line per figure; without a GPU (no libcuda.so.1, or cuInit fails) says so and exits 0.
"""
import argparse
import ctypes
import json
import os
import re
import subprocess
import sys

MIB = 1 << 20
CU_LIMIT_STACK_SIZE = 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--no-torch", action="store_true")
    a = ap.parse_args()
    res = {}
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        print("memprobe: no CUDA driver here (%s): nothing measured" % e)
        return 0

    def call(name, *args):
        r = getattr(cu, name)(*args)
        if r != 0:
            raise RuntimeError("%s failed: CUresult %d" % (name, r))

    def used():
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return (total.value - free.value) / MIB, total.value / MIB

    try:
        call("cuInit", 0)
    except RuntimeError as e:
        print("memprobe: cuInit failed (%s): no usable GPU, nothing measured" % e)
        return 0
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    call("cuDeviceGet", ctypes.byref(dev), 0)
    # the device's use before this process has a context: another context is needed to ask, so
    # read it through nvidia-smi instead (the whole device; the lent machine runs nothing else)
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=20).stdout.decode()
        res["device_used_before_mib"] = float(out.split(",")[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        res["device_used_before_mib"] = None
    call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    call("cuCtxSetCurrent", ctx)
    u, total = used()
    res["total_mib"] = total
    res["used_with_context_mib"] = u
    if res["device_used_before_mib"] is not None:
        res["context_mib"] = u - res["device_used_before_mib"]
    lim = ctypes.c_size_t()
    call("cuCtxGetLimit", ctypes.byref(lim), CU_LIMIT_STACK_SIZE)
    res["stack_default_bytes"] = lim.value
    # 16: the floor tinytrain's backend sets (TT_CUDA_STACK_MIN_BYTES, TINYTRAIN_CUDA_STACK); each
    # size from the default's context in turn, whether or not a smaller one was refused
    for want in (0, 16, 256):
        try:
            call("cuCtxSetLimit", CU_LIMIT_STACK_SIZE, ctypes.c_size_t(want))
        except RuntimeError as e:
            res["stack_set_%d" % want] = str(e)
            continue
        call("cuCtxGetLimit", ctypes.byref(lim), CU_LIMIT_STACK_SIZE)
        res["stack_after_set_%d_bytes" % want] = lim.value
        res["used_after_stack_%d_mib" % want] = used()[0]
    for k in sorted(res):
        v = res[k]
        print("%-28s %s" % (k, "%.1f" % v if isinstance(v, float) else v))
    freed = [res[k] for k in res if k.startswith("used_after_stack_")]
    if freed:
        print("a lower stack limit gave back %.1f MiB of the context (at most, over %s)" % (
            u - min(freed), ", ".join(k[len("used_after_stack_"):-4] for k in res if k.startswith("used_after_stack_"))))
    try:  # cuDevicePrimaryCtxRelease (the unversioned symbol every driver keeps); the process ends anyway
        call("cuDevicePrimaryCtxRelease", dev)
    except (RuntimeError, AttributeError):
        pass
    if not a.no_torch:
        bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "resnet50_vs_torch.py")
        try:
            p = subprocess.run([sys.executable, bench, "--torch-worker", json.dumps({"mode": "context"})],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
            m = re.search(r"(?m)^RESULT (.*)$", p.stdout.decode("utf-8", "replace"))
            if m:
                res["torch_context_mib"] = json.loads(m.group(1)).get("context_mib")
                print("%-28s %s" % ("torch_context_mib", res["torch_context_mib"]))
            else:
                print("PyTorch's context: not measured (%s)" % p.stdout.decode("utf-8", "replace").strip()[-300:])
        except (OSError, subprocess.TimeoutExpired) as e:
            print("PyTorch's context: not measured (%s)" % e)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
