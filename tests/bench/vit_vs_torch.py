#!/usr/bin/env python3
"""Vision Transformers on the CPU: tinytrain beside PyTorch (issue 24's numbers).

    ninja build/bench/bench_step tinytrain     # (or --build DIR for another build directory)
    /work/venv-torch/bin/python tests/bench/vit_vs_torch.py [--threads 2] [--runs 3]
        [--skip-speed] [--skip-max-batch] [--skip-run] [--quick]

Run it with the Python whose PyTorch is compared (the newest release in a virtual environment:
the report prints its version); the parent process never imports torch, every measurement is a
fresh child process.

Part 1, the small ViT: training images/s on --threads threads and the peak resident memory of
each process, same model, batch, thread count and synthetic data (a fixed random batch). The
model is examples/fashion_mnist/vit.recipe's (1x28x28, 4x4 patches: 49 tokens and a class
token, width 64, 4 pre-norm blocks of 4 heads and MLP 128, exact GELU, LayerNorm eps 1e-6, no
dropout, label smoothing 0.1), written out by this script as a recipe without [data]; PyTorch's
is torchvision.models.VisionTransformer of the same sizes with a 1-channel patch convolution (the
script checks that both count the same parameters). Both train with SGD (lr 0.01, momentum 0.9,
Nesterov), as tinytrain's build/bench/bench_step does (one step = micro-step + update, fp32,
oneDNN backend); an optimizer's update is a small share of a step on either side. PyTorch runs
twice, fp32 eager and eager under torch.autocast("cpu", dtype=torch.bfloat16), and its better
(faster) setting is the one the ratio is taken against. images/s is from the median step time
after a warm-up; the two sides alternate, --runs times each; the tables show the medians.

Part 2, ViT-B/16 at 224x224 (examples/imagenet/vit_b16.recipe = torchvision's vit_b_16, AdamW as
the recipe says): the largest training batch in 4 GiB. tinytrain: `tinytrain plan --device cpu
--vram 4G --max-batch` (on the CPU the budget is the arena); then (unless --skip-run) two
training steps at that micro-batch under --vram 4G (build/bench/bench_step: the scheduler
recomputes what it must), whose whole process peak resident memory is printed, and when it is
over 4 GiB the largest micro-batch whose whole process stays under it. PyTorch: the largest batch whose process peak resident
memory stays under 4 GiB over two AdamW training steps (the optimizer state exists after the
first), found by doubling then bisecting with a fresh process per probe (a probe is stopped as
soon as it passes 4 GiB), fp32 plain and with torch.utils.checkpoint around each of the 12
encoder blocks (what timm's set_grad_checkpointing does; use_reentrant=False).

A benchmark: it prints numbers and ratios, never passes or fails, and is not run by `ninja
test`. Load on the machine changes the numbers: the load averages are printed at the start and
the end. --quick runs everything with tiny counts (1 run, 2 steps, probes capped at batch 2) to
check that the script works, not to measure.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_vs_torch import bisect_batch, cpu_name, load, mib, vm_hwm  # noqa: E402  (the same helpers)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GIB = 1 << 30

# The small ViT of examples/fashion_mnist/vit.recipe (issue 24, part 4).
SMALL = dict(c=1, img=28, patch=4, dim=64, depth=4, heads=4, mlp=128, classes=10, eps=1e-6, smoothing=0.1)
SMALL_BATCH, SMALL_STEPS, SMALL_WARMUP = 128, 30, 5
VIT_B16 = "examples/imagenet/vit_b16.recipe"
SGD = dict(lr=0.01, momentum=0.9, nesterov=True)     # build/bench/bench_step's optimizer


def small_recipe(path):
    """The small ViT as a recipe without [data] (bench_step feeds synthetic batches)."""
    s = SMALL
    text = """# written by tests/bench/vit_vs_torch.py: the small ViT of examples/fashion_mnist/vit.recipe
[net]
input = {c}x{img}x{img}
classes = {classes}

[train]
batch = {batch}
optimizer = sgd
lr = {lr}
momentum = {momentum}
nesterov = true
label_smoothing = {smoothing}

[block encoder_layer]
[layernorm ln_1]
eps = {eps}
[attention self_attention]
heads = {heads}
[add]
from = self_attention, in
[layernorm ln_2]
eps = {eps}
[linear mlp.0]
out = {mlp}
[gelu mlp.1]
[linear mlp.3]
out = {dim}
[add]
from = mlp.3, add1
[end]

