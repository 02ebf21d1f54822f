#!/usr/bin/env python3
"""tinytrain's CPU backend against PyTorch on the same CPU: speed, memory, largest batch.

    apt-get install -y python3-torch python3-torchvision     # Debian's PyTorch, the reference
    ninja build/bench/bench_step tinytrain
    /usr/bin/python3 tests/bench/cpu_vs_torch.py [--threads 2] [--runs 3] [--quick] [--skip-max-batch]

Part 1, training speed and memory. For each network the same model, batch, thread count and
synthetic data (a fixed random batch) in both: LeNet (examples/fashion_mnist/lenet.recipe,
batch 128), the fashion ResNet (examples/fashion_mnist/resnet.recipe, batch 128) and ResNet-50
(examples/imagenet/resnet50.recipe = torchvision's resnet50, 3x224x224, batch 16, a few
steps; and once more with tinytrain's scheduler recomputing what it must to fit a 1.2 GiB
arena, as `tinytrain --vram 1.2G` would). Each measurement is a fresh process: tinytrain's build/bench/bench_step (one training
step = micro-step + SGD update, fp32, its default oneDNN CPU backend) and a PyTorch child
(forward, cross-entropy, backward, SGD step); images/s from the median step time after a
warm-up. The two alternate, --runs times each, and the table shows the medians and the peak
resident memory of each process (its VmHWM: everything the process touched, interpreter and
libraries included).

Part 2, the largest ResNet-50 (224x224) batch in 4 GiB. tinytrain: `tinytrain plan --device
cpu --vram 4G --max-batch` (on the CPU the whole --vram budget is the arena); then a real
training run at that batch (build/bench/bench_step under --vram 4G, the scheduler recomputing
what it must) whose peak resident memory is printed beside it, and when the process as a whole
is over 4 GiB, the largest batch whose process stays under it. PyTorch: the largest batch
whose process peak resident memory stays under 4 GiB over two training steps, found by
doubling then bisecting with a fresh process per probe, fp32 plain and with
torch.utils.checkpoint (checkpoint_sequential over the network's 20 stages, sqrt segments).

A benchmark: it prints numbers, never passes or fails. Load on the machine changes them: the
load averages are printed at the start and the end.
"""
import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GIB = 1 << 30

NETS = {  # name: (recipe, batch, timed steps, warm-up steps, input shape, classes)
    "lenet": ("examples/fashion_mnist/lenet.recipe", 128, 40, 5, (1, 28, 28), 10),
    "fashion_resnet": ("examples/fashion_mnist/resnet.recipe", 128, 15, 3, (1, 28, 28), 10),
    "resnet50": ("examples/imagenet/resnet50.recipe", 16, 4, 2, (3, 224, 224), 1000),
}
# The rows of part 1: (label, network, tinytrain --vram for bench_step or None). The ResNet-50
# row with a budget has tinytrain's scheduler recompute what it must to fit a 1.2 GiB arena,
# against the same plain PyTorch run: the speed that memory costs.
ROWS = [("lenet", "lenet", None), ("fashion_resnet", "fashion_resnet", None), ("resnet50", "resnet50", None),
        ("resnet50 @1.2G", "resnet50", "1.2G")]


# --------------------------------------------------------------------------- PyTorch side

def torch_model(name):
    import torch.nn as nn
    if name == "lenet":
        return nn.Sequential(
            nn.Conv2d(1, 32, 5, padding=2, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 7 * 7, 256), nn.ReLU(inplace=True), nn.Dropout(0.3), nn.Linear(256, 10))
    if name == "fashion_resnet":
        from torchvision.models.resnet import BasicBlock

        def down(cin, c):
            return BasicBlock(cin, c, stride=2, downsample=nn.Sequential(nn.Conv2d(cin, c, 1, stride=2, bias=False),
                                                                           nn.BatchNorm2d(c)))
        return nn.Sequential(
            nn.Conv2d(1, 24, 3, padding=1, bias=False), nn.BatchNorm2d(24), nn.ReLU(inplace=True),
            BasicBlock(24, 24), BasicBlock(24, 24), down(24, 48), BasicBlock(48, 48), down(48, 96), BasicBlock(96, 96),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(96, 10))
    if name == "resnet50":
        import torchvision
        return torchvision.models.resnet50(num_classes=1000)
    raise ValueError(name)


