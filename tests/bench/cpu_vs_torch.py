#!/usr/bin/env python3
"""tinytrain's CPU backend against PyTorch on the same CPU: speed, memory, share of the peak.

    ninja bench tinytrain          # build/bench/bench_step, bench_peak and the command line
    python3 tests/bench/cpu_vs_torch.py --python /path/to/venv/bin/python [--python /usr/bin/python3]
        [--threads 2] [--runs 3] [--nets small_cnn,small_resnet,resnet50] [--modes ...]
        [--shared [--load-procs 2] [--shared-modes ...]] [--max-batch] [--max-batch-bf16] [--quick] [--build DIR]

The parent process never imports torch: every measurement is a fresh child process, and PyTorch
is whatever each --python has (the newest from PyPI in a virtual environment, the reference;
Debian's python3-torch as a second one: /usr/bin/python3 is tried by default, and skipped with
a note when it has no torch). Same networks, batch, thread count (--threads, default 2) and
synthetic data (one fixed random batch) on both sides.

Speed (always, unless --skip-speed). Networks (--nets):
  small_cnn     examples/fashion_mnist/lenet.recipe, 1x28x28, batch 64
  small_resnet  the fashion ResNet (examples/fashion_mnist/resnet.recipe) at widths 32/64/128,
                1x28x28, batch 128
  resnet50      examples/imagenet/resnet50.recipe = torchvision's resnet50, 3x224x224, batch 16
Runners: tinytrain (build/bench/bench_step: one training step = micro-step + SGD update, on its
default oneDNN backend) in fp32 and bf16 (--tt-modes; bf16 is reported as unavailable while the
build cannot run it), plus for ResNet-50 fp32 with the scheduler fitting a 1.2 GiB arena; and
for each PyTorch (forward, cross-entropy, backward, SGD step) the modes (--modes):
  eager            fp32, NCHW
  channels_last    fp32, model and input in torch.channels_last
  bf16_cl          channels_last + torch.autocast("cpu", dtype=torch.bfloat16)
  compile          torch.compile(model), fp32 NCHW
  compile_bf16_cl  torch.compile + channels_last + bf16 autocast
A mode a PyTorch cannot run (torch.compile before 2.0, a compiler error) is reported with its
reason. torch.compile's compilation happens in the warm-up steps (at least 3), so it is not in
the step time; the first step's seconds are printed as its cost. Every runner runs --runs times
(default 3), in rotating order, a fresh process each; the tables show medians. For each network:
images/s, step time, peak resident memory (the child's VmHWM: everything it touched, interpreter
and libraries included), achieved GFLOP/s (3 x the graph's forward FLOPs per image x images/s:
forward, backward-data and backward-weights) as a share of the measured peak (fp32 runs against
the fp32 peak, bf16 runs against the bf16 peak), every tinytrain/PyTorch ratio, and tinytrain's
best against each PyTorch's best; memory: tinytrain fp32 against eager, tinytrain bf16 against
bf16_cl (same batch).

Peak FLOP/s (unless --no-peak): build/bench/bench_peak, a large oneDNN matmul in fp32 and bf16 on
the same threads, in the same run (before the speed part).

--shared: the same networks beside a fixed competing load. --load spin (the default): --load-procs
(default 2) processes of a fixed, reproducible CPU-bound job, this script's --load-child: pure
Python products of two fixed 16x16 matrices, counted; --load copy: that many copies of the same
training; --load-pin pins load process i to CPU i. The load starts --load-settle seconds (1)
before each loaded run and is stopped after it, fresh processes each time. For each runner, an
idle and a loaded run alternate (--runs of each, rotating order); printed per network, medians:
images/s idle, shared, shared/idle (the degradation), the load average (1-minute, at the end of
the loaded runs), "load kept" (the load's products/s beside the runner against its rate alone,
measured first for --load-alone seconds: what the runner left to its neighbours), tinytrain's
degradation against each PyTorch mode's, and tinytrain's best against PyTorch's best under load.
Runners: tinytrain's --tt-modes and the PyTorch modes of --shared-modes (default eager,
channels_last, bf16_cl); tinytrain fp32 also with libgomp's default wait (GOMP_SPINCOUNT=300000),
with OMP_WAIT_POLICY=passive and with one thread, to show what the choice of wait policy and
thread count does (--no-wait-variants leaves them out; tinytrain's own default is what
`tinytrain --version` says, and bench_step gets it too). --skip-speed --no-peak --shared runs
the shared part alone.

--max-batch-bf16: the largest ResNet-50 batch in 4 GiB in bf16: `tinytrain plan --vram 4G
--max-batch --precision bf16`, then `tinytrain train --vram 4G --precision bf16` for a few steps
at that micro-batch on synthetic data, the whole process's peak RSS (loader included; if it is
over 4 GiB, a --vram smaller by the process's overhead, planned and run again), against the
largest PyTorch bf16 + channels_last batch whose process stays under 4 GiB over two training
steps (doubling, then bisecting, a fresh process per probe). --max-batch: the same in fp32,
against PyTorch plain and with torch.utils.checkpoint (checkpoint_sequential over the network's
20 stages, sqrt segments). Both take minutes; --limit changes 4G.

A benchmark: it prints numbers, never passes or fails. Load on the machine changes them: the
load average is printed at the start, per network and at the end. --quick runs everything once
with 2 timed steps (checks the script, measures nothing).
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
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GIB = 1 << 30

# name: (recipe, batch, timed steps, warm-up steps, input shape, classes, title)
NETS = {
    "small_cnn": ("examples/fashion_mnist/lenet.recipe", 64, 40, 5, (1, 28, 28), 10, "small CNN (lenet.recipe)"),
    "small_resnet": (None, 128, 15, 3, (1, 28, 28), 10, "small ResNet 32/64/128 (resnet.recipe widened)"),
    "resnet50": ("examples/imagenet/resnet50.recipe", 16, 5, 2, (3, 224, 224), 1000, "ResNet-50 224x224"),
}
SMALL_RESNET_WIDTHS = (32, 64, 128)
TORCH_MODES = ["eager", "channels_last", "bf16_cl", "compile", "compile_bf16_cl"]
TT_MODES = ["fp32", "bf16"]
BF16_MODES = ("bf16", "bf16_cl", "compile_bf16_cl")  # measured against the bf16 peak


# --------------------------------------------------------------------------- PyTorch side

def torch_model(name):
    import torch.nn as nn
    if name == "small_cnn":
        return nn.Sequential(
            nn.Conv2d(1, 32, 5, padding=2, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 7 * 7, 256), nn.ReLU(inplace=True), nn.Dropout(0.3), nn.Linear(256, 10))
    if name == "small_resnet":
        from torchvision.models.resnet import BasicBlock
        w1, w2, w3 = SMALL_RESNET_WIDTHS

        def down(cin, c):
            return BasicBlock(cin, c, stride=2, downsample=nn.Sequential(nn.Conv2d(cin, c, 1, stride=2, bias=False),
                                                                           nn.BatchNorm2d(c)))
        return nn.Sequential(
            nn.Conv2d(1, w1, 3, padding=1, bias=False), nn.BatchNorm2d(w1), nn.ReLU(inplace=True),
            BasicBlock(w1, w1), BasicBlock(w1, w1), down(w1, w2), BasicBlock(w2, w2), down(w2, w3), BasicBlock(w3, w3),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(w3, 10))
    if name == "resnet50":
        import torchvision
        return torchvision.models.resnet50(num_classes=1000)
    raise ValueError(name)


def torch_optimizer(name, params):
    import torch
    if name == "small_cnn":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4), 0.0
    if name == "small_resnet":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4), 0.1
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4), 0.0


def resnet50_stages(net):
    """torchvision's resnet50 as a list of 20 sequential stages (stem, 16 bottlenecks, head)."""
    import torch.nn as nn
    stages = [nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool)]
    for layer in (net.layer1, net.layer2, net.layer3, net.layer4):
        stages += list(layer)
    stages.append(nn.Sequential(net.avgpool, nn.Flatten(), net.fc))
    return nn.Sequential(*stages)