[patch_embed embed]
size = {patch}
dim = {dim}
[encoder_layer encoder.layers]
repeat = {depth}
[layernorm encoder.ln]
eps = {eps}
[token]
mode = class
[linear heads.head]
out = {classes}
""".format(batch=SMALL_BATCH, **dict(s, **SGD))
    with open(path, "w") as f:
        f.write(text)


# --------------------------------------------------------------------------- PyTorch side

def torch_small_vit(torch):
    import torchvision
    s = SMALL
    m = torchvision.models.VisionTransformer(image_size=s["img"], patch_size=s["patch"], num_layers=s["depth"],
                                             num_heads=s["heads"], hidden_dim=s["dim"], mlp_dim=s["mlp"],
                                             num_classes=s["classes"])
    m.conv_proj = torch.nn.Conv2d(s["c"], s["dim"], s["patch"], s["patch"])   # torchvision's is 3-channel
    return m


def torch_child(a):
    """One PyTorch measurement in this fresh process; prints a JSON line, then VmHWM."""
    import torch
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    if a.model == "small":
        net = torch_small_vit(torch)
        shape, classes = (SMALL["c"], SMALL["img"], SMALL["img"]), SMALL["classes"]
        opt = torch.optim.SGD(net.parameters(), **SGD)
        smoothing = SMALL["smoothing"]
    else:  # vit_b16: AdamW as examples/imagenet/vit_b16.recipe (decay on weight matrices only)
        import torchvision
        net = torchvision.models.vit_b_16()
        shape, classes = (3, 224, 224), 1000
        # weight matrices (conv_proj, attention projections, MLP, head) decay; biases, layer norms,
        # the class token [1, 1, 768] and the position embedding [1, 197, 768] do not
        mats = lambda n, p: p.ndim >= 2 and n not in ("class_token", "encoder.pos_embedding")  # noqa: E731
        decay = [p for n, p in net.named_parameters() if mats(n, p)]
        rest = [p for n, p in net.named_parameters() if not mats(n, p)]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.3}, {"params": rest, "weight_decay": 0.0}], lr=0.003)
        smoothing = 0.11
    net.train()
    nparams = sum(p.numel() for p in net.parameters())
    forward = net
    if a.checkpoint:
        from torch.utils.checkpoint import checkpoint
        enc = net.encoder

        def forward(x):  # torchvision's forward with each encoder block checkpointed
            x = net._process_input(x)
            x = torch.cat([net.class_token.expand(x.shape[0], -1, -1), x], dim=1)
            x = enc.dropout(x + enc.pos_embedding)
            for blk in enc.layers:
                x = checkpoint(blk, x, use_reentrant=False)
            return net.heads(enc.ln(x)[:, 0])
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=smoothing)
    x = torch.randn(a.batch, *shape)
    y = torch.randint(0, classes, (a.batch,))
    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            loss = loss_fn(forward(x), y)
        loss.backward()
        opt.step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times) if times else float("nan")
    print(json.dumps({"images_per_s": a.batch / med if times else 0.0, "step_ms": 1e3 * med if times else 0.0,
                      "params": nparams, "torch": torch.__version__, "loss": float(loss.detach())}))
    print("VmHWM %d" % vm_hwm(os.getpid()))
    sys.stdout.flush()


# ------------------------------------------------------------------------- measurement

def run_child(cmd, threads, kill_above=None):
    """Runs cmd in a fresh process; returns (output, return code, peak resident bytes, killed).

    The peak is the child's own high-water mark (VmHWM), read every 20 ms until it exits (it only
    grows; getrusage of a child would count this parent's resident set from before the exec).
    kill_above: stop the child once its peak passes that many bytes (it does not fit anyway)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    killed = False
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        peak = 0
        while p.poll() is None:
            peak = max(peak, vm_hwm(p.pid))
            if kill_above and peak > kill_above and not killed:
                p.kill()
                killed = True
            time.sleep(0.02)
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
    m = re.search(r"^VmHWM (\d+)$", text, re.M)
    if m:
        peak = max(peak, int(m.group(1)))
    return text, p.returncode, peak, killed


def torch_run(a, model, batch, steps, warmup, bf16=False, checkpoint=False, kill_above=None):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--model", model, "--threads", str(a.threads),
           "--batch", str(batch), "--steps", str(steps), "--warmup", str(warmup)]
    cmd += ["--bf16"] if bf16 else []
    cmd += ["--checkpoint"] if checkpoint else []
    text, rc, rss, killed = run_child(cmd, a.threads, kill_above)
    line = [l for l in text.splitlines() if l.startswith("{")]
    if rc != 0 or not line:
        return None, rss, text, killed
    return json.loads(line[-1]), rss, text, killed


