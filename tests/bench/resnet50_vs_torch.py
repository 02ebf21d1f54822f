#!/usr/bin/env python3
"""ResNet-50 at 224x224 on one GPU: tinytrain beside PyTorch, same model, batch, data shape and steps.

    python3 tests/bench/resnet50_vs_torch.py [--batch 256] [--steps 24] [--warmup 4] [--repeats 3]
        [--configs tt-fp16,torch-amp-best,...] [--fair] [--vram 4G] [--out FILE]
    python3 tests/bench/resnet50_vs_torch.py --dry-run      what it would run, and what it skips here
    python3 tests/bench/resnet50_vs_torch.py --self-check   its own arithmetic and parsing (no GPU)

On synthetic data (3x224x224 uint8 images, 1000 classes; nothing is read from disk):

1. images/s of each configuration, every one timed over the same --steps steps after the same
   --warmup steps, in --repeats fresh processes each: the median and the spread (min..max).
   tinytrain's synthetic set holds (warmup + steps + 1) x batch images ([data] synthetic_size), so
   the timed steps lie inside one epoch (no evaluation among them); its rate is the images of the
   logged intervals after the warm-up over their time (log_every = warmup). PyTorch runs in a
   process of its own per repeat (this script with --torch-worker), timed with
   torch.cuda.synchronize() around the steps.
   Configurations: tt-fp32, tt-fp16 (tinytrain's default 16-bit layout, NCHW), tt-fp16-nhwc
   (TINYTRAIN_LAYOUT=nhwc, cuDNN's legacy API), tt-fp16-nhwc-graph (the same through cuDNN's graph
   API: TINYTRAIN_CUDA_CONV_API=graph), torch-fp32, torch-amp (autocast + GradScaler, channels-first, cudnn
   benchmark off), torch-amp-best (channels_last + cudnn.benchmark: PyTorch's fastest eager
   setting for fixed shapes). SGD with momentum on both sides; TF32 off on both (tinytrain --tf32
   off; PyTorch's allow_tf32 flags False).
2. memory, both ways: each process's whole device memory, sampled through NVML (pynvml where it
   is installed, else nvidia-smi --query-compute-apps) every 0.05 s, so the CUDA context and the
   libraries' handles count on both sides; and PyTorch's caching allocator's own peaks
   (max_memory_allocated / max_memory_reserved) beside it, with its context (NVML's figure for the
   process after CUDA, cuBLAS and cuDNN are up, less what the allocator holds then).
3. the largest micro-batch in --vram (4G): tinytrain by `plan --max-batch --vram 4G` (the whole
   process under 4 GiB); PyTorch by bisection on two training steps, with and without
   torch.utils.checkpoint, its caching allocator capped by set_per_process_memory_fraction:
   at the whole budget (which bounds its allocator only: its context comes on top, unfair to
   tinytrain), or with --fair at the budget less its measured context, so both sides hold the
   same whole-process bound.

A benchmark: it prints numbers (and writes them to --out), it never passes or fails on them.
Without a GPU, or without PyTorch, it says what it skipped and exits 0 (--dry-run prints the
commands it would run; CI runs --self-check and --dry-run: tests/gpu/test_measure.sh).
"""
import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TT = os.path.join(ROOT, "tinytrain")
GIB = 1 << 30
CONFIGS = ("tt-fp32", "tt-fp16", "tt-fp16-nhwc", "tt-fp16-nhwc-graph", "torch-fp32", "torch-amp", "torch-amp-best")
LABEL = {"tt-fp32": "tinytrain fp32", "tt-fp16": "tinytrain fp16 (NCHW)", "tt-fp16-nhwc": "tinytrain fp16 NHWC",
         "tt-fp16-nhwc-graph": "tinytrain fp16 NHWC, cuDNN graph API",
         "torch-fp32": "PyTorch fp32", "torch-amp": "PyTorch AMP",
         "torch-amp-best": "PyTorch AMP, channels_last + cudnn.benchmark"}