def torch_info():
    """The PyTorch of this interpreter: version, its oneDNN, threads (a JSON line; for the header)."""
    import torch
    par = torch.__config__.parallel_info()
    m = re.search(r"MKL-DNN v([\d.]+)", par) or re.search(r"oneDNN v([\d.]+)", par)
    rt = re.search(r"ATen parallel backend: (\S+)", par)
    tv = None
    try:
        import torchvision
        tv = torchvision.__version__
    except ImportError:
        pass
    print(json.dumps({"torch": torch.__version__, "torchvision": tv, "onednn": m.group(1) if m else None,
                      "parallel": rt.group(1) if rt else None, "file": torch.__file__,
                      "compile": hasattr(torch, "compile")}))


def torch_child(a):
    """One PyTorch measurement in this (fresh) process; prints a JSON line ({"error": ...} if it cannot)."""
    try:
        res = torch_measure(a)
    except Exception as e:  # a mode this PyTorch cannot run: its reason, for the table
        msg = ("%s: %s" % (type(e).__name__, e)).strip().splitlines()
        print(json.dumps({"error": (msg[0] if msg else type(e).__name__)[:300]}))
        print("VmHWM %d" % vm_hwm(os.getpid()))
        sys.stdout.flush()
        sys.exit(3)
    print(json.dumps(res))
    print("VmHWM %d" % vm_hwm(os.getpid()))
    sys.stdout.flush()


def torch_measure(a):
    import contextlib
    import torch
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    _, batch, steps, warmup, shape, classes, _ = NETS[a.model]
    batch = a.batch or batch
    steps = a.steps if a.steps is not None else steps
    warmup = a.warmup if a.warmup is not None else warmup
    mode = a.mode or "eager"
    if mode not in TORCH_MODES:
        raise ValueError("unknown mode %s" % mode)
    cl = mode in ("channels_last", "bf16_cl", "compile_bf16_cl")
    bf16 = mode in ("bf16_cl", "compile_bf16_cl")
    comp = mode.startswith("compile")
    if comp and not hasattr(torch, "compile"):
        raise RuntimeError("torch.compile is not in torch %s (it came in 2.0)" % torch.__version__)
    if comp:
        warmup = max(warmup, 3)  # compilation of forward and backward, and a possible recompilation
    net = torch_model(a.model)
    net.train()
    x = torch.randn(batch, *shape, requires_grad=bool(a.checkpoint))
    y = torch.randint(0, classes, (batch,))
    if cl:
        net = net.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    forward = net
    if a.checkpoint:
        from torch.utils.checkpoint import checkpoint_sequential
        seq = resnet50_stages(net)
        segments = max(1, int(round(math.sqrt(len(seq)))))
        forward = lambda v: checkpoint_sequential(seq, segments, v)  # noqa: E731
    opt, smoothing = torch_optimizer(a.model, net.parameters())
    if comp:
        forward = torch.compile(net)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=smoothing)
    times, first = [], None
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with (torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()):
            loss = loss_fn(forward(x), y)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        if i == 0:
            first = dt
        if i >= warmup:
            times.append(dt)
    if not math.isfinite(float(loss)):
        raise RuntimeError("the loss is %s" % float(loss))
    med = statistics.median(times) if times else float("nan")
    return {"images_per_s": batch / med if times else 0.0, "step_ms": 1e3 * med if times else 0.0,
            "first_step_s": first, "torch": torch.__version__, "threads": torch.get_num_threads(), "mode": mode,
            "batch": batch}


# ------------------------------------------------------------------------- measurement

