"""PyTorch's side of scripts/bench-vs-pytorch.sh: images/s of oomlab's two models, eager, CPU.

The models mirror burn-models exactly (SimpleModel: conv 3→64 k3 pad 1, ReLU, 2×2 max-pool,
linear 64·16·16→10; MobileNet α 0.5 with a stride-1 stem, 13 depthwise-separable blocks of
Table 1, conv without bias, BN, ReLU, global average pool, linear). Synthetic data, Adam,
cross-entropy, `--threads` intra-op threads, `--warmup` untimed steps, then `--steps` timed
ones, f32. Prints one JSON line: {"model", "batch", "threads", "steps", "images_per_sec", "torch"}.
"""

import argparse
import json
import time

import torch
from torch import nn

BLOCKS = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1),
          (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1)]


def simple_model():
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 16 * 16, 10))


def conv_bn(c_in, c_out, k, stride, groups):
    return [nn.Conv2d(c_in, c_out, k, stride, k // 2, groups=groups, bias=False),
            nn.BatchNorm2d(c_out), nn.ReLU()]


def mobilenet(alpha=0.5, classes=10):
    ch = lambda base: max(1, int(base * alpha))
    layers = conv_bn(3, ch(32), 3, 1, 1)
    c_in = ch(32)
    for base, stride in BLOCKS:
        layers += conv_bn(c_in, c_in, 3, stride, c_in)    # depthwise
        layers += conv_bn(c_in, ch(base), 1, 1, 1)        # pointwise
        c_in = ch(base)
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, classes)]
    return nn.Sequential(*layers)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", choices=["simple", "mobilenet"], required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    if a.batch < 1 or a.threads < 1 or a.steps < 1 or a.warmup < 0:
        ap.error("--batch, --threads and --steps must be at least 1, --warmup at least 0")

    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    model = simple_model() if a.model == "simple" else mobilenet()
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(a.batch, 3, 32, 32)
    y = torch.randint(0, 10, (a.batch,))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(a.warmup):
        step()
    start = time.perf_counter()
    for _ in range(a.steps):
        step()
    seconds = time.perf_counter() - start
    print(json.dumps({
        "model": a.model, "batch": a.batch, "threads": a.threads,
        "steps": a.steps, "images_per_sec": a.steps * a.batch / seconds,
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
