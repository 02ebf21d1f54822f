#!/usr/bin/env python3
"""LeNet training speed on this CPU: tinytrain against PyTorch, same model, batch and threads.

    /usr/bin/python3 tests/bench/lenet_vs_torch.py [--steps 200] [--threads 2]

Runs ./tinytrain on examples/fashion_mnist/lenet.recipe for --steps optimizer steps and reads
images/s from its metrics.jsonl (the intervals after the first, so start-up is excluded); then
trains the same network (conv 5x5 32 + BN + ReLU + maxpool, conv 3x3 64 + BN + ReLU + maxpool,
linear 256 + ReLU, dropout 0.3, linear 10; SGD with Nesterov momentum, batch 128) in PyTorch on
random data of the same shape with the same thread count, timing the same number of steps after
a warm-up. Prints both and their ratio. A benchmark: it prints numbers, it does not pass or fail.
"""
import argparse
import json
import os
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tinytrain_ips(steps, threads):
    out = tempfile.mkdtemp(prefix="tt_bench_")
    recipe = os.path.join(ROOT, "examples/fashion_mnist/lenet.recipe")
    # log every 25 steps so the first interval (start-up, first touches) can be dropped
    with open(recipe) as f:
        text = f.read().replace("log_every = 100", "log_every = 25")
    rpath = os.path.join(out, "lenet.recipe")
    with open(rpath, "w") as f:
        f.write(text)
    subprocess.run([os.path.join(ROOT, "tinytrain"), "--threads", str(threads), "--max-steps", str(steps),
                    "--out", out, rpath], check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"train"' in l]
    rates = [r["images_per_s"] for r in rows[1:]] or [rows[0]["images_per_s"]]
    return sum(rates) / len(rates), rows[-1]["data_wait"]


def torch_ips(steps, threads):
    import torch
    import torch.nn as nn
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    net = nn.Sequential(
        nn.Conv2d(1, 32, 5, padding=2, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 256), nn.ReLU(inplace=True), nn.Dropout(0.3), nn.Linear(256, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(128, 1, 28, 28)
    y = torch.randint(0, 10, (128,))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()

    for _ in range(10):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * 128 / (time.perf_counter() - t0), torch.__version__


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    a = ap.parse_args()
    tt, wait = tinytrain_ips(a.steps, a.threads)
    print("tinytrain : %8.1f images/s (LeNet, batch 128, fp32, %d threads; data wait %.1f%%)" % (tt, a.threads, 100 * wait))
    try:
        pt, ver = torch_ips(a.steps, a.threads)
    except ImportError:
        print("pytorch   : not installed (Debian: apt-get install python3-torch; run with /usr/bin/python3)")
        return
    print("pytorch   : %8.1f images/s (torch %s, same model, batch, optimizer and threads)" % (pt, ver))
    print("ratio     : %8.2f  (tinytrain / pytorch)" % (tt / pt))


if __name__ == "__main__":
    main()