def vm_hwm(pid):
    """The process's own peak resident set (VmHWM, bytes), or 0 once it is gone."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def child_env(threads, extra=None):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TORCHINDUCTOR_COMPILE_THREADS="1")
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def run_child(cmd, threads, extra_env=None, timeout=None):
    """Runs cmd in a fresh process; returns (output, return code, peak resident bytes).

    The peak is the child's own high-water mark (VmHWM), read every 20 ms until it exits: it
    only grows, so the last reading holds the peak of everything before it. (getrusage of a
    child would not do: Linux counts in it the resident set of the process it was forked
    from, this Python, up to the exec.)"""
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(threads, extra_env), cwd=ROOT)
        peak, t0 = 0, time.time()
        while p.poll() is None:
            peak = max(peak, vm_hwm(p.pid))
            if timeout and time.time() - t0 > timeout:
                p.kill()
                p.wait()
                break
            time.sleep(0.02)
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
    m = re.search(r"^VmHWM (\d+)$", text, re.M)  # the child's own last word, when it gives one
    if m:
        peak = max(peak, int(m.group(1)))
    rc = p.returncode if not (timeout and time.time() - t0 > timeout) else 124
    return text, rc, peak


class Ctx:
    """What the run knows: paths, the tinytrain wait setting, the references, the options."""

    def __init__(self, a):
        self.a = a
        self.build = os.path.join(ROOT, a.build)
        self.tt = os.path.join(self.build, "tinytrain") if a.build != "build" else os.path.join(ROOT, "tinytrain")
        self.bench_step = os.path.join(self.build, "bench", "bench_step")
        self.bench_peak = os.path.join(self.build, "bench", "bench_peak")
        self.tmp = tempfile.mkdtemp(prefix="tt_cpu_vs_torch_")
        self.tt_env = {}  # what the command line would run libgomp with (tinytrain --version)
        self.refs = []  # (label, python, info)
        self.flops = {}  # net -> forward FLOPs per image (tinytrain's graph)
        self.peak = {}  # "fp32"/"bf16" -> best GFLOP/s
        self.recipes = {}

    def recipe(self, name):
        """The network's recipe, its [data] synthetic (nothing read; bench_step ignores data)."""
        if name in self.recipes:
            return self.recipes[name]
        src = NETS[name][0] or "examples/fashion_mnist/resnet.recipe"
        with open(os.path.join(ROOT, src)) as f:
            lines = f.read().splitlines()
        out, skip = [], False
        for line in lines:
            if line.startswith("["):
                skip = line.strip() == "[data]"
            if not skip:
                out.append(line)
        text = "\n".join(out) + "\n[data]\nformat = synthetic\n"
        if name == "small_resnet":  # widths 24/48/96 -> 32/64/128
            w = dict(zip(("24", "48", "96"), (str(v) for v in SMALL_RESNET_WIDTHS)))
            text = re.sub(r"(?m)^(c|filters) = (24|48|96)\b", lambda m: "%s = %s" % (m.group(1), w[m.group(2)]), text)
        path = os.path.join(self.tmp, "%s.recipe" % name)
        with open(path, "w") as f:
            f.write(text)
        self.recipes[name] = path
        return path


def steps_of(ctx, name):
    _, batch, steps, warmup = NETS[name][:4]
    a = ctx.a
    if a.steps is not None:
        steps = a.steps
    if a.warmup is not None:
        warmup = a.warmup
    return batch, steps, warmup


# A runner: (who, mode, label). who: "tt" or the index of a reference PyTorch.

def tt_cmd(ctx, name, mode, steps=None, threads=None):
    batch, st, warmup = steps_of(ctx, name)
    vram, prec = "-", mode
    if mode == "fp32@1.2G":
        vram, prec = "1.2G", "fp32"
    return [ctx.bench_step, ctx.recipe(name), str(batch), str(steps if steps is not None else st),
            str(threads or ctx.a.threads), str(warmup), vram, prec]


def torch_cmd(ctx, ref, name, mode, steps=None, batch=None, warmup=None, checkpoint=False, threads=None):
    b, st, w = steps_of(ctx, name)
    cmd = [ctx.refs[ref][1], os.path.abspath(__file__), "--child", "--model", name, "--mode", mode, "--threads",
           str(threads or ctx.a.threads), "--batch", str(batch or b), "--steps", str(steps if steps is not None else st),
           "--warmup", str(warmup if warmup is not None else w)]
    return cmd + (["--checkpoint"] if checkpoint else [])


def measure(ctx, name, runner, extra_env=None, threads=None):
    """One fresh-process measurement: dict with ips, step_ms, rss (and first_step_s), or error."""
    who, mode, _ = runner
    threads = threads or ctx.a.threads
    if who == "tt":
        env = dict(ctx.tt_env)
        env.update(extra_env or {})
        text, rc, rss = run_child(tt_cmd(ctx, name, mode, threads=threads), threads, env, ctx.a.child_timeout)
        m = re.search(r"median ([\d.]+) ms", text)
        if rc != 0 or not m:
            lines = [l for l in text.splitlines() if l.strip() and "OPENMP" not in l]
            return {"error": ("exit %d: %s" % (rc, lines[-1] if lines else "no output"))[:300], "rss": rss}
        f = re.search(r"model: ([\d.]+) GFLOP per image forward", text)
        if f:
            ctx.flops[name] = float(f.group(1)) * 1e9
        batch = steps_of(ctx, name)[0]
        ms = float(m.group(1))
        return {"ips": batch / (ms / 1e3), "step_ms": ms, "rss": rss}
    text, rc, rss = run_child(torch_cmd(ctx, who, name, mode, threads=threads), threads, extra_env, ctx.a.child_timeout)
    js = [l for l in text.splitlines() if l.startswith("{")]
    d = json.loads(js[-1]) if js else {}
    if rc != 0 or "images_per_s" not in d:
        why = d.get("error") or ("exit %d: %s" % (rc, (text.strip().splitlines() or ["no output"])[-1]))
        return {"error": why[:300], "rss": rss}
    return {"ips": d["images_per_s"], "step_ms": d["step_ms"], "rss": rss, "first_step_s": d.get("first_step_s"),
            "threads": d.get("threads")}


def load():
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def ips_s(v):
    """images/s, with 3 significant figures at least (ResNet-50 on 2 loaded cores runs below 1/s)."""
    return "%.1f" % v if v >= 100 else ("%.2f" % v if v >= 1 else "%.3f" % v)


def mib(b):
    return "%.0f MiB" % (b / 1048576.0)


def median_of(runs, key):
    v = [r[key] for r in runs if key in r and r[key] is not None]
    return statistics.median(v) if v else None


def runners_for(ctx, name):
    rs = [("tt", m, "tinytrain " + m) for m in ctx.a.tt_modes]
    if name == "resnet50" and "fp32" in ctx.a.tt_modes:
        rs.append(("tt", "fp32@1.2G", "tinytrain fp32 --vram 1.2G"))
    for i, (label, _, _) in enumerate(ctx.refs):
        rs += [(i, m, "%s %s" % (label, m)) for m in ctx.a.modes]
    return rs