def say(lines, text=""):
    print(text, flush=True)
    lines.append(text)


# ----------------------------------------------------------------------------- pure helpers

def summarize(xs):
    """The median and the spread (min, max) of a list of numbers; NaN for none."""
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    if not xs:
        return float("nan"), float("nan"), float("nan")
    return statistics.median(xs), min(xs), max(xs)


def fmt_stat(xs, digits=1):
    med, lo, hi = summarize(xs)
    if math.isnan(med):
        return "?"
    n = len([x for x in xs if x is not None and not math.isnan(x)])
    return "%.*f (%.*f..%.*f, n=%d)" % (digits, med, digits, lo, digits, hi, n)


def tt_rate(metrics_lines, batch, warmup, steps):
    """tinytrain's images/s over the timed steps: the 'train' lines of metrics.jsonl logged every
    `warmup` steps; the first interval (the warm-up) is left out, and the rest, up to `steps` steps,
    weighted by their images (total images / total time). None when the run logged too little."""
    ivals = []
    for line in metrics_lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if d.get("event") == "train" and d.get("images_per_s"):
            ivals.append((d["step"], d["images_per_s"]))
    timed = [(s, r) for s, r in ivals if warmup < s <= warmup + steps]
    if not timed or timed[-1][0] != warmup + steps:
        return None
    images, seconds, prev = 0.0, 0.0, warmup
    for s, r in timed:
        n = (s - prev) * batch
        images, seconds, prev = images + n, seconds + n / r, s
    return images / seconds


def parse_smi_apps(text):
    """{pid: used MiB} from `nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`."""
    out = {}
    for line in text.splitlines():
        p = [x.strip() for x in line.split(",")]
        if len(p) >= 2 and p[0].isdigit() and re.match(r"^[0-9.]+$", p[1]):
            out[int(p[0])] = max(out.get(int(p[0]), 0.0), float(p[1]))
    return out


def parse_size(s):
    m = re.match(r"^([0-9.]+)\s*([KMGT]?)i?B?$", s.strip().upper())
    if not m:
        raise ValueError("not a size: %r (4G, 4096M)" % s)
    return float(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[m.group(2)]


def fair_fraction(budget, context, total):
    """set_per_process_memory_fraction's argument that caps PyTorch's allocator so that allocator +
    context stays within budget (bytes); the whole budget when fair is off (context 0)."""
    return max(0.0, min(1.0, (budget - context) / float(total)))


def synthetic_images(batch, warmup, steps):
    """Images of tinytrain's synthetic training set: every timed step inside the first epoch."""
    return (warmup + steps + 1) * batch


def resnet50_recipe(path, batch, warmup, steps):
    """examples/imagenet/resnet50.recipe with synthetic data of synthetic_images(...) images, batch
    `batch`, logging every `warmup` steps."""
    with open(os.path.join(ROOT, "examples/imagenet/resnet50.recipe")) as f:
        text = f.read()
    text = re.sub(r"(?m)^batch = \d+", "batch = %d" % batch, text)
    text = re.sub(r"(?m)^epochs = \d+", "epochs = 1", text)
    text = re.sub(r"(?s)\[data\].*?(?=\n\[)", "[data]\nformat = synthetic\nsynthetic_size = %d\n"
                  "mean = 0.485, 0.456, 0.406\nstd = 0.229, 0.224, 0.225\n" % synthetic_images(batch, warmup, steps),
                  text, count=1)
    text = re.sub(r"(?m)^(\[train\]\n)", r"\1log_every = %d\n" % warmup, text, count=1)
    with open(path, "w") as f:
        f.write(text)


def tt_command(recipe, precision, batch, warmup, steps, out):
    # --tf32 off: tinytrain's fp32 in true fp32, as PyTorch's (TF32 off on both sides)
    return [TT, "train", "--device", "cuda", "--precision", precision, "--recompute", "none", "--tf32", "off",
            "--micro-batch", str(batch), "--max-steps", str(warmup + steps), "--out", out, recipe]


def worker_command(mode, **kw):
    return [sys.executable, os.path.abspath(__file__), "--torch-worker", json.dumps(dict(kw, mode=mode), sort_keys=True)]


# ----------------------------------------------------------------------------- device memory

class MemSampler:
    """The peak device memory (MiB) of one process, through NVML (pynvml) where installed, else
    nvidia-smi, every 0.05 s (nvidia-smi: as fast as it answers, ~0.1 s)."""

    def __init__(self, pid):
        self.pid, self.peak_mib, self._stop = pid, 0.0, threading.Event()
        self.source = "nvidia-smi"
        self._nvml = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self._nvml, self._h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
            self.source = "NVML (pynvml)"
        except Exception:  # not installed, or no driver: nvidia-smi
            self._nvml = None
        self._t = threading.Thread(target=self._run, daemon=True)

    def read(self):
        if self._nvml:
            try:
                for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._h):
                    if p.pid == self.pid and p.usedGpuMemory:
                        return p.usedGpuMemory / 2**20
            except Exception:
                pass
            return 0.0
        smi = shutil.which("nvidia-smi")
        try:
            out = subprocess.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=10).stdout.decode()
            return parse_smi_apps(out).get(self.pid, 0.0)
        except (OSError, subprocess.TimeoutExpired, TypeError):
            return 0.0

    def _run(self):
        while not self._stop.is_set():
            self.peak_mib = max(self.peak_mib, self.read())
            self._stop.wait(0.05)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *a):
        self._stop.set()
        self._t.join()