def torch_optimizer(name, params):
    import torch
    if name == "lenet":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4), 0.0
    if name == "fashion_resnet":
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


def torch_child(a):
    """One PyTorch measurement in this (fresh) process; prints a JSON line."""
    import torch
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    _, batch, steps, warmup, shape, classes = NETS[a.model]
    batch = a.batch or batch
    steps = a.steps if a.steps is not None else steps
    warmup = a.warmup if a.warmup is not None else warmup
    net = torch_model(a.model)
    net.train()
    forward = net
    if a.checkpoint:
        from torch.utils.checkpoint import checkpoint_sequential
        seq = resnet50_stages(net)
        segments = max(1, int(round(math.sqrt(len(seq)))))
        forward = lambda x: checkpoint_sequential(seq, segments, x)  # noqa: E731
    opt, smoothing = torch_optimizer(a.model, net.parameters())
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=smoothing)
    x = torch.randn(batch, *shape, requires_grad=bool(a.checkpoint))
    y = torch.randint(0, classes, (batch,))
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(forward(x), y)
        loss.backward()
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times) if times else float("nan")
    print(json.dumps({"images_per_s": batch / med if times else 0.0, "step_ms": 1e3 * med if times else 0.0,
                      "torch": torch.__version__}))
    print("VmHWM %d" % vm_hwm(os.getpid()))
    sys.stdout.flush()


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


def run_child(cmd, env_threads):
    """Runs cmd in a fresh process; returns (output, return code, peak resident bytes).

    The peak is the child's own high-water mark (VmHWM), read every 20 ms until it exits: it
    only grows, so the last reading holds the peak of everything before it. (getrusage of a
    child would not do: Linux counts in it the resident set of the process it was forked
    from, this Python, up to the exec.)"""
    env = dict(os.environ, OMP_NUM_THREADS=str(env_threads))
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        peak = 0
        while p.poll() is None:
            peak = max(peak, vm_hwm(p.pid))
            time.sleep(0.02)
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
    m = re.search(r"^VmHWM (\d+)$", text, re.M)  # the child's own last word, when it gives one
    if m:
        peak = max(peak, int(m.group(1)))
    return text, p.returncode, peak


def tinytrain_speed(name, threads, vram=None):
    recipe, batch, steps, warmup, _, _ = NETS[name]
    text, rc, rss = run_child([os.path.join(ROOT, "build/bench/bench_step"), recipe, str(batch), str(steps), str(threads),
                               str(warmup)] + ([vram] if vram else []), threads)
    m = re.search(r"median ([\d.]+) ms", text)
    if rc != 0 or not m:
        raise RuntimeError("bench_step failed:\n" + text)
    return batch / (float(m.group(1)) / 1e3), rss


def torch_speed(name, threads, batch=None, steps=None, warmup=None, checkpoint=False):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--model", name, "--threads", str(threads)]
    if batch:
        cmd += ["--batch", str(batch)]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    if warmup is not None:
        cmd += ["--warmup", str(warmup)]
    if checkpoint:
        cmd += ["--checkpoint"]
    text, rc, rss = run_child(cmd, threads)
    line = [l for l in text.splitlines() if l.startswith("{")]
    if rc != 0 or not line:
        return None, rss, text
    return json.loads(line[-1]), rss, text


def load():
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def mib(b):
    return "%.0f MiB" % (b / 1048576.0)


