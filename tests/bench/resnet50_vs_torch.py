#!/usr/bin/env python3
"""ResNet-50 at 224x224 on one GPU: tinytrain beside PyTorch, same model, batch and data shape.

    python3 tests/bench/resnet50_vs_torch.py [--steps 20] [--batch 64] [--vram 4G] [--out FILE]

On synthetic data (3x224x224 uint8 images, 1000 classes; nothing is read from disk):

1. images/s and peak device memory at batch 64, fp32 and mixed precision: tinytrain with
   --precision fp32 / fp16 (autocast with loss scaling) and PyTorch with fp32 / torch.autocast +
   GradScaler, SGD with momentum, channels-first with cuDNN benchmark off; and PyTorch AMP at its
   fastest eager setting, channels_last with cudnn.benchmark on. tinytrain times cuDNN's
   algorithms at setup (cudnnFind*Ex within the workspace its plan holds) and runs fp16 in
   TINYTRAIN_LAYOUT's layout, NCHW unless set. images/s counts the steps after the
   first few (start-up excluded); peak device memory is the process's, sampled through NVML
   (nvidia-smi --query-compute-apps), so it includes the CUDA context and library handles on both
   sides; PyTorch's own max_memory_allocated/reserved are printed too.
2. the largest micro-batch each fits in 4 GiB: tinytrain computes it (`plan --max-batch --vram
   4G`: the whole process, context included, under 4 GiB); PyTorch is probed with
   torch.cuda.set_per_process_memory_fraction(4 GiB / card) (which bounds only its caching
   allocator: its context comes on top, so the comparison favours PyTorch), by bisection on one
   training step, with and without torch.utils.checkpoint (checkpoint_sequential over the
   network's blocks, sqrt(n) segments).

A benchmark: it prints numbers (and writes them to --out), it never passes or fails on them.
Without a GPU it checks its own prerequisites, says what it would need, and exits 0.
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TT = os.path.join(ROOT, "tinytrain")
GIB = 1 << 30


def say(lines, text=""):
    print(text, flush=True)
    lines.append(text)


def gpu_present():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None, "nvidia-smi not found"
    try:
        out = subprocess.run([smi, "--query-gpu=name,memory.total,compute_cap", "--format=csv,noheader,nounits"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30).stdout.decode()
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, "nvidia-smi failed: %s" % e
    rows = [l for l in out.splitlines() if l.strip() and "," in l]
    if not rows:
        return None, "nvidia-smi lists no GPU (%s)" % out.strip()[:200]
    name, mem, cap = [x.strip() for x in rows[0].split(",")[:3]]
    return {"name": name, "total_mib": float(mem), "cc": cap}, None


class MemSampler:
    """The peak device memory of one process, sampled through nvidia-smi every 0.1 s."""

    def __init__(self, pid):
        self.pid, self.peak_mib, self._stop = pid, 0.0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        smi = shutil.which("nvidia-smi")
        while not self._stop.is_set():
            try:
                out = subprocess.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=10).stdout.decode()
                for line in out.splitlines():
                    p = [x.strip() for x in line.split(",")]
                    if len(p) >= 2 and p[0] == str(self.pid) and p[1].replace(".", "").isdigit():
                        self.peak_mib = max(self.peak_mib, float(p[1]))
            except (OSError, subprocess.TimeoutExpired):
                pass
            self._stop.wait(0.1)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *a):
        self._stop.set()
        self._t.join()


def resnet50_recipe(path, batch):
    """examples/imagenet/resnet50.recipe with synthetic data, batch `batch`, logging every 2 steps."""
    with open(os.path.join(ROOT, "examples/imagenet/resnet50.recipe")) as f:
        text = f.read()
    text = re.sub(r"(?m)^batch = \d+", "batch = %d" % batch, text)
    text = re.sub(r"(?m)^epochs = \d+", "epochs = 1", text)
    text = re.sub(r"(?s)\[data\].*?(?=\n\[)", "[data]\nformat = synthetic\nmean = 0.485, 0.456, 0.406\n"
                  "std = 0.229, 0.224, 0.225\n", text, count=1)
    text = re.sub(r"(?m)^(\[train\]\n)", r"\1log_every = 2\n", text, count=1)
    with open(path, "w") as f:
        f.write(text)


def tinytrain_run(lines, recipe, precision, steps, batch):
    out = tempfile.mkdtemp(prefix="tt_r50_")
    # --tf32 off: tinytrain's fp32 in true fp32, as PyTorch's below (TF32 off on both sides)
    cmd = [TT, "train", "--device", "cuda", "--precision", precision, "--recompute", "none", "--tf32", "off",
           "--micro-batch", str(batch), "--max-steps", str(steps), "--out", out, recipe]
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    with MemSampler(p.pid) as ms:
        text = p.communicate()[0].decode("utf-8", "replace")
    wall = time.time() - t0
    if p.returncode != 0:
        say(lines, "  tinytrain %s failed (exit %d): %s" % (precision, p.returncode, text.strip()[-600:]))
        return None
    ips = []
    try:
        with open(os.path.join(out, "metrics.jsonl")) as f:
            for line in f:
                d = json.loads(line)
                if d.get("event") == "train" and d.get("images_per_s"):
                    ips.append(d["images_per_s"])
    except OSError:
        pass
    rate = sum(ips[2:]) / len(ips[2:]) if len(ips) > 2 else (ips[-1] if ips else float("nan"))
    arena = re.search(r"arena ([0-9.]+) MiB", text)
    shutil.rmtree(out, ignore_errors=True)
    return {"ips": rate, "peak_mib": ms.peak_mib, "arena_mib": float(arena.group(1)) if arena else float("nan"),
            "wall_s": wall}


def tinytrain_max_batch(lines, recipe, vram):
    t0 = time.time()
    p = subprocess.run([TT, "plan", "--max-batch", "--json", "--device", "cuda", "--vram", vram, recipe],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    print("  (tinytrain plan --max-batch: exit %d, %.0f s)" % (p.returncode, time.time() - t0), flush=True)
    if p.returncode != 0:
        say(lines, "  tinytrain plan --max-batch failed: %s" % p.stdout.decode()[-400:])
        return {}
    d = json.loads(p.stdout.decode())
    return {(r["precision"], r["recompute"]): r["micro_batch"] for r in d["max_batch"]}


# ----------------------------------------------------------------------------- PyTorch

def torch_resnet50(torch):
    """torchvision's resnet50 (v1.5: stride on the 3x3), built here so torchvision is not needed."""
    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride, down):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
            self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
            self.conv3, self.bn3 = nn.Conv2d(width, width * 4, 1, bias=False), nn.BatchNorm2d(width * 4)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = nn.Sequential(nn.Conv2d(cin, width * 4, 1, stride, bias=False),
                                            nn.BatchNorm2d(width * 4)) if down else None

        def forward(self, x):
            idt = x if self.downsample is None else self.downsample(x)
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.relu(self.bn2(self.conv2(y)))
            return self.relu(self.bn3(self.conv3(y)) + idt)

    blocks = [nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                            nn.MaxPool2d(3, 2, 1))]
    cin = 64
    for width, n, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(n):
            blocks.append(Bottleneck(cin, width, stride if i == 0 else 1, i == 0))
            cin = width * 4
    blocks.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)))
    return nn.Sequential(*blocks)