KEEP_LOGS = None  # --keep-logs DIR: every process's output there


def keep_log(what, cmd, text):
    if not KEEP_LOGS:
        return
    os.makedirs(KEEP_LOGS, exist_ok=True)
    n = len(os.listdir(KEEP_LOGS))
    with open(os.path.join(KEEP_LOGS, "%02d-%s.log" % (n, what)), "w") as f:
        f.write("$ " + " ".join(cmd) + "\n" + text)


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


# ----------------------------------------------------------------------------- tinytrain

def tt_env(config):
    """The environment settings a tinytrain configuration adds (NAME=VALUE strings)."""
    return {"tt-fp16-nhwc": ["TINYTRAIN_LAYOUT=nhwc"],
            "tt-fp16-nhwc-graph": ["TINYTRAIN_LAYOUT=nhwc", "TINYTRAIN_CUDA_CONV_API=graph"]}.get(config, [])


def tinytrain_run(lines, recipe, config, batch, warmup, steps, timeout):
    out = tempfile.mkdtemp(prefix="tt_r50_")
    env = dict(os.environ)
    for kv in tt_env(config):
        env[kv.split("=")[0]] = kv.split("=", 1)[1]
    cmd = tt_command(recipe, "fp32" if config == "tt-fp32" else "fp16", batch, warmup, steps, out)
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    with MemSampler(p.pid) as ms:
        try:
            text = p.communicate(timeout=timeout)[0].decode("utf-8", "replace")
        except subprocess.TimeoutExpired:
            p.kill()
            text = p.communicate()[0].decode("utf-8", "replace")
            say(lines, "  %s: over %d s, killed" % (config, timeout))
            return None
    wall = time.time() - t0
    keep_log(config, tt_env(config) + cmd, text)
    if p.returncode != 0:
        say(lines, "  %s failed (exit %d): %s" % (config, p.returncode, text.strip()[-600:]))
        return None
    try:
        with open(os.path.join(out, "metrics.jsonl")) as f:
            rate = tt_rate(f.readlines(), batch, warmup, steps)
    except OSError:
        rate = None
    arena = re.search(r"arena ([0-9.]+) MiB", text)
    shutil.rmtree(out, ignore_errors=True)
    if rate is None:
        say(lines, "  %s: metrics.jsonl has no interval ending at step %d" % (config, warmup + steps))
    return {"ips": rate, "peak_mib": ms.peak_mib, "arena_mib": float(arena.group(1)) if arena else float("nan"),
            "wall_s": wall, "mem_source": ms.source}