def part_speed(a):
    print("== training speed and peak resident memory: %d threads, median of %d alternating runs, fresh processes" %
          (a.threads, a.runs))
    results = []
    torch_runs = {}  # one set of PyTorch runs per network, shared by its rows
    for label, name, vram in ROWS:
        tt, tt_rss = [], []
        pt, pt_rss = torch_runs.setdefault(name, ([], []))
        fresh_torch = not pt
        for r in range(a.runs):
            order = ("tt", "pt") if r % 2 == 0 else ("pt", "tt")
            for who in order:
                if who == "tt":
                    ips, rss = tinytrain_speed(name, a.threads, vram)
                    tt.append(ips), tt_rss.append(rss)
                elif fresh_torch:
                    res, rss, text = torch_speed(name, a.threads)
                    if res is None:
                        raise RuntimeError("PyTorch child failed:\n" + text)
                    pt.append(res["images_per_s"]), pt_rss.append(rss)
            print("  %-15s run %d: tinytrain %8.1f images/s %9s | pytorch %8.1f images/s %9s" %
                  (label, r + 1, tt[-1], mib(tt_rss[-1]), pt[r], mib(pt_rss[r])))
            sys.stdout.flush()
        results.append((label, name, statistics.median(tt), statistics.median(pt), statistics.median(tt_rss),
                        statistics.median(pt_rss)))
    print()
    print("  %-15s %6s %12s %12s %7s %14s %14s %7s" % ("network", "batch", "tinytrain/s", "pytorch/s", "ratio",
                                                      "tinytrain RSS", "pytorch RSS", "ratio"))
    for label, name, tt, pt, tr, pr in results:
        print("  %-15s %6d %12.1f %12.1f %6.2fx %14s %14s %6.2fx" % (label, NETS[name][1], tt, pt, tt / pt, mib(tr), mib(pr),
                                                                     tr / pr))
    print("  (images/s: tinytrain / pytorch, higher is better; RSS: tinytrain / pytorch, lower is better;")
    print("   \"@1.2G\": tinytrain's scheduler recomputes what it must for a 1.2 GiB arena, PyTorch as above)")
    print()


def torch_max_batch(threads, checkpoint, limit=4 * GIB):
    """Largest ResNet-50 batch whose two-step training process stays under limit bytes."""
    probes = {}

    def fits(b):
        if b not in probes:
            res, rss, _ = torch_speed("resnet50", threads, batch=b, steps=1, warmup=1, checkpoint=checkpoint)
            probes[b] = (res is not None and rss < limit, rss)
            print("    pytorch%s batch %4d: peak RSS %s%s" % (" + checkpoint" if checkpoint else "", b, mib(rss),
                                                            "" if probes[b][0] else "  (over)"))
            sys.stdout.flush()
        return probes[b][0]

    lo, hi = 0, 8
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo, (probes[lo][1] if lo else 0)


def tinytrain_max_batch(threads, vram="4G"):
    text, rc, _ = run_child([os.path.join(ROOT, "tinytrain"), "plan", "--device", "cpu", "--vram", vram, "--max-batch",
                             NETS["resnet50"][0]], threads)
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\s*(fp32|fp16)\s+(none|auto|all)\s+(\d+)\s+([\d.]+)", line)
        if m:
            rows[(m.group(1), m.group(2))] = (int(m.group(3)), float(m.group(4)))
    if rc != 0 or not rows:
        raise RuntimeError("tinytrain plan --max-batch failed:\n" + text)
    return rows


def tinytrain_run_rss(batch, threads, vram):
    """Peak RSS of tinytrain's training step on ResNet-50 at micro-batch `batch` under --vram
    (the scheduler recomputes what it must), 2 steps of bench_step: the training loop alone, as
    the PyTorch children are (no data loader, no checkpoint writing)."""
    with open(os.path.join(ROOT, NETS["resnet50"][0])) as f:
        text = f.read()
    text = re.sub(r"(?m)^batch = \d+", "batch = %d" % batch, text)  # the micro-batch must divide it
    text = re.sub(r"(?ms)^\[data\].*?(?=^\[block)", "", text)
    d = tempfile.mkdtemp(prefix="tt_maxb_")
    path = os.path.join(d, "resnet50_b%d.recipe" % batch)
    with open(path, "w") as f:
        f.write(text)
    out, rc, rss = run_child([os.path.join(ROOT, "build/bench/bench_step"), path, str(batch), "1", str(threads), "1", vram],
                             threads)
    m = re.search(r"arena ([\d.]+) MiB", out)
    return (rss, float(m.group(1))) if rc == 0 and m else (None, None), out