def rotate(lst, r):
    k = r % len(lst) if lst else 0
    out = lst[k:] + lst[:k]
    return out[::-1] if r % 2 else out


# ------------------------------------------------------------------------- part: peak FLOP/s

def part_peak(ctx):
    a = ctx.a
    print("== peak: build/bench/bench_peak %d %d %.1f (a %dx%d oneDNN matmul, best call)" %
          (a.threads, a.peak_size, a.peak_seconds, a.peak_size, a.peak_size))
    if not os.path.exists(ctx.bench_peak):
        print("  %s not built (ninja bench): no peak, no share of it" % ctx.bench_peak)
        print()
        return
    text, rc, _ = run_child([ctx.bench_peak, str(a.threads), str(a.peak_size), str(a.peak_seconds)], a.threads)
    for line in text.splitlines():
        if "OPENMP" in line or line.startswith("  "):
            continue
        print("  " + line)
        m = re.match(r"peak (fp32|bf16): best ([\d.]+) GFLOP/s", line)
        if m:
            ctx.peak[m.group(1)] = float(m.group(2))
    if rc != 0:
        print("  bench_peak exited with %d" % rc)
    print()


def share(ctx, name, mode, ips):
    """achieved GFLOP/s and its share of the matching peak (or None)."""
    f = ctx.flops.get(name)
    if not f or not ips:
        return None, None
    g = 3.0 * f * ips / 1e9
    pk = ctx.peak.get("bf16" if mode in BF16_MODES else "fp32")
    return g, (g / pk if pk else None)


# ------------------------------------------------------------------------- part: speed

def part_speed(ctx):
    a = ctx.a
    print("== training speed: %d threads, median of %d rotating runs, a fresh process each" % (a.threads, a.runs))
    summary = []
    for name in a.nets:
        batch, steps, warmup = steps_of(ctx, name)
        print()
        print("-- %s, batch %d, %s, %d timed steps after %d warm-up (load average %s)" %
              (NETS[name][6], batch, "x".join(map(str, NETS[name][4])), steps, warmup, load()))
        runners = runners_for(ctx, name)
        res = {r: [] for r in runners}
        dead = set()
        for r in range(a.runs):
            for run in rotate(runners, r):
                if run in dead:
                    continue
                m = measure(ctx, name, run)
                res[run].append(m)
                if "error" in m:
                    dead.add(run)
                    print("  run %d %-40s unavailable: %s" % (r + 1, run[2], m["error"]))
                else:
                    if m.get("threads") and m["threads"] != a.threads:
                        print("  (%s ran with %s threads, not %d)" % (run[2], m["threads"], a.threads))
                    print("  run %d %-40s %9s images/s %9.1f ms %10s%s" %
                          (r + 1, run[2], ips_s(m["ips"]), m["step_ms"], mib(m["rss"]),
                           "  (first step %.1f s)" % m["first_step_s"] if m.get("first_step_s") and
                           run[1].startswith("compile") else ""))
                sys.stdout.flush()
        summary.append(speed_table(ctx, name, runners, res))
    print()
    print("== summary: tinytrain's best against each PyTorch's best (images/s; >1: tinytrain faster)")
    for line in summary:
        for l in line:
            print(l)
    print()
    return summary


def speed_table(ctx, name, runners, res):
    batch = steps_of(ctx, name)[0]
    med = {}
    print()
    f = ctx.flops.get(name)
    print("  %s: %s GFLOP per image forward (tinytrain's graph), a training step counted as 3x that" %
          (NETS[name][6], "%.4f" % (f / 1e9) if f else "?"))
    print("  %-40s %11s %10s %11s %9s %9s" % ("runner", "images/s", "step ms", "peak RSS", "GFLOP/s", "of peak"))
    for run in runners:
        runs = [m for m in res[run] if "error" not in m]
        if not runs:
            err = [m["error"] for m in res[run] if "error" in m]
            print("  %-40s unavailable: %s" % (run[2], err[0] if err else "not run"))
            continue
        ips, ms, rss = median_of(runs, "ips"), median_of(runs, "step_ms"), median_of(runs, "rss")
        med[run] = (ips, rss)
        g, s = share(ctx, name, run[1], ips)
        first = median_of(runs, "first_step_s") if run[1].startswith("compile") else None
        print("  %-40s %11s %10.1f %11s %9s %9s%s" % (run[2], ips_s(ips), ms, mib(rss), "%.1f" % g if g else "-",
                                                      "%.1f%%" % (100 * s) if s else "-",
                                                      "  compile: first step %.1f s" % first if first else ""))
    tts = [r for r in runners if r[0] == "tt" and r in med]
    lines = []
    for i, (label, _, _) in enumerate(ctx.refs):
        pts = [r for r in runners if r[0] == i and r in med]
        if not pts:
            continue
        print("  ratios, images/s of tinytrain / %s:" % label)
        print("  %-28s" % "" + "".join("%16s" % r[1] for r in pts))
        for t in tts:
            print("  %-28s" % t[2] + "".join("%15.2fx" % (med[t][0] / med[p][0]) for p in pts))
        best_t = max((r for r in tts if r[1] != "fp32@1.2G"), key=lambda r: med[r][0], default=None)
        best_p = max(pts, key=lambda r: med[r][0])
        if best_t:
            line = "  %-14s batch %4d: tinytrain best (%s, %s/s) / %s best (%s, %s/s) = %.2fx" % (
                name, batch, best_t[1], ips_s(med[best_t][0]), label, best_p[1], ips_s(med[best_p][0]),
                med[best_t][0] / med[best_p][0])
            print(line)
            lines.append(line)
        for tmode, pmode in (("fp32", "eager"), ("bf16", "bf16_cl")):
            t = [r for r in tts if r[1] == tmode]
            p = [r for r in pts if r[1] == pmode]
            if t and p:
                print("  peak RSS, tinytrain %s / %s %s (batch %d): %s / %s = %.2fx" % (
                    tmode, label, pmode, batch, mib(med[t[0]][1]), mib(med[p[0]][1]), med[t[0]][1] / med[p[0]][1]))
    return lines


# ------------------------------------------------------------------------- part: shared machine