def tinytrain_max_batch(lines, recipe, vram, timeout):
    t0 = time.time()
    try:
        p = subprocess.run([TT, "plan", "--max-batch", "--json", "--device", "cuda", "--vram", vram, recipe],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    except subprocess.TimeoutExpired:
        say(lines, "  tinytrain plan --max-batch: over %d s, killed" % timeout)
        return {}
    print("  (tinytrain plan --max-batch: exit %d, %.0f s)" % (p.returncode, time.time() - t0), flush=True)
    if p.returncode != 0:
        say(lines, "  tinytrain plan --max-batch failed: %s" % p.stdout.decode()[-400:])
        return {}
    d = json.loads(p.stdout.decode()[p.stdout.decode().index("{"):])
    return {(r["precision"], r["recompute"]): r["micro_batch"] for r in d["max_batch"]}


# ----------------------------------------------------------------------------- PyTorch (worker side)

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


def torch_context_bytes(torch):
    """This process's device memory outside PyTorch's allocator once CUDA, cuBLAS and cuDNN are
    up (a small convolution and matmul have run): NVML's figure for the process less what the
    allocator reserves. None where neither pynvml nor nvidia-smi answers."""
    a = torch.ones(8, 8, device="cuda")
    (a @ a).sum().item()
    torch.nn.functional.conv2d(torch.ones(1, 3, 8, 8, device="cuda"), torch.ones(4, 3, 3, 3, device="cuda")).sum().item()
    torch.cuda.synchronize()
    used = MemSampler(os.getpid()).read()
    if not used:
        return None
    return used * 2**20 - torch.cuda.memory_reserved()


def torch_speed(torch, amp, best, steps, warmup, batch):
    torch.backends.cudnn.benchmark = best
    model = torch_resnet50(torch).cuda().train()
    x, y = torch_batch(torch, batch)
    if best:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    step = torch_step_fn(torch, model, amp, False)
    for _ in range(warmup):
        step(x, y)
    torch.cuda.synchronize()
    t0 = time.time()
    for _ in range(steps):
        step(x, y)
    torch.cuda.synchronize()
    dt = time.time() - t0
    return {"ips": steps * batch / dt, "allocated_mib": torch.cuda.max_memory_allocated() / 2**20,
            "reserved_mib": torch.cuda.max_memory_reserved() / 2**20}


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


def torch_worker(spec):
    """One measurement in this process (a fresh one per repeat): prints one line 'RESULT {json}'."""
    import torch
    import torch.utils.checkpoint  # noqa: F401 (not imported by torch itself)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ctx = torch_context_bytes(torch)
    res = {"context_mib": ctx / 2**20 if ctx is not None else None}
    if spec["mode"] == "speed":
        res.update(torch_speed(torch, spec["amp"], spec["best"], spec["steps"], spec["warmup"], spec["batch"]))
    elif spec["mode"] == "profile":  # torch.profiler over steps of the best setting, its kernels by time
        torch_profile(torch, spec)
    elif spec["mode"] == "maxbatch":
        total = torch.cuda.get_device_properties(0).total_memory
        context = (ctx or 0) if spec["fair"] else 0
        frac = fair_fraction(spec["budget"], context, total)
        torch.cuda.set_per_process_memory_fraction(frac)
        res["cap_mib"] = frac * total / 2**20
        res["max_batch"] = {}
        # mixed precision first (the goals' headline); a RESULT line after each, so a run stopped
        # at its time limit still says what it found
        for amp, ck in ((True, False), (True, True), (False, False), (False, True)):
            res["max_batch"]["%d%d" % (amp, ck)] = torch_max_batch(torch, amp, ck)
            print("RESULT " + json.dumps(res), flush=True)
        return 0
    print("RESULT " + json.dumps(res), flush=True)
    return 0


def torch_profile(torch, spec):
    """PyTorch's profiler over spec['steps'] steps of AMP + channels_last + cudnn.benchmark after a
    warm-up: the kernels by total CUDA time (the table torch.profiler prints), to set beside
    tinytrain's TINYTRAIN_PROFILE and ncu."""
    torch.backends.cudnn.benchmark = True
    model = torch_resnet50(torch).cuda().train().to(memory_format=torch.channels_last)
    x, y = torch_batch(torch, spec["batch"])
    x = x.contiguous(memory_format=torch.channels_last)
    step = torch_step_fn(torch, model, True, False)
    for _ in range(spec["warmup"]):
        step(x, y)
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(spec["steps"]):
            step(x, y)
        torch.cuda.synchronize()
    key = "self_cuda_time_total" if hasattr(prof.key_averages()[0], "self_cuda_time_total") else "self_device_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=30), flush=True)


# ----------------------------------------------------------------------------- PyTorch (parent side)

def torch_run(lines, cmd, timeout):
    """Runs a worker; its result and its whole-process peak (MiB)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    killed = False
    with MemSampler(p.pid) as ms:
        try:
            text = p.communicate(timeout=timeout)[0].decode("utf-8", "replace")
        except subprocess.TimeoutExpired:
            p.kill()
            text, killed = p.communicate()[0].decode("utf-8", "replace"), True
            say(lines, "  PyTorch worker over %d s, killed%s" % (timeout, "; its last result kept" if "RESULT" in text else ""))
    keep_log("torch", cmd, text)
    m = re.findall(r"(?m)^RESULT (.*)$", text)  # the last: the maximum-batch worker prints one per setting
    if (p.returncode != 0 and not killed) or not m:
        say(lines, "  PyTorch worker failed (exit %s): %s" % (p.returncode, text.strip()[-600:]))
        return None
    r = json.loads(m[-1])
    r["peak_mib"], r["mem_source"] = ms.peak_mib, ms.source
    return r


# ----------------------------------------------------------------------------- self-check

def self_check():
    """The script's own arithmetic and parsing, no GPU and no PyTorch needed. 0 when all hold."""
    fails = []

    def check(cond, what):
        print("%s %s" % ("ok  " if cond else "FAIL", what))
        if not cond:
            fails.append(what)

    med, lo, hi = summarize([3.0, 1.0, 2.0])
    check((med, lo, hi) == (2.0, 1.0, 3.0), "median and spread of 3 runs")
    check(fmt_stat([100.0, None, 300.0, 200.0]) == "200.0 (100.0..300.0, n=3)", "a failed run is left out")
    check(fmt_stat([]) == "?", "no runs: ?")
    # 4 warm-up steps then 24 timed at batch 256, logged every 4 steps; the warm-up's rate is ignored
    ml = ['{"event": "train", "step": %d, "images_per_s": %s}' % (s, r) for s, r in
          [(4, 1.0)] + [(4 * k, 2560.0) for k in range(2, 8)]]
    check(abs(tt_rate(ml, 256, 4, 24) - 2560.0) < 1e-6, "tinytrain's rate: the warm-up interval left out")
    ml2 = ml[:-1] + ['{"event": "train", "step": 28, "images_per_s": 1280.0}']
    check(abs(tt_rate(ml2, 256, 4, 24) - 24 * 256 / (20 * 256 / 2560.0 + 4 * 256 / 1280.0)) < 1e-6,
          "tinytrain's rate weighs intervals by their images")
    check(tt_rate(ml[:-1], 256, 4, 24) is None, "a run that stopped early has no rate")
    check(parse_smi_apps("123, 4000\n456, 12\nNo running processes found\n") == {123: 4000.0, 456: 12.0},
          "nvidia-smi's compute-apps CSV")
    check(parse_size("4G") == 4 * GIB and parse_size("4096M") == 4 * GIB, "sizes")
    check(abs(fair_fraction(4 * GIB, 512 * 2**20, 80 * GIB) - 3.5 / 80) < 1e-12, "the fair cap: 4 GiB less the context")
    check(fair_fraction(4 * GIB, 0, 80 * GIB) == 4 / 80.0, "the allocator-only cap")
    check(synthetic_images(256, 4, 24) >= 28 * 256, "the synthetic set holds every step at batch 256")
    tmp = tempfile.mkdtemp(prefix="tt_r50_check_")
    try:
        rp = os.path.join(tmp, "r.recipe")
        resnet50_recipe(rp, 256, 4, 24)
        text = open(rp).read()
        check("synthetic_size = %d" % synthetic_images(256, 4, 24) in text and "log_every = 4" in text and
              "batch = 256" in text and "format = synthetic" in text, "the recipe")
        cmd = tt_command(rp, "fp16", 256, 4, 24, tmp)
        check(cmd[cmd.index("--max-steps") + 1] == "28", "tinytrain runs warm-up + timed steps")
        w = worker_command("speed", amp=True, best=True, steps=24, warmup=4, batch=256)
        check(json.loads(w[-1])["steps"] == 24 and w[-2] == "--torch-worker", "the worker's command")
        if os.access(TT, os.X_OK):  # the recipe parses, synthetic_size included (a CPU plan: no GPU needed)
            p = subprocess.run([TT, "plan", "--device", "cpu", "--micro-batch", "8", rp], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=300)
            out = p.stdout.decode("utf-8", "replace")
            check(p.returncode == 0 and "warning" not in out, "tinytrain plan reads the recipe: exit %d %s" %
                  (p.returncode, out.strip()[-300:] if p.returncode else ""))
        else:
            print("skip tinytrain plan of the recipe (no ./tinytrain)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("self-check: %d failed" % len(fails))
    return 1 if fails else 0


# ----------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=24, help="timed steps, both sides")
    ap.add_argument("--warmup", type=int, default=4, help="untimed steps before them, both sides")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes per configuration (median, spread)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, of: " + ", ".join(CONFIGS))
    ap.add_argument("--vram", default="4G", help="the budget of the largest-micro-batch comparison")
    ap.add_argument("--fair", action="store_true",
                    help="cap PyTorch's allocator at --vram less its measured context (whole process on both sides)")
    ap.add_argument("--timeout", type=int, default=300,
                    help="seconds per process (PyTorch's largest-batch bisection is one process)")
    ap.add_argument("--out", help="also write the report here")
    ap.add_argument("--skip-torch-max-batch", action="store_true")
    ap.add_argument("--skip-max-batch", action="store_true",
                    help="no largest-micro-batch section (it does not depend on --batch: one run of it is enough)")
    ap.add_argument("--only-max-batch", action="store_true", help="the largest-micro-batch section alone")
    ap.add_argument("--no-tf32", action="store_true", help="accepted for old command lines: TF32 is off on both sides")
    ap.add_argument("--keep-logs", metavar="DIR", help="write every process's whole output into DIR")
    ap.add_argument("--torch-profile", action="store_true",
                    help="also run PyTorch's profiler over --steps steps of its best setting (its kernel table)")
    ap.add_argument("--dry-run", action="store_true", help="print what would run and what is skipped here; run nothing")
    ap.add_argument("--self-check", action="store_true", help="check the script's arithmetic and parsing; no GPU")
    ap.add_argument("--torch-worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker:
        return torch_worker(json.loads(a.torch_worker))
    if a.self_check:
        return self_check()
    global KEEP_LOGS
    KEEP_LOGS = a.keep_logs
    configs = [c for c in a.configs.split(",") if c]
    bad = [c for c in configs if c not in CONFIGS]
    if bad or a.steps < 1 or a.warmup < 1 or a.repeats < 1:
        ap.error("unknown configuration %s (of %s), or --steps/--warmup/--repeats under 1" % (bad, ", ".join(CONFIGS)))
    lines = []
    say(lines, "# ResNet-50 224x224, synthetic data: tinytrain vs PyTorch")
    say(lines, "batch %d: %d timed steps after %d warm-up steps on both sides, %d fresh processes per configuration "
               "(median, min..max); TF32 off on both sides" % (a.batch, a.steps, a.warmup, a.repeats))
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
        say(lines, "PyTorch %s (CUDA %s)" % (torch.__version__, torch.version.cuda))
    except ImportError:
        torch = None
    try:
        import pynvml  # noqa: F401
        mem = "NVML through pynvml"
    except ImportError:
        mem = "nvidia-smi --query-compute-apps (no pynvml)"
    say(lines, "whole-process device memory sampled by %s" % mem)
    gpu, why = gpu_present()
    if torch is not None and gpu and not torch.cuda.is_available():
        gpu, why = None, "torch.cuda.is_available() is False"
    skipped = []
    if torch is None:
        skipped.append("every PyTorch configuration and PyTorch's largest batch (no PyTorch: python3 -m pip install torch)")
    if not gpu:
        skipped.append("every measurement (no GPU here: %s)" % why)
    if missing:
        skipped.append("tinytrain's side (missing %s)" % "; ".join(missing))
    work = tempfile.mkdtemp(prefix="tt_r50_bench_")
    recipe = os.path.join(work, "resnet50_synthetic.recipe")
    resnet50_recipe(recipe, a.batch, a.warmup, a.steps)
    if a.dry_run or not gpu or (missing and torch is None):
        say(lines, "")
        say(lines, "## would run (%s)" % ("--dry-run" if a.dry_run else "nothing measured here"))
        if not a.only_max_batch:
            for c in configs:
                if c.startswith("tt-"):
                    cmd = " ".join(tt_command(recipe, "fp32" if c == "tt-fp32" else "fp16", a.batch, a.warmup, a.steps,
                                              "OUT"))
                    say(lines, "- %s, %d x: %s%s" % (c, a.repeats, "".join(kv + " " for kv in tt_env(c)), cmd))
                else:
                    cmd = worker_command("speed", amp=c != "torch-fp32", best=c == "torch-amp-best", steps=a.steps,
                                         warmup=a.warmup, batch=a.batch)
                    say(lines, "- %s, %d x: %s '%s'" % (c, a.repeats, " ".join(cmd[:-1]), cmd[-1]))
        if a.torch_profile:
            cmd = worker_command("profile", steps=a.steps, warmup=a.warmup, batch=a.batch)
            say(lines, "- PyTorch's profiler: %s '%s'" % (" ".join(cmd[:-1]), cmd[-1]))
        if not a.skip_max_batch:
            say(lines, "- tinytrain largest batch: %s plan --max-batch --json --device cuda --vram %s RECIPE" % (TT, a.vram))
            if not a.skip_torch_max_batch:
                cmd = worker_command("maxbatch", fair=a.fair, budget=parse_size(a.vram))
                say(lines, "- PyTorch largest batch (%s): %s '%s'" % ("fair: allocator capped at the budget less its context"
                                                                     if a.fair else "allocator capped at the budget",
                                                                     " ".join(cmd[:-1]), cmd[-1]))
        say(lines, "recipe: synthetic_size = %d images (%d steps of %d and one more)" % (
            synthetic_images(a.batch, a.warmup, a.steps), a.warmup + a.steps, a.batch))
        for s in skipped:
            say(lines, "skipped here: %s" % s)
        shutil.rmtree(work, ignore_errors=True)
        if a.out:
            with open(a.out, "w") as f:
                f.write("\n".join(lines) + "\n")
        return 0
    say(lines, "GPU: %s, %.0f MiB, compute capability %s" % (gpu["name"], gpu["total_mib"], gpu["cc"]))
    for s in skipped:
        say(lines, "skipped: %s" % s)

    if not a.only_max_batch and configs:
        say(lines)
        say(lines, "## batch %d: images/s and device memory" % a.batch)
        say(lines, "| | images/s, median (min..max, n) | whole-process peak MiB (%s) | allocator peak MiB "
                   "(allocated / reserved) | notes |" % mem.split(" ")[0])
        say(lines, "|---|---|---|---|---|")
        for c in configs:
            is_tt = c.startswith("tt-")
            if (is_tt and missing) or (not is_tt and torch is None):
                say(lines, "| %s | skipped | | | %s |" % (LABEL[c], "missing tinytrain" if is_tt else "no PyTorch"))
                continue
            runs = []
            for _ in range(a.repeats):
                if is_tt:
                    runs.append(tinytrain_run(lines, recipe, c, a.batch, a.warmup, a.steps, a.timeout))
                else:
                    runs.append(torch_run(lines, worker_command("speed", amp=c != "torch-fp32", best=c == "torch-amp-best",
                                                                steps=a.steps, warmup=a.warmup, batch=a.batch), a.timeout))
            ok = [r for r in runs if r]
            ips = fmt_stat([r["ips"] for r in ok])
            peak = fmt_stat([r["peak_mib"] for r in ok], 0)
            if is_tt:
                alloc = "-"
                notes = "arena %s MiB" % fmt_stat([r["arena_mib"] for r in ok], 0)
            else:
                alloc = "%s / %s" % (fmt_stat([r["allocated_mib"] for r in ok], 0), fmt_stat([r["reserved_mib"] for r in ok], 0))
                notes = "context %s MiB" % fmt_stat([r["context_mib"] for r in ok if r["context_mib"] is not None], 0)
            say(lines, "| %s | %s | %s | %s | %s%s |" % (LABEL[c], ips, peak, alloc, notes,
                                                         "" if len(ok) == a.repeats else "; %d of %d runs failed" % (
                                                             a.repeats - len(ok), a.repeats)))

    if a.torch_profile and torch is not None:
        say(lines)
        say(lines, "## PyTorch's profiler: AMP + channels_last + cudnn.benchmark, batch %d, %d steps after %d" % (
            a.batch, a.steps, a.warmup))
        r = torch_run(lines, worker_command("profile", steps=a.steps, warmup=a.warmup, batch=a.batch), a.timeout)
        if r is not None:
            say(lines, "(the kernel table: the worker's log%s)" % (" in " + KEEP_LOGS if KEEP_LOGS else "; use --keep-logs"))

    if not a.skip_max_batch:
        say(lines)
        say(lines, "## largest micro-batch in %s" % a.vram)
        say(lines, "| | fp32 | mixed precision |")
        say(lines, "|---|---|---|")
        if not missing:
            tmb = tinytrain_max_batch(lines, recipe, a.vram, a.timeout)
            say(lines, "| tinytrain, no recompute (whole process) | %s | %s |" % (tmb.get(("fp32", "none"), "?"),
                                                                                tmb.get(("fp16", "none"), "?")))
            say(lines, "| tinytrain, recompute auto (whole process) | %s | %s |" % (tmb.get(("fp32", "auto"), "?"),
                                                                                  tmb.get(("fp16", "auto"), "?")))
        if torch is not None and not a.skip_torch_max_batch:
            r = torch_run(lines, worker_command("maxbatch", fair=a.fair, budget=parse_size(a.vram)), a.timeout)
            if r:
                how = ("allocator capped at %.0f MiB = %s less its context %.0f MiB: whole process within the budget"
                       % (r["cap_mib"], a.vram, r["context_mib"] or 0) if a.fair else
                       "allocator capped at %.0f MiB, context %s MiB on top" % (
                           r["cap_mib"], "%.0f" % r["context_mib"] if r["context_mib"] is not None else "?"))
                mb = r["max_batch"]
                say(lines, "| PyTorch (%s) | %d | %d |" % (how, mb["00"], mb["10"]))
                say(lines, "| PyTorch + torch.utils.checkpoint (sqrt(n) segments), same cap | %d | %d |" % (mb["01"], mb["11"]))
                say(lines, "| PyTorch whole-process peak over the bisection | %.0f MiB | |" % r["peak_mib"])
    shutil.rmtree(work, ignore_errors=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