def part_max_batch(a):
    print("== largest ResNet-50 (3x224x224, fp32) batch in 4 GiB")
    rows = tinytrain_max_batch(a.threads)
    for (prec, rec), (mb, arena) in sorted(rows.items()):
        if prec == "fp32":
            print("  tinytrain plan --device cpu --vram 4G --max-batch: fp32, recompute %-4s -> micro-batch %4d (arena %.0f MiB)"
                  % (rec, mb, arena))
    tt_best = max(rows[("fp32", r)][0] for r in ("none", "auto", "all") if ("fp32", r) in rows)
    tt_fair = tt_best
    if not a.skip_run:
        (rss, arena), out = tinytrain_run_rss(tt_best, a.threads, "4G")
        if rss is None:
            print("  tinytrain training at micro-batch %d: FAILED\n%s" % (tt_best, out[-2000:]))
        else:
            print("  tinytrain training at micro-batch %d under --vram 4G: arena %.0f MiB, process peak RSS %s" %
                  (tt_best, arena, mib(rss)))
            if rss >= 4 * GIB:  # the process beyond its arena: plan the arena that much smaller
                over = rss - arena * 1048576
                vram = "%dM" % int((4 * GIB - over) / 1048576)
                rows2 = tinytrain_max_batch(a.threads, vram)
                tt_fair = max(rows2[("fp32", r)][0] for r in ("none", "auto", "all") if ("fp32", r) in rows2)
                (rss2, arena2), out = tinytrain_run_rss(tt_fair, a.threads, vram)
                print("  whole process under 4 GiB: --vram %s -> micro-batch %d: arena %.0f MiB, process peak RSS %s" %
                      (vram, tt_fair, arena2 or 0, mib(rss2 or 0)))
    pt_plain, pt_plain_rss = torch_max_batch(a.threads, False)
    pt_ckpt, pt_ckpt_rss = torch_max_batch(a.threads, True)
    print("  pytorch fp32 plain:              batch %4d (peak RSS %s)" % (pt_plain, mib(pt_plain_rss)))
    print("  pytorch fp32 + utils.checkpoint: batch %4d (peak RSS %s)" % (pt_ckpt, mib(pt_ckpt_rss)))
    print("  tinytrain fp32 (arena in 4 GiB): batch %4d = %.2fx pytorch plain, %.2fx pytorch checkpointed" %
          (tt_best, tt_best / max(pt_plain, 1), tt_best / max(pt_ckpt, 1)))
    if tt_fair != tt_best:
        print("  tinytrain fp32 (process in 4 GiB): batch %4d = %.2fx pytorch plain, %.2fx pytorch checkpointed" %
              (tt_fair, tt_fair / max(pt_plain, 1), tt_fair / max(pt_ckpt, 1)))
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--skip-max-batch", action="store_true", help="only part 1")
    ap.add_argument("--skip-speed", action="store_true", help="only part 2")
    ap.add_argument("--skip-run", action="store_true", help="part 2 without the tinytrain run at its largest batch")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        torch_child(a)
        return
    # the parent stays small (no torch here): children are measured on their own
    probe = subprocess.run([sys.executable, "-c", "import torch, torchvision; print(torch.__version__, torch.__file__)"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if probe.returncode != 0:
        print("PyTorch not installed: apt-get install -y python3-torch python3-torchvision; run with /usr/bin/python3")
        return
    for exe in ("build/bench/bench_step", "tinytrain"):
        if not os.path.exists(os.path.join(ROOT, exe)):
            print("%s not built: run ninja build/bench/bench_step tinytrain" % exe)
            return
    info = subprocess.run([os.path.join(ROOT, "tinytrain"), "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          cwd=ROOT).stdout.decode().strip().replace("\n", "; ")
    print("tinytrain: %s" % info)
    print("pytorch:   %s" % probe.stdout.decode().strip())
    print("cpu:       %s, %d logical cores; load average at start %s" % (cpu_name(), os.cpu_count() or 0, load()))
    print()
    t0 = time.time()
    if not a.skip_speed:
        part_speed(a)
    if not a.skip_max_batch:
        part_max_batch(a)
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
