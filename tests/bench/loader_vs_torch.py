#!/usr/bin/env python3
"""The data loader beside PyTorch's: images per second per loader thread, and a training run's
peak resident memory against the number of images.

    python3 tests/bench/loader_vs_torch.py [--images 2000] [--threads 2] [--batch 64] [--batches 25]
        [--rss-images 2000,20000] [--rss-device auto] [--dir DIR] [--out FILE] [--tiny]

1. A folder of generated JPEGs (--images of 500x375, 10 classes; PIL, quality 90; made once
   under --dir) is read by tinytrain's loader (build/bench/bench_loader: decode with
   TurboJPEG + RandomResizedCrop(224) + horizontal flip, then normalise each batch to float)
   and by torchvision's ImageFolder + DataLoader (PIL decode, RandomResizedCrop(224),
   RandomHorizontalFlip, ToTensor, Normalize) with the same number of workers and batch size.
2. The same folder packed once (`tinytrain pack --size 224`: shorter side to 224, centre crop)
   is read by tinytrain (format = npy, memory-mapped) and by PyTorch through a Dataset over
   np.load(mmap_mode="r") doing the same RandomResizedCrop + flip + normalise on tensors.
   Both sides are timed over the same number of batches after one warm-up batch; the figure
   compared is images/s divided by the number of loader threads (workers).
3. The peak resident memory (VmHWM of the child, polled) of `tinytrain --vram 4G --max-steps 3` on
   examples/imagenet/resnet50.recipe pointed at generated folders of each --rss-images size:
   with streaming it should not grow with the number of images.

A benchmark: it prints numbers (and writes them to --out as JSON); it never passes or fails on
them. Run it on an idle machine. --tiny checks the script end to end in seconds (64 small images;
with --rss-images '' no training run, or with --rss-recipe a small recipe of 3-channel input). Needs python3-torch, python3-torchvision, python3-numpy and python3-pil (the
Debian packages run under /usr/bin/python3) and a built tree (ninja).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TT = os.path.join(ROOT, "tinytrain")
BENCH = os.path.join(ROOT, "build", "bench", "bench_loader")
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def make_folder(root, n, w, h, classes=10):
    """n JPEGs of w x h in `classes` class folders (smooth gradients plus noise, like photos in
    size and entropy); kept between runs."""
    from PIL import Image
    import numpy as np
    stamp = os.path.join(root, ".complete")
    if os.path.exists(stamp) and open(stamp).read() == "%d %d %d" % (n, w, h):
        return root
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:h, 0:w]
    for i in range(n):
        c = i % classes
        d = os.path.join(root, "class%02d" % c)
        os.makedirs(d, exist_ok=True)
        base = np.stack([(xx * (c + 1) * 255 // w) % 256, (yy * 255 // h), ((xx + yy) * 7) % 256], -1)
        img = np.clip(base + rng.integers(-40, 40, size=(h, w, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(img).save(os.path.join(d, "%06d.jpg" % i), quality=90)
    with open(stamp, "w") as f:
        f.write("%d %d %d" % (n, w, h))
    return root


def tinytrain_loader(source, size, batch, threads, batches):
    out = subprocess.run([BENCH, source, str(size), str(batch), str(threads), str(batches), "rrc"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def time_torch(loader, batches):
    it = iter(loader)
    next(it)  # warm-up: workers started
    t0, n = time.perf_counter(), 0
    for _ in range(batches):
        try:
            x, _ = next(it)
        except StopIteration:
            break
        n += x.shape[0]
    return n, time.perf_counter() - t0


def torch_folder(folder, size, batch, threads, batches):
    import torch
    from torchvision import datasets, transforms
    tf = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                             transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    ds = datasets.ImageFolder(folder, tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=threads, drop_last=True)
    n, dt = time_torch(dl, batches)
    return {"images": n, "seconds": dt, "images_per_s": n / dt, "images_per_s_per_thread": n / dt / threads}


def torch_npy(prefix, size, batch, threads, batches):
    import numpy as np
    import torch
    from torchvision import transforms

    class Packed(torch.utils.data.Dataset):
        def __init__(self):
            self.x = None
            self.y = np.load(prefix + "-labels.npy")
            self.tf = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip()])
            self.mean = torch.tensor(MEAN).view(3, 1, 1)
            self.std = torch.tensor(STD).view(3, 1, 1)

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            if self.x is None:  # opened in each worker
                self.x = np.load(prefix + "-images.npy", mmap_mode="r")
            img = torch.from_numpy(np.ascontiguousarray(self.x[i])).permute(2, 0, 1)
            img = self.tf(img).float().div_(255)
            return (img - self.mean) / self.std, int(self.y[i])

    dl = torch.utils.data.DataLoader(Packed(), batch_size=batch, shuffle=True, num_workers=threads, drop_last=True)
    n, dt = time_torch(dl, batches)
    return {"images": n, "seconds": dt, "images_per_s": n / dt, "images_per_s_per_thread": n / dt / threads}


def peak_rss(folder, work, device, recipe_path, steps=3):
    """Peak RSS of tinytrain --max-steps on the recipe (resnet50.recipe) with train = folder."""
    src = open(recipe_path).read()
    lines = []
    for line in src.splitlines():
        if line.startswith("train ="):
            line = "train = " + os.path.abspath(folder)
        elif line.startswith("test ="):
            continue
        lines.append(line)
    recipe = os.path.join(work, "rss_bench.recipe")
    with open(recipe, "w") as f:
        f.write("\n".join(lines) + "\n")
    out = os.path.join(work, "run_%d" % len(os.listdir(folder)))
    shutil.rmtree(out, ignore_errors=True)
    # within 4 GiB, as the README trains: the scheduler picks the micro-batch and accumulation
    cmd = [TT, "--device", device, "--vram", "4G", "--max-steps", str(steps), "--out", out, recipe]
    # VmHWM of the child, polled: getrusage's ru_maxrss would keep this Python's size across exec
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    hwm = 0
    while p.poll() is None:
        try:
            for line in open("/proc/%d/status" % p.pid):
                if line.startswith("VmHWM:"):
                    hwm = max(hwm, int(line.split()[1]))
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    so, se = p.communicate()
    if p.returncode != 0:
        return {"error": (se or so).strip().splitlines()[-1:]}
    return {"peak_rss_mib": hwm / 1024.0}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batches", type=int, default=25)
    ap.add_argument("--rss-images", default="2000,20000")
    ap.add_argument("--rss-device", default="auto")
    ap.add_argument("--rss-recipe", default=os.path.join(ROOT, "examples", "imagenet", "resnet50.recipe"))
    ap.add_argument("--dir", default="/tmp/tt_loader_bench")
    ap.add_argument("--out")
    ap.add_argument("--tiny", action="store_true", help="64 images of 120x90, input 64: checks the script")
    a = ap.parse_args()
    try:
        import numpy, PIL, torch, torchvision  # noqa: F401
    except ImportError as e:
        print("loader_vs_torch: needs numpy, PIL, torch and torchvision (%s); run it with /usr/bin/python3" % e)
        return 0
    if not (os.access(TT, os.X_OK) and os.access(BENCH, os.X_OK)):
        print("loader_vs_torch: build first (ninja; ninja bench)")
        return 1
    n, w, h, size = (64, 120, 90, 64) if a.tiny else (a.images, 500, 375, 224)
    batch, batches = (8, 4) if a.tiny else (a.batch, a.batches)
    os.makedirs(a.dir, exist_ok=True)
    folder = make_folder(os.path.join(a.dir, "jpeg_%d_%dx%d" % (n, w, h)), n, w, h)
    prefix = os.path.join(a.dir, "packed_%d_%d" % (n, size))
    if not os.path.exists(prefix + "-images.npy"):
        subprocess.run([TT, "pack", "--size", str(size), folder, prefix], check=True, capture_output=True)
    res = {"images": n, "image_size": [w, h], "input": size, "batch": batch, "threads": a.threads,
           "machine_cpus": os.cpu_count()}
    res["jpeg_tinytrain"] = tinytrain_loader(folder, size, batch, a.threads, batches)
    res["jpeg_torch"] = torch_folder(folder, size, batch, a.threads, batches)
    res["npy_tinytrain"] = tinytrain_loader(prefix + "-images.npy", size, batch, a.threads, batches)
    res["npy_torch"] = torch_npy(prefix, size, batch, a.threads, batches)
    for k in ("jpeg", "npy"):
        t, p = res[k + "_tinytrain"]["images_per_s_per_thread"], res[k + "_torch"]["images_per_s_per_thread"]
        res[k + "_ratio"] = t / p
        print("%-5s tinytrain %8.1f img/s/thread   PyTorch %8.1f img/s/thread   ratio %.2fx (goal %s)" %
              (k, t, p, t / p, "2x" if k == "jpeg" else "5x"))
    if a.rss_images:
        res["rss"] = {}
        for m in sorted(int(x) for x in a.rss_images.split(",")):
            f = make_folder(os.path.join(a.dir, "jpeg_%d_%dx%d" % (m, w, h)), m, w, h)
            res["rss"][str(m)] = r = peak_rss(f, a.dir, a.rss_device, a.rss_recipe)
            print("%s --max-steps 3 on %6d images: %s" % (os.path.basename(a.rss_recipe), m, json.dumps(r)))
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