# The fixed competing job of --load spin: pure-Python arithmetic on two fixed LOAD_N x LOAD_N
# matrices (one unit of work = one product, LOAD_N^3 multiply-adds, well under a millisecond), so
# a load process is CPU-bound, touches almost no memory, does the same work in every run and on
# every machine with the same Python, and can say how much of it it got done.
LOAD_N = 16


def load_child():
    """One load process (--load-child): multiplies fixed matrices until SIGTERM, then prints
    'LOADWORK units wall_s cpu_s' (cpu_s: the CPU time it got, so cpu_s / wall_s is its share of
    a core)."""
    import signal
    n = LOAD_N
    a = [[float((i * n + j) % 7 - 3) for j in range(n)] for i in range(n)]
    b = [[float((i + 2 * j) % 5 - 2) for j in range(n)] for i in range(n)]
    bt = [list(col) for col in zip(*b)]
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    units, t0, c0 = 0, time.perf_counter(), time.process_time()
    check = 0.0
    while not stop:  # the same product every unit (the values stay small and exact)
        c = [[sum(x * y for x, y in zip(row, col)) for col in bt] for row in a]
        check += c[units % n][units % n]
        units += 1
    print("LOADWORK %d %.6f %.6f %g" % (units, time.perf_counter() - t0, time.process_time() - c0, check))
    sys.stdout.flush()


class Load:
    """A fixed competing load: n busy processes, started before a measurement, stopped after it.
    After the with-block, rate is the load's work per second per process (units of load_child,
    the mean over the processes; None for --load copy or when a process said nothing) and cpu its
    mean share of a core, both over the load's whole life: the settling, the contender's start-up
    and its timed steps."""

    def __init__(self, ctx, name=None, runner=None, env=None, threads=None):
        self.ctx, self.name, self.runner, self.procs = ctx, name, runner, []
        self.env, self.threads = env or {}, threads or ctx.a.threads
        self.rate, self.cpu = None, None

    def __enter__(self):
        a = self.ctx.a
        ncpu = os.cpu_count() or 1
        for i in range(a.load_procs):
            out = subprocess.DEVNULL  # a copy of the training prints per step: nobody reads it
            if a.load == "spin" or self.runner is None:
                cmd, env = [sys.executable, os.path.abspath(__file__), "--load-child"], None
                out = subprocess.PIPE  # one line, at the end
            else:  # a copy of the same training, long enough to outlast the measurement
                who, mode, _ = self.runner
                if who == "tt":
                    cmd = tt_cmd(self.ctx, self.name, mode, steps=1000000, threads=self.threads)
                    e = dict(self.ctx.tt_env)
                    e.update(self.env)
                    env = child_env(self.threads, e)
                else:
                    cmd = torch_cmd(self.ctx, who, self.name, mode, steps=1000000, threads=self.threads)
                    env = child_env(self.threads, self.env)
            pre = None
            if a.load_pin:
                cpu = i % ncpu
                pre = lambda cpu=cpu: os.sched_setaffinity(0, {cpu})  # noqa: E731
            self.procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL, env=env,
                                               cwd=ROOT, preexec_fn=pre))
        time.sleep(a.load_settle)  # let the load start (a copy: past its start-up)
        return self

    def __exit__(self, *exc):
        rates, cpus = [], []
        for p in self.procs:
            if p.poll() is None:
                p.terminate()  # load_child reports its work on SIGTERM; a copy just ends
            try:
                out = p.communicate(timeout=10)[0]
            except subprocess.TimeoutExpired:
                p.kill()
                out = p.communicate()[0]
            m = re.search(rb"^LOADWORK (\d+) ([\d.]+) ([\d.]+)", out or b"", re.M)
            if m and float(m.group(2)) > 0:
                rates.append(int(m.group(1)) / float(m.group(2)))
                cpus.append(float(m.group(3)) / float(m.group(2)))
        if rates and len(rates) == len(self.procs):
            self.rate, self.cpu = statistics.mean(rates), statistics.mean(cpus)
        self.procs = []