def torch_import_rss(a):
    """Peak RSS of a process that imports torch and torchvision and builds the small ViT: the
    share of PyTorch's figure that is the framework, not the training."""
    code = ("import os, torch, torchvision; torch.set_num_threads(%d); m = torchvision.models.vit_b_16; "
            "print('VmHWM', [int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmHWM')][0])"
            % a.threads)
    _, rc, rss, _ = run_child([sys.executable, "-c", code], a.threads)
    return rss if rc == 0 else 0


def tinytrain_speed(a, recipe, batch, steps, warmup):
    text, rc, rss, _ = run_child([a.bench_step, recipe, str(batch), str(steps), str(a.threads), str(warmup)], a.threads)
    m = re.search(r"median ([\d.]+) ms", text)
    if rc != 0 or not m:
        raise RuntimeError("bench_step failed:\n" + text)
    return batch / (float(m.group(1)) / 1e3), rss


def tinytrain_params(a, recipe):
    p = subprocess.run([a.tt, "plan", "--device", "cpu", "--json", recipe], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError("tinytrain plan %s failed:\n%s" % (recipe, p.stdout.decode()[-1500:]))
    return json.loads(p.stdout.decode())["params"]


def part_speed(a, work):
    recipe = os.path.join(work, "vit_small.recipe")
    small_recipe(recipe)
    batch = a.batch or SMALL_BATCH
    steps, warmup = (2, 1) if a.quick else (SMALL_STEPS, SMALL_WARMUP)
    s = SMALL
    print("== the small ViT (%dx%dx%d, patch %d, %d tokens, width %d, %d blocks, %d heads, MLP %d), batch %d, "
          "%d threads, SGD; median of %d alternating runs, fresh processes" % (
              s["c"], s["img"], s["img"], s["patch"], (s["img"] // s["patch"]) ** 2 + 1, s["dim"], s["depth"],
              s["heads"], s["mlp"], batch, a.threads, a.runs))
    tt_params = tinytrain_params(a, recipe)
    ex = os.path.join(ROOT, "examples/fashion_mnist/vit.recipe")
    if os.path.exists(ex):
        try:
            ex_params = tinytrain_params(a, ex)
            if ex_params != tt_params:
                print("  NOTE: examples/fashion_mnist/vit.recipe has %d parameters, this benchmark's small ViT %d: "
                      "update SMALL in this script to the example's sizes" % (ex_params, tt_params))
        except RuntimeError as e:
            print("  (examples/fashion_mnist/vit.recipe does not plan: %s)" % str(e).splitlines()[-1])
    rows = {"tt": ([], []), "fp32": ([], []), "bf16": ([], [])}
    pt_params = None
    for r in range(a.runs):
        order = ("tt", "fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32", "tt")
        for who in order:
            if who == "tt":
                ips, rss = tinytrain_speed(a, recipe, batch, steps, warmup)
            else:
                res, rss, text, _ = torch_run(a, "small", batch, steps, warmup, bf16=(who == "bf16"))
                if res is None:
                    raise RuntimeError("PyTorch child failed:\n" + text[-3000:])
                ips, pt_params = res["images_per_s"], res["params"]
            rows[who][0].append(ips)
            rows[who][1].append(rss)
        print("  run %d: tinytrain fp32 %8.1f images/s %9s | PyTorch fp32 %8.1f images/s %9s | PyTorch bf16 autocast "
              "%8.1f images/s %9s" % (r + 1, rows["tt"][0][-1], mib(rows["tt"][1][-1]), rows["fp32"][0][-1],
                                     mib(rows["fp32"][1][-1]), rows["bf16"][0][-1], mib(rows["bf16"][1][-1])))
        sys.stdout.flush()
    if pt_params != tt_params:
        print("  WARNING: PyTorch's model has %d parameters, tinytrain's %d: not the same model" % (pt_params, tt_params))
    else:
        print("  both models: %d parameters" % tt_params)
    med = {k: (statistics.median(v[0]), statistics.median(v[1])) for k, v in rows.items()}
    best = "fp32" if med["fp32"][0] >= med["bf16"][0] else "bf16"
    print()
    print("  %-34s %12s %10s %14s %10s" % ("", "images/s", "tt / this", "peak RSS", "tt / this"))
    print("  %-34s %12.1f %10s %14s %10s" % ("tinytrain fp32 (oneDNN)", med["tt"][0], "", mib(med["tt"][1]), ""))
    for k, label in (("fp32", "PyTorch fp32 eager"), ("bf16", "PyTorch eager, bf16 autocast")):
        print("  %-34s %12.1f %9.2fx %14s %9.2fx" % (label + (" (best)" if k == best else ""), med[k][0],
                                                     med["tt"][0] / med[k][0], mib(med[k][1]),
                                                     med["tt"][1] / med[k][1]))
    print("  (PyTorch's process after importing torch and torchvision, before any model: %s)" % mib(torch_import_rss(a)))
    print("  (images/s ratio: tinytrain / PyTorch, higher is better; issue 24 aims at >= 1.2x PyTorch's best;")
    print("   peak RSS ratio: tinytrain / PyTorch at the same batch, lower is better; the aim is <= 0.5x)")
    print()


def tinytrain_max_batch(a, vram):
    p = subprocess.run([a.tt, "plan", "--device", "cpu", "--vram", vram, "--max-batch", "--json", VIT_B16],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError("tinytrain plan --max-batch failed:\n" + p.stdout.decode()[-2000:])
    d = json.loads(p.stdout.decode())
    return {(r["precision"], r["recompute"]): (r["micro_batch"], r["arena_bytes"]) for r in d["max_batch"]}


def tinytrain_run_rss(a, work, batch, vram):
    """Peak RSS of tinytrain's training loop on ViT-B/16 at micro-batch `batch` under --vram (fp32,
    the scheduler recomputing what it must): build/bench/bench_step, one warm-up and one timed
    step on synthetic batches, as the PyTorch children do (no data loader, no checkpoint). The
    program is planned for the recipe's AdamW (both moments in the arena); bench_step's update is
    SGD, which reads the first moment alone."""
    with open(os.path.join(ROOT, VIT_B16)) as f:
        text = f.read()
    text = re.sub(r"(?m)^batch = \d+", "batch = %d" % batch, text)  # the micro-batch must divide it
    text = re.sub(r"(?s)\[data\].*?(?=\n\[)", "", text, count=1)
    path = os.path.join(work, "vit_b16_b%d.recipe" % batch)
    with open(path, "w") as f:
        f.write(text)
    out, rc, rss, _ = run_child([a.bench_step, path, str(batch), "1", str(a.threads), "1", vram], a.threads)
    m = re.search(r"arena ([\d.]+) MiB", out)
    return (rss if rc == 0 and m else None), (float(m.group(1)) if m else float("nan")), out


def torch_max_batch(a, checkpoint, limit=4 * GIB):
    probes = {}

    def fits(b):
        if b not in probes:
            t0 = time.time()
            res, rss, text, killed = torch_run(a, "vit_b16", b, 1, 1, checkpoint=checkpoint, kill_above=limit)
            ok = res is not None and rss < limit
            probes[b] = (ok, rss)
            why = "" if ok else ("  (over: stopped at %s)" % mib(rss) if killed else "  (over)" if res else
                                 "  (failed: %s)" % text.strip().splitlines()[-1][:200] if text.strip() else "  (failed)")
            print("    PyTorch%s batch %4d: peak RSS %s, %.0f s%s" % (" + checkpoint" if checkpoint else "", b, mib(rss),
                                                                    time.time() - t0, why))
            sys.stdout.flush()
        return probes[b][0]

    cap = a.probe_cap
    lo = bisect_batch(fits, 1, cap)
    return lo, (probes[lo][1] if lo else 0), lo == cap


def part_max_batch(a, work):
    print("== the largest ViT-B/16 (3x224x224, fp32, AdamW) training batch in 4 GiB")
    rows = tinytrain_max_batch(a, "4G")
    for (prec, rec), (mb, arena) in sorted(rows.items()):
        print("  tinytrain plan --device cpu --vram 4G --max-batch: %s, recompute %-4s -> micro-batch %4d (arena %s)" %
              (prec, rec, mb, mib(arena)))
    tt_plain = rows[("fp32", "none")][0]
    tt_best = max(rows[("fp32", r)][0] for r in ("none", "auto", "all") if ("fp32", r) in rows)
    tt_fair = tt_best
    if a.quick:
        tt_best = tt_fair = min(tt_best, 2)
        print("  (--quick: the real run at micro-batch %d instead)" % tt_best)
    if not a.skip_run:
        rss, arena, out = tinytrain_run_rss(a, work, tt_best, "4G")
        if rss is None:
            print("  tinytrain training at micro-batch %d: FAILED\n%s" % (tt_best, out[-2000:]))
        else:
            print("  tinytrain training at micro-batch %d under --vram 4G (bench_step): arena %.0f MiB, process peak RSS %s"
                  % (tt_best, arena, mib(rss)))
            if rss >= 4 * GIB and arena == arena:  # the process beyond its arena: plan the arena that much smaller
                vram = "%dM" % int((4 * GIB - (rss - arena * 1048576)) / 1048576)
                rows2 = tinytrain_max_batch(a, vram)
                tt_fair = max(rows2[("fp32", r)][0] for r in ("none", "auto", "all") if ("fp32", r) in rows2)
                rss2, arena2, out = tinytrain_run_rss(a, work, tt_fair, vram)
                print("  whole process under 4 GiB: --vram %s -> micro-batch %d: arena %.0f MiB, process peak RSS %s" %
                      (vram, tt_fair, arena2, mib(rss2 or 0)))
    pt_plain, pt_plain_rss, capped1 = torch_max_batch(a, False)
    pt_ckpt, pt_ckpt_rss, capped2 = torch_max_batch(a, True)
    cap = " (the probe cap; more may fit)"
    print("  PyTorch fp32 plain:                    batch %4d (peak RSS %s)%s" % (pt_plain, mib(pt_plain_rss),
                                                                                cap if capped1 else ""))
    print("  PyTorch fp32 + checkpoint per block:   batch %4d (peak RSS %s)%s" % (pt_ckpt, mib(pt_ckpt_rss),
                                                                                cap if capped2 else ""))
    print("  tinytrain fp32, no recompute (arena):  batch %4d = %.2fx PyTorch plain" % (tt_plain, tt_plain / max(pt_plain, 1)))
    print("  tinytrain fp32, best (arena in 4 GiB): batch %4d = %.2fx PyTorch plain, %.2fx PyTorch checkpointed" % (
        tt_best, tt_best / max(pt_plain, 1), tt_best / max(pt_ckpt, 1)))
    if tt_fair != tt_best:
        print("  tinytrain fp32 (process in 4 GiB):     batch %4d = %.2fx PyTorch plain, %.2fx PyTorch checkpointed" % (
            tt_fair, tt_fair / max(pt_plain, 1), tt_fair / max(pt_ckpt, 1)))
    print("  (issue 24 aims at >= 3x PyTorch's plain batch. Both sides: the training loop alone. A `tinytrain train`")
    print("   run also writes checkpoints, which copy the weights and both AdamW moments to the host at once:")
    print("   +%.0f MiB for ViT-B/16 at that moment on top of the figures above)" % (86567656 * 12 / 1048576.0))
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--build", default="build", help="the build directory holding bench/bench_step (default build)")
    ap.add_argument("--skip-speed", action="store_true", help="only part 2")
    ap.add_argument("--skip-max-batch", action="store_true", help="only part 1")
    ap.add_argument("--skip-run", action="store_true", help="part 2 without tinytrain's real run at its largest batch")
    ap.add_argument("--probe-cap", type=int, default=1024, help="largest batch PyTorch is probed at")
    ap.add_argument("--quick", action="store_true", help="tiny counts: checks the script, measures nothing")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--bf16", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        torch_child(a)
        return 0
    if a.quick:
        a.runs, a.probe_cap = 1, 2
    probe = subprocess.run([sys.executable, "-c", "import torch, torchvision; print(torch.__version__, "
                            "torchvision.__version__, torch.__file__)"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if probe.returncode != 0:
        print("PyTorch and torchvision are not importable by %s: run this with the Python that has them "
              "(python -m pip install torch torchvision in a virtual environment)" % sys.executable)
        return 0
    build = a.build if os.path.isabs(a.build) else os.path.join(ROOT, a.build)
    a.bench_step = os.path.join(build, "bench", "bench_step")
    a.tt = os.path.join(ROOT, "tinytrain") if a.build == "build" else os.path.join(build, "tinytrain")
    for exe in (a.bench_step, a.tt):
        if not os.access(exe, os.X_OK):
            print("%s not built: run ninja %s/bench/bench_step tinytrain" % (exe, a.build))
            return 0
    info = subprocess.run([a.tt, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          cwd=ROOT).stdout.decode().strip().replace("\n", "; ")
    print("tinytrain: %s" % info)
    print("pytorch:   %s (torchvision %s, %s)" % tuple(probe.stdout.decode().split()[:3]))
    print("cpu:       %s, %d logical cores; %d threads; load average at start %s" % (
        cpu_name(), os.cpu_count() or 0, a.threads, load()))
    if a.quick:
        print("--quick: tiny counts, the numbers below mean nothing")
    print()
    t0 = time.time()
    work = tempfile.mkdtemp(prefix="tt_vit_bench_")
    try:
        if not a.skip_speed:
            part_speed(a, work)
        if not a.skip_max_batch:
            part_max_batch(a, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("load average at end %s; %.0f s" % (load(), time.time() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
