#!/usr/bin/python3
"""Evaluates a tinytrain weights.safetensors in PyTorch, independently of tinytrain.

    /usr/bin/python3 tests/torch_ref/check_weights.py RECIPE WEIGHTS

RECIPE is the recipe tests/cli/test_torch_weights.sh writes (a small CNN for Fashion-MNIST; the net
below must match it layer for layer). This script reads:
  - WEIGHTS by hand (no safetensors package): an 8-byte little-endian header length N, N bytes
    of JSON {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the raw data;
  - the recipe's [data] test / test_labels IDX .gz files (gzip + struct) and mean / std;
builds the same net in PyTorch with the recipe's layer names (conv1.weight, bn1.running_mean...),
loads every tensor strictly (a missing, extra or mis-shaped tensor is an error), normalises
the test images as (pixel / 255 - mean) / std, evaluates in eval mode (batch-norm running
statistics, no dropout) and prints

    torch accuracy 0.912300 (9123/10000) loss 0.2461

Exit status 0, or 1 with a message. Needs PyTorch (Debian python3-torch); nothing else.
"""
import gzip
import json
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


def read_recipe(path):
    """{section_kind_and_name: {key: value}} for the simple recipe used here (no blocks)."""
    sections, cur = {}, None
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("["):
                cur = sections.setdefault(line.strip("[]").strip(), {})
            elif "=" in line and cur is not None:
                k, v = line.split("=", 1)
                cur[k.strip()] = v.strip()
    return sections


def resolve(recipe, p):
    return p if os.path.isabs(p) else os.path.join(os.path.dirname(os.path.abspath(recipe)), p)


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError("%s: shorter than 8 bytes" % path)
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ValueError("%s: header length %d past the end of the file" % (path, n))
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        if info["dtype"] != "F32":
            raise ValueError("%s: tensor %s has dtype %s, expected F32" % (path, name, info["dtype"]))
        b, e = info["data_offsets"]
        shape = [int(s) for s in info["shape"]]
        count = 1
        for s in shape:
            count *= s
        if e - b != 4 * count or e > len(data):
            raise ValueError("%s: tensor %s: offsets [%d, %d] do not hold %s floats" % (path, name, b, e, shape))
        vals = struct.unpack("<%df" % count, data[b:e])
        out[name] = torch.tensor(vals, dtype=torch.float32).reshape(shape)
    return out, meta


def read_idx(path):
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        blob = f.read()
    magic, = struct.unpack(">I", blob[:4])
    ndim = magic & 0xFF
    if (magic >> 8) != 0x08:
        raise ValueError("%s: not an unsigned-byte IDX file (magic %#x)" % (path, magic))
    dims = struct.unpack(">%dI" % ndim, blob[4:4 + 4 * ndim])
    body = blob[4 + 4 * ndim:]
    t = torch.frombuffer(bytearray(body), dtype=torch.uint8)
    return t.reshape(dims)


class TinyCNN(nn.Module):
    """The recipe in tests/cli/test_torch_weights.sh:
    conv1 (8, 5x5, pad 2, no bias) -> bn1 -> relu -> maxpool 2
    conv2 (16, 3x3, pad 1, bias)   -> bn2 -> relu -> maxpool 2
    flatten (16*7*7) -> fc1 (64) -> relu -> dropout 0.2 -> fc2 (10)"""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 5, padding=2, bias=False)
        self.bn1 = nn.BatchNorm2d(8, eps=1e-5)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, bias=True)
        self.bn2 = nn.BatchNorm2d(16, eps=1e-5)
        self.fc1 = nn.Linear(16 * 7 * 7, 64)
        self.drop = nn.Dropout(0.2)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = torch.flatten(x, 1)
        return self.fc2(self.drop(F.relu(self.fc1(x))))


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: check_weights.py RECIPE WEIGHTS")
    recipe, weights = sys.argv[1], sys.argv[2]
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    sec = read_recipe(recipe)
    data = sec.get("data")
    if not data or "test" not in data or "test_labels" not in data:
        sys.exit("%s: no [data] test / test_labels" % recipe)
    mean = float(data.get("mean", "0"))
    std = float(data.get("std", "1"))

    tensors, meta = read_safetensors(weights)
    net = TinyCNN()
    sd = net.state_dict()
    extra = sorted(set(tensors) - set(sd))
    missing = sorted(k for k in sd if k not in tensors and not k.endswith("num_batches_tracked"))
    if extra or missing:
        sys.exit("%s does not match the PyTorch net: extra %s, missing %s" % (weights, extra, missing))
    for k, v in tensors.items():
        if tuple(v.shape) != tuple(sd[k].shape):
            sys.exit("%s: tensor %s is %s, the PyTorch net has %s" % (weights, k, list(v.shape), list(sd[k].shape)))
        sd[k] = v
    net.load_state_dict(sd, strict=True)
    net.eval()

    images = read_idx(resolve(recipe, data["test"]))
    labels = read_idx(resolve(recipe, data["test_labels"])).long()
    if images.dim() == 3:
        images = images.unsqueeze(1)
    x_all = (images.float() / 255.0 - mean) / std
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for i in range(0, x_all.shape[0], 1000):
            logits = net(x_all[i:i + 1000])
            y = labels[i:i + 1000]
            correct += int((logits.argmax(1) == y).sum())
            loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
    n = x_all.shape[0]
    print("torch accuracy %.6f (%d/%d) loss %.4f (step %s)" % (correct / n, correct, n, loss_sum / n,
                                                              meta.get("step", "?")))


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError, KeyError) as e:
        sys.exit("check_weights.py: %s" % e)