def part_shared(ctx):
    a = ctx.a
    spin = a.load == "spin"
    print("== shared machine: each runner idle, then beside %d %s%s (--load %s), alternating, median of %d runs" %
          (a.load_procs, ("busy process%s doing fixed %dx%d matrix products in Python" %
                          ("es" if a.load_procs != 1 else "", LOAD_N, LOAD_N)) if spin else
           "cop%s of the same training" % ("ies" if a.load_procs != 1 else "y"),
           ", pinned to CPU i" if a.load_pin else ", not pinned", a.load, a.runs))
    print("   tinytrain as the command line runs it (%s), and beside it: libgomp's default spin "
          "(GOMP_SPINCOUNT=300000), OMP_WAIT_POLICY=passive, 1 thread" %
          (" ".join("%s=%s" % kv for kv in ctx.tt_env.items()) or "libgomp's default"))
    print("   (idle: without the added load; whatever else runs on the machine counts in both)")
    alone = None
    if spin:  # the load's own speed with nothing beside it: what the neighbours would get done
        with Load(ctx) as ld:
            time.sleep(a.load_alone)
        alone = ld.rate
        print("   the load alone: %s products/s per process, %s of a core each (%.1f s; load average %s)" %
              ("%.0f" % ld.rate if ld.rate else "?", "%.2f" % ld.cpu if ld.cpu is not None else "?",
               a.load_settle + a.load_alone, load()))
        print("   'load kept': the load's products/s beside the runner / alone (over the load's whole life: "
              "settling, the runner's start-up and its steps); what the runner left to its neighbours")
    rows = []
    for name in a.nets:
        print()
        print("-- %s, batch %d (load average %s)" % (NETS[name][6], steps_of(ctx, name)[0], load()))
        variants = []  # (runner, env, threads, label)
        for m in a.tt_modes:
            r = ("tt", m, "tinytrain " + m)
            variants.append((r, {}, None, r[2]))
            if m == "fp32" and a.wait_variants:
                variants.append((r, {"GOMP_SPINCOUNT": "300000", "OMP_WAIT_POLICY": None}, None, r[2] + " spin 300000"))
                variants.append((r, {"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": None}, None, r[2] + " passive"))
                if a.threads > 1:
                    variants.append((r, {}, 1, r[2] + " 1 thread"))
        for i, (label, _, _) in enumerate(ctx.refs):
            for m in a.shared_modes:
                variants.append(((i, m, "%s %s" % (label, m)), {}, None, "%s %s" % (label, m)))
        res = {v[3]: ([], [], [], []) for v in variants}  # idle ips, loaded ips, load kept, load average
        dead = set()
        for r in range(a.runs):
            for run, env, threads, label in rotate(variants, r):
                if label in dead:
                    continue
                idle = measure(ctx, name, run, env, threads)
                if "error" in idle:
                    dead.add(label)
                    print("  run %d %-40s unavailable: %s" % (r + 1, label, idle["error"]))
                    continue
                with Load(ctx, name, run, env, threads) as ld:
                    busy = measure(ctx, name, run, env, threads)
                    la = load()
                if "error" in busy:
                    print("  run %d %-40s under load failed: %s" % (r + 1, label, busy["error"]))
                    continue
                kept = ld.rate / alone if ld.rate and alone else None
                res[label][0].append(idle["ips"])
                res[label][1].append(busy["ips"])
                if kept is not None:
                    res[label][2].append(kept)
                res[label][3].append(float(la.split()[0]) if la != "?" else float("nan"))
                print("  run %d %-40s idle %9s images/s, under load %9s = %.2fx%s (load average %s)" %
                      (r + 1, label, ips_s(idle["ips"]), ips_s(busy["ips"]), busy["ips"] / idle["ips"],
                       ", load kept %.2f" % kept if kept is not None else "", la))
                sys.stdout.flush()
        print()
        print("  %s, batch %d: medians (load average at the end of the loaded runs: 1-minute figure)" %
              (NETS[name][6], steps_of(ctx, name)[0]))
        print("  %-40s %12s %12s %11s %10s %9s" % ("runner", "idle /s", "shared /s", "shared/idle", "load kept",
                                                  "load avg"))
        med = {}
        for _, _, _, label in variants:
            i, b, k, la = res[label]
            if not i or not b:
                continue
            mi, mb = statistics.median(i), statistics.median(b)
            med[label] = (mi, mb)
            print("  %-40s %12s %12s %10.2fx %10s %9.2f" % (label, ips_s(mi), ips_s(mb), mb / mi,
                                                          "%.2f" % statistics.median(k) if k else "-",
                                                          statistics.median(la)))
            rows.append((name, label, mi, mb))
        shared_ratios(ctx, name, variants, med)
    print()
    return rows


def shared_ratios(ctx, name, variants, med):
    """tinytrain's degradation (shared/idle) against each PyTorch mode's, and the images/s under load."""
    tts = [v[3] for v in variants if v[0][0] == "tt" and v[3] in med]
    for i, (label, _, _) in enumerate(ctx.refs):
        pts = [v for v in variants if v[0][0] == i and v[3] in med]
        if not tts or not pts:
            continue
        print("  degradation of tinytrain / degradation of %s ((shared/idle) / (shared/idle); >1: tinytrain "
              "suffers less):" % label)
        print("  %-32s" % "" + "".join("%16s" % v[0][1] for v in pts))
        for t in tts:
            dt = med[t][1] / med[t][0]
            print("  %-32s" % t + "".join("%15.2fx" % (dt / (med[v[3]][1] / med[v[3]][0])) for v in pts))
        best_p = max(pts, key=lambda v: med[v[3]][1])
        # tinytrain as shipped: its precisions with the command line's own wait setting (the
        # variants are in the tables above)
        plain = [v[3] for v in variants if v[0][0] == "tt" and v[3] in med and v[3] == v[0][2]]
        if not plain:
            continue
        best_t = max(plain, key=lambda t: med[t][1])
        print("  %-14s shared: tinytrain best (%s, %s/s, %.2fx of idle) / %s best (%s, %s/s, %.2fx of idle) = %.2fx" % (
            name, best_t[len("tinytrain "):], ips_s(med[best_t][1]), med[best_t][1] / med[best_t][0], label,
            best_p[0][1], ips_s(med[best_p[3]][1]), med[best_p[3]][1] / med[best_p[3]][0],
            med[best_t][1] / med[best_p[3]][1]))


# ------------------------------------------------------------------------- part: largest batch