def torch_step_fn(torch, model, amp, ckpt):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    scaler = torch.cuda.amp.GradScaler(enabled=amp)
    lossf = torch.nn.CrossEntropyLoss()
    # checkpoint_sequential's split (sqrt(n) segments of the blocks, the last one kept), written out
    # so that use_reentrant=False works on every PyTorch from 1.11
    mods = list(model)
    per = int(math.ceil(len(mods) / max(1, int(round(math.sqrt(len(mods)))))))
    chunks = [torch.nn.Sequential(*mods[i:i + per]) for i in range(0, len(mods), per)]

    def forward(x):
        if not ckpt:
            return model(x)
        for c in chunks[:-1]:
            x = torch.utils.checkpoint.checkpoint(c, x, use_reentrant=False)
        return chunks[-1](x)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            out = forward(x)
            loss = lossf(out, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return step


def torch_batch(torch, b):
    # uint8 pixels normalised on the device, as tinytrain's input step does
    x = torch.randint(0, 256, (b, 3, 224, 224), dtype=torch.uint8, device="cuda").float().div_(255).sub_(0.45).div_(0.225)
    y = torch.randint(0, 1000, (b,), device="cuda")
    return x, y


def torch_speed(torch, lines, amp, steps, batch, best=False):
    """best: channels_last model and input, cudnn.benchmark on (PyTorch's fastest eager setting
    for fixed shapes; the benchmark's algorithm search falls in the warm-up steps)."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.backends.cudnn.benchmark = best
    model = torch_resnet50(torch).cuda().train()
    x, y = torch_batch(torch, batch)
    if best:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    step = torch_step_fn(torch, model, amp, False)
    for _ in range(5 if best else 3):
        step(x, y)
    torch.cuda.synchronize()
    t0 = time.time()
    for _ in range(steps):
        step(x, y)
    torch.cuda.synchronize()
    dt = time.time() - t0
    res = {"ips": steps * batch / dt, "allocated_mib": torch.cuda.max_memory_allocated() / 2**20,
           "reserved_mib": torch.cuda.max_memory_reserved() / 2**20}
    del model, step, x, y
    torch.cuda.empty_cache()
    torch.backends.cudnn.benchmark = False
    return res


def torch_fits(torch, amp, ckpt, b):
    model = None
    try:
        model = torch_resnet50(torch).cuda().train()
        step = torch_step_fn(torch, model, amp, ckpt)
        x, y = torch_batch(torch, b)
        step(x, y)
        step(x, y)  # the optimizer's momentum exists from the first step on
        torch.cuda.synchronize()
        return True
    except RuntimeError as e:  # torch.cuda.OutOfMemoryError is a RuntimeError
        if "out of memory" not in str(e).lower():
            raise
        return False
    finally:
        del model
        torch.cuda.empty_cache()


def torch_max_batch(torch, amp, ckpt, hi=2048):
    if not torch_fits(torch, amp, ckpt, 1):
        return 0
    lo = 1  # fits
    while lo * 2 <= hi and torch_fits(torch, amp, ckpt, lo * 2):
        lo *= 2
    top = min(hi, lo * 2)  # does not fit (or the cap)
    while top - lo > 1:
        mid = (lo + top) // 2
        if torch_fits(torch, amp, ckpt, mid):
            lo = mid
        else:
            top = mid
    return lo


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--vram", default="4G", help="the budget of the largest-micro-batch comparison")
    ap.add_argument("--out", help="also write the report here")
    ap.add_argument("--skip-torch-max-batch", action="store_true")
    ap.add_argument("--skip-max-batch", action="store_true",
                    help="no largest-micro-batch section (it does not depend on --batch: one run of it is enough)")
    ap.add_argument("--only-max-batch", action="store_true", help="the largest-micro-batch section alone")
    ap.add_argument("--no-tf32", action="store_true",
                    help="the default: PyTorch's fp32 convolutions and matmuls without TF32, as tinytrain's with "
                         "--tf32 off (cuDNN CUDNN_FMA_MATH, cuBLAS CUBLAS_DEFAULT_MATH)")
    a = ap.parse_args()
    lines = []
    say(lines, "# ResNet-50 224x224, synthetic data: tinytrain vs PyTorch")
    # prerequisites, checked with or without a GPU
    missing = []
    if not os.access(TT, os.X_OK):
        missing.append("./tinytrain (./configure.py && ninja)")
    elif "cuda" not in subprocess.run([TT, "--version"], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT).stdout.decode().lower().split("without cuda")[0]:
        missing.append("a tinytrain built with CUDA (configure found no nvcc/cuDNN)")
    if not os.path.exists(os.path.join(ROOT, "examples/imagenet/resnet50.recipe")):
        missing.append("examples/imagenet/resnet50.recipe")
    try:
        import torch
        import torch.utils.checkpoint  # noqa: F401 (not imported by torch itself)
        # TF32 the same on both sides: tinytrain runs with --tf32 off (kernels/cuda: CUDNN_FMA_MATH,
        # CUBLAS_DEFAULT_MATH); PyTorch's cuDNN allows it by default
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        say(lines, "PyTorch %s (CUDA %s); TF32 off on both sides (torch.backends.cuda.matmul.allow_tf32 = "
                   "torch.backends.cudnn.allow_tf32 = False; tinytrain --tf32 off)" % (torch.__version__, torch.version.cuda))
    except ImportError:
        torch = None
        missing.append("PyTorch (python3 -m pip install torch)")
    gpu, why = gpu_present()
    if missing:
        say(lines, "prerequisites missing: %s" % "; ".join(missing))
    if not gpu or (torch is not None and not torch.cuda.is_available()):
        say(lines, "no GPU here (%s): nothing measured.%s" % (
            why or "torch.cuda.is_available() is False",
            "" if not missing else " The run needs the prerequisites above too."))
        if a.out:
            with open(a.out, "w") as f:
                f.write("\n".join(lines) + "\n")
        return 0
    say(lines, "GPU: %s, %.0f MiB, compute capability %s" % (gpu["name"], gpu["total_mib"], gpu["cc"]))
    if missing:
        say(lines, "cannot run without the prerequisites above")
        return 0
    work = tempfile.mkdtemp(prefix="tt_r50_bench_")
    recipe = os.path.join(work, "resnet50_synthetic.recipe")
    resnet50_recipe(recipe, a.batch)

    say(lines)
    if not a.only_max_batch:
        say(lines, "## batch %d: images/s and peak device memory (process, NVML)" % a.batch)
        say(lines, "| | images/s | peak device MiB | notes |")
        say(lines, "|---|---|---|---|")
    for prec, amp in () if a.only_max_batch else (("fp32", False), ("fp16", True)):
        # one epoch of the synthetic set at most (1024 images), so no evaluation falls inside
        t = tinytrain_run(lines, recipe, prec, min(a.steps + 4, max(4, 1024 // a.batch)), a.batch)
        if t:
            say(lines, "| tinytrain %s | %.1f | %.0f | arena %.0f MiB, run %.0f s incl. start-up |" % (
                prec, t["ips"], t["peak_mib"], t["arena_mib"], t["wall_s"]))
        pid = os.getpid()
        with MemSampler(pid) as ms:
            r = torch_speed(torch, lines, amp, a.steps, a.batch)
        say(lines, "| PyTorch %s | %.1f | %.0f | max_memory_allocated %.0f MiB, reserved %.0f MiB |" % (
            "AMP" if amp else "fp32", r["ips"], ms.peak_mib, r["allocated_mib"], r["reserved_mib"]))
        if amp:
            with MemSampler(pid) as ms:
                r = torch_speed(torch, lines, amp, a.steps, a.batch, best=True)
            say(lines, "| PyTorch AMP, channels_last + cudnn.benchmark | %.1f | %.0f | max_memory_allocated %.0f MiB, "
                "reserved %.0f MiB |" % (r["ips"], ms.peak_mib, r["allocated_mib"], r["reserved_mib"]))

    if a.skip_max_batch:  # the largest micro-batch in a budget does not depend on --batch
        shutil.rmtree(work, ignore_errors=True)
        if a.out:
            with open(a.out, "w") as f:
                f.write("\n".join(lines) + "\n")
        return 0
    say(lines)
    say(lines, "## largest micro-batch in %s" % a.vram)
    tmb = tinytrain_max_batch(lines, recipe, a.vram)
    say(lines, "| | fp32 | mixed precision |")
    say(lines, "|---|---|---|")
    say(lines, "| tinytrain, no recompute (whole process) | %s | %s |" % (tmb.get(("fp32", "none"), "?"),
                                                                        tmb.get(("fp16", "none"), "?")))
    say(lines, "| tinytrain, recompute auto (whole process) | %s | %s |" % (tmb.get(("fp32", "auto"), "?"),
                                                                          tmb.get(("fp16", "auto"), "?")))
    if not a.skip_torch_max_batch:
        m = re.match(r"^([0-9.]+)\s*([KMGT]?)", a.vram.upper())
        budget = float(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[m.group(2)]
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total))
        res = {}
        for amp in (False, True):
            for ck in (False, True):
                t0 = time.time()
                res[(amp, ck)] = torch_max_batch(torch, amp, ck)
                print("  (PyTorch %s%s: %d, %.0f s)" % ("AMP" if amp else "fp32", " + checkpoint" if ck else "",
                                                        res[(amp, ck)], time.time() - t0), flush=True)
        torch.cuda.set_per_process_memory_fraction(1.0)
        say(lines, "| PyTorch (caching allocator bounded, context on top) | %d | %d |" % (res[(False, False)],
                                                                                       res[(True, False)]))
        say(lines, "| PyTorch + torch.utils.checkpoint (sqrt(n) segments) | %d | %d |" % (res[(False, True)],
                                                                                        res[(True, True)]))
    shutil.rmtree(work, ignore_errors=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