def bisect_batch(fits, start=8, cap=None):
    """The largest batch that fits (0: not even 1): doubling from start, then halving the gap;
    with cap, no probe above cap (vit_vs_torch.py)."""
    lo, hi = 0, start
    while (cap is None or hi <= cap) and fits(hi):
        lo, hi = hi, hi * 2
    if cap is not None:
        hi = min(hi, cap + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def torch_max_batch(ctx, ref, mode, checkpoint, limit):
    """Largest ResNet-50 batch whose two-step training process stays under limit bytes."""
    probes = {}
    label = ctx.refs[ref][0]

    def fits(b):
        if b not in probes:
            text, rc, rss = run_child(torch_cmd(ctx, ref, "resnet50", mode, steps=1, batch=b, warmup=1,
                                                checkpoint=checkpoint), ctx.a.threads, None, ctx.a.child_timeout)
            ok = rc == 0 and rss < limit
            probes[b] = (ok, rss)
            print("    %s %s%s batch %4d: peak RSS %s%s" % (label, mode, " + checkpoint" if checkpoint else "", b, mib(rss),
                                                           "" if ok else ("  (over)" if rc == 0 else "  (failed, exit %d)" % rc)))
            sys.stdout.flush()
        return probes[b][0]

    lo = bisect_batch(fits)
    return lo, (probes[lo][1] if lo else 0)


def tt_plan_max_batch(ctx, vram, precision=None):
    """{(precision, recompute): (micro-batch, arena bytes)} from `tinytrain plan --max-batch --json`."""
    cmd = [ctx.tt, "plan", "--device", "cpu", "--vram", vram, "--max-batch", "--json"]
    if precision:
        cmd += ["--precision", precision]
    text, rc, _ = run_child(cmd + [ctx.recipe("resnet50")], ctx.a.threads)
    js = [l for l in text.splitlines() if l.startswith("{")]
    rows = {}
    if rc == 0 and js:
        for r in json.loads(js[-1]).get("max_batch", []):
            rows[(r["precision"], r["recompute"])] = (r["micro_batch"], r["arena_bytes"])
    return rows, text


def cli_recipe(ctx, batch):
    """ResNet-50 with synthetic data and batch = the micro-batch (one micro-step per step)."""
    with open(ctx.recipe("resnet50")) as f:
        text = f.read()
    text = re.sub(r"(?m)^batch = \d+", "batch = %d" % batch, text)
    path = os.path.join(ctx.tmp, "resnet50_b%d.recipe" % batch)
    with open(path, "w") as f:
        f.write(text)
    return path


def tt_cli_run(ctx, batch, vram, precision, steps):
    """`tinytrain train` for a few steps: (rc, peak RSS of the whole process, output)."""
    out = tempfile.mkdtemp(prefix="run_", dir=ctx.tmp)
    cmd = [ctx.tt, "train", "--device", "cpu", "--vram", vram, "--precision", precision, "--micro-batch", str(batch),
           "--max-steps", str(steps), "--threads", str(ctx.a.threads), "--out", out, cli_recipe(ctx, batch)]
    text, rc, rss = run_child(cmd, ctx.a.threads, None, ctx.a.child_timeout)
    shutil.rmtree(out, ignore_errors=True)
    return rc, rss, text


def part_max_batch(ctx, precision):
    """The largest ResNet-50 batch in --limit: tinytrain's plan, then its whole process trained at
    that batch; PyTorch's by bisection on its process's peak RSS."""
    a, limit = ctx.a, ctx.a.limit_bytes
    print("== largest ResNet-50 (3x224x224) batch in %s, %s, the whole process under %s" % (a.limit, precision, a.limit))
    tt_batch, tt_rss = None, None
    rows, text = tt_plan_max_batch(ctx, a.limit, precision)
    mine = {k: v for k, v in rows.items() if k[0] == precision}
    if not mine:
        why = [l for l in text.splitlines() if l.strip() and "OPENMP" not in l and not l.startswith("  ")]
        print("  tinytrain: %s not supported yet by this build (plan --max-batch --precision %s: %s)" %
              (precision, precision, why[-1][:300] if why else "no %s row" % precision))
    else:
        for (prec, rec), (mb, arena) in sorted(mine.items()):
            print("  tinytrain plan --vram %s --max-batch --precision %s: recompute %-4s -> micro-batch %4d (arena %s)" %
                  (a.limit, precision, rec, mb, mib(arena)))
        best = max(v[0] for v in mine.values())
        vram = a.limit
        for _ in range(3):
            rc, rss, out = tt_cli_run(ctx, best, vram, precision, a.max_batch_steps)
            print("  tinytrain train --vram %s --precision %s --micro-batch %d --max-steps %d (synthetic data): %s" %
                  (vram, precision, best, a.max_batch_steps, "process peak RSS %s" % mib(rss) if rc == 0 else
                   "FAILED (exit %d): %s" % (rc, out.strip()[-400:])))
            if rc != 0:
                break
            if rss < limit:
                tt_batch, tt_rss = best, rss
                break
            # the process beyond its arena (libraries, loader, its own heap): plan the arena that
            # much smaller and run again
            arena = max(v[1] for v in mine.values() if v[0] == best)
            vb = int((limit - (rss - arena)) / 1048576)
            if vb <= 0:
                break
            vram = "%dM" % vb
            rows, _ = tt_plan_max_batch(ctx, vram, precision)
            mine = {k: v for k, v in rows.items() if k[0] == precision}
            if not mine:
                break
            best = max(v[0] for v in mine.values())
            print("  over %s: --vram %s plans micro-batch %d" % (a.limit, vram, best))
    pt = []
    cases = [("eager", False), ("eager", True)] if precision == "fp32" else [("bf16_cl", False)]
    for i, (label, _, _) in enumerate(ctx.refs):
        for mode, ck in cases:
            b, rss = torch_max_batch(ctx, i, mode, ck, limit)
            what = "%s %s%s" % (label, mode, " + utils.checkpoint" if ck else "")
            pt.append((what, b))
            print("  %s: batch %d (peak RSS %s)" % (what, b, mib(rss)))
    if tt_batch:
        print("  tinytrain %s: batch %d (process peak RSS %s)" % (precision, tt_batch, mib(tt_rss)))
        for what, b in pt:
            print("  tinytrain %s / %s: %d / %d = %.2fx%s" % (precision, what, tt_batch, b, tt_batch / max(b, 1),
                                                           " (goal: 3x)" if precision == "bf16" else ""))
    print()


# ------------------------------------------------------------------------- main

def probe_refs(ctx):
    seen = set()
    for py in ctx.a.python or [sys.executable, "/usr/bin/python3"]:
        key = os.path.realpath(py) if os.path.exists(py) else py
        if key in seen:
            continue
        seen.add(key)
        if not os.path.exists(py):
            print("pytorch:   %s: not found, skipped" % py)
            continue
        p = subprocess.run([py, os.path.abspath(__file__), "--info"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           cwd=ROOT, env=child_env(ctx.a.threads))
        js = [l for l in p.stdout.decode("utf-8", "replace").splitlines() if l.startswith("{")]
        if p.returncode != 0 or not js:
            tail = p.stdout.decode("utf-8", "replace").strip().splitlines()
            print("pytorch:   %s: no PyTorch (%s), skipped%s" % (
                py, tail[-1][:120] if tail else "?",
                "; Debian's: apt-get install python3-torch python3-torchvision" if py == "/usr/bin/python3" else ""))
            continue
        info = json.loads(js[-1])
        label = "pytorch %s" % info["torch"]
        if any(r[0] == label for r in ctx.refs):
            label += " (%s)" % py
        ctx.refs.append((label, py, info))
        print("pytorch:   %s: torch %s, torchvision %s, oneDNN %s, %s threading, torch.compile %s (%s)" % (
            py, info["torch"], info["torchvision"], info["onednn"], info["parallel"],
            "yes" if info["compile"] else "no", os.path.dirname(info["file"])))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", action="append", help="a Python with PyTorch (repeat for more; the first is the reference; "
                    "default: this Python and /usr/bin/python3)")
    ap.add_argument("--build", default="build", help="the build directory (default build; tinytrain at the root)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, help="runs per runner (default 3)")
    ap.add_argument("--nets", default="small_cnn,small_resnet,resnet50")
    ap.add_argument("--modes", default=",".join(TORCH_MODES), help="PyTorch modes")
    ap.add_argument("--tt-modes", default=",".join(TT_MODES), help="tinytrain precisions")
    ap.add_argument("--steps", type=int, help="timed steps per run (default: per network)")
    ap.add_argument("--warmup", type=int, help="warm-up steps per run (default: per network)")
    ap.add_argument("--quick", action="store_true", help="1 run, 2 steps, 1 warm-up, short peak: checks the script")
    ap.add_argument("--skip-speed", action="store_true", help="no speed part")
    ap.add_argument("--skip-max-batch", action="store_true", help=argparse.SUPPRESS)  # the default now; kept for old commands
    ap.add_argument("--no-peak", action="store_true", help="no peak FLOP/s")
    ap.add_argument("--peak-size", type=int, help="bench_peak's matrix size (default 2048)")
    ap.add_argument("--peak-seconds", type=float, help="bench_peak's seconds per type (default 2)")
    ap.add_argument("--shared", action="store_true", help="also the runs beside a competing load")
    ap.add_argument("--load", choices=["spin", "copy"], default="spin")
    ap.add_argument("--load-procs", type=int, default=2)
    ap.add_argument("--load-pin", action="store_true")
    ap.add_argument("--load-settle", type=float, help="seconds between starting the load and measuring (default 1)")
    ap.add_argument("--load-alone", type=float, help="seconds the load runs alone, for its own rate (default 2)")
    ap.add_argument("--shared-modes", default="eager,channels_last,bf16_cl", help="PyTorch modes under load")
    ap.add_argument("--no-wait-variants", dest="wait_variants", action="store_false",
                    help="under load, tinytrain only as the command line runs it (not also with spin 300000, "
                    "passive, 1 thread)")
    ap.add_argument("--load-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--max-batch", action="store_true", help="the largest ResNet-50 fp32 batch in --limit")
    ap.add_argument("--max-batch-bf16", action="store_true", help="the largest ResNet-50 bf16 batch in --limit")
    ap.add_argument("--max-batch-steps", type=int, help="steps of the largest-batch training run (default 3)")
    ap.add_argument("--limit", default="4G", help="memory limit of the largest-batch parts (default 4G)")
    ap.add_argument("--child-timeout", type=float, default=3600.0)
    ap.add_argument("--info", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.info:
        torch_info()
        return
    if a.load_child:
        load_child()
        return
    try:  # a line at a time, also into a pipe or file (| tee): the run takes long
        sys.stdout.reconfigure(line_buffering=True)
    except AttributeError:
        pass
    if a.child:
        torch_child(a)
        return
    quick = {"runs": 1, "steps": 2, "warmup": 1, "peak_seconds": 0.2, "peak_size": 1024, "max_batch_steps": 1,
             "load_settle": 0.2, "load_alone": 0.3}
    usual = {"runs": 3, "steps": None, "warmup": None, "peak_seconds": 2.0, "peak_size": 2048, "max_batch_steps": 3,
             "load_settle": 1.0, "load_alone": 2.0}
    for k, v in (quick if a.quick else usual).items():  # what was given wins
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.nets = [n for n in a.nets.split(",") if n]
    a.modes = [m for m in a.modes.split(",") if m]
    a.tt_modes = [m for m in a.tt_modes.split(",") if m]
    a.shared_modes = [m for m in a.shared_modes.split(",") if m]
    for n in a.nets:
        if n not in NETS:
            sys.exit("cpu_vs_torch.py: unknown network %s (%s)" % (n, ", ".join(NETS)))
    for m in a.modes + a.shared_modes:
        if m not in TORCH_MODES:
            sys.exit("cpu_vs_torch.py: unknown PyTorch mode %s (%s)" % (m, ", ".join(TORCH_MODES)))
    for m in a.tt_modes:
        if m not in TT_MODES:
            sys.exit("cpu_vs_torch.py: unknown tinytrain precision %s (%s)" % (m, ", ".join(TT_MODES)))
    m = re.fullmatch(r"([\d.]+)([KMG])", a.limit)
    if not m:
        sys.exit("cpu_vs_torch.py: --limit takes a size like 4G or 1500M")
    a.limit_bytes = int(float(m.group(1)) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)])
    ctx = Ctx(a)
    for exe in (ctx.bench_step, ctx.tt):
        if not os.path.exists(exe):
            sys.exit("%s not built: run ninja (ninja bench tinytrain)" % exe)
    info = subprocess.run([ctx.tt, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          cwd=ROOT).stdout.decode().strip()
    for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):  # run bench_step as the command line runs
        mm = re.search(r"\b%s=(\S+)" % k, info)
        if mm and mm.group(1) != "unset":
            ctx.tt_env[k] = mm.group(1)
    print("tinytrain: %s" % "; ".join(l for l in info.splitlines() if "OPENMP" not in l and not l.startswith("  ")))
    print("           bench_step runs with %s" % (" ".join("%s=%s" % kv for kv in ctx.tt_env.items()) or
                                                  "libgomp's default waits"))
    probe_refs(ctx)
    if not ctx.refs:
        print("pytorch:   none found: tinytrain alone (give --python PATH of a Python with torch and torchvision)")
    print("cpu:       %s, %d logical cores (this process may use %d); %d threads per run; load average at start %s" % (
        cpu_name(), os.cpu_count() or 0, len(os.sched_getaffinity(0)), a.threads, load()))
    print("python:    %s %s (the parent: no torch)" % (sys.executable, sys.version.split()[0]))
    print()
    t0 = time.time()
    try:
        if not a.no_peak:
            part_peak(ctx)
        if not a.skip_speed:
            part_speed(ctx)
        if a.shared:
            part_shared(ctx)
        if a.max_batch:
            part_max_batch(ctx, "fp32")
        if a.max_batch_bf16:
            part_max_batch(ctx, "bf16")
    finally:
        shutil.rmtree(ctx.tmp, ignore_errors=True)
    print("load average at end %s; %.0f s" % (load(), time.time() - t0))


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


if __name__ == "__main__":
    main()
