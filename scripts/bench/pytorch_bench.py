"""PyTorch's side of scripts/bench-vs-pytorch.sh: images/s of oomlab's models, eager, CPU.

The GPT (`--model gpt --gpt L,H,D,T,V`) is GPT-2's architecture as burn-models builds it:
token and position embeddings, pre-LayerNorm blocks (causal attention with biases, a 4× MLP
with tanh-GELU), a final LayerNorm, the head tied to the token embedding; random byte tokens;
next-token cross-entropy over every position. `--attention naive` composes the attention from
tensor ops as oomlab's naive attention does; `sdpa` is PyTorch's
scaled_dot_product_attention (its fused CPU kernel), beside oomlab's memory-efficient one. A
sample is a sequence: "images_per_sec" counts sequences, "tokens_per_sec" tokens.

The models mirror burn-models exactly (SimpleModel: conv 3→64 k3 pad 1, ReLU, 2×2 max-pool,
linear 64·16·16→10; MobileNet α 0.5 with a stride-1 stem, 13 depthwise-separable blocks of
Table 1, conv without bias, BN, ReLU, global average pool, linear; ResNet-18 with the CIFAR
stem, torchvision's basic blocks, a 1×1 conv + BN shortcut where the shape changes).
Synthetic data, Adam, cross-entropy, `--threads` intra-op threads, `--warmup` untimed steps,
then `--steps` timed ones (each of `--accum` micro-batches of `--batch`), f32. Also counts the
floating-point operations of one training step (forward and backward, from the ops' shapes:
torch.utils.flop_counter; a multiply-add is two) per image. Prints one JSON line:
{"model", "batch", "accum", "threads", "steps", "images_per_sec", "flops_per_image", "torch"}.
"""

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
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


class BasicBlock(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.body = nn.Sequential(
            *conv_bn(c_in, c_out, 3, stride, 1),
            nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False), nn.BatchNorm2d(c_out))
        self.shortcut = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet18(classes=10):
    layers = conv_bn(3, 64, 3, 1, 1)
    c_in = 64
    for width, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        layers += [BasicBlock(c_in, width, stride), BasicBlock(width, width, 1)]
        c_in = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, classes)]
    return nn.Sequential(*layers)


class GptBlock(nn.Module):
    def __init__(self, d, heads, sdpa):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads, self.sdpa = heads, sdpa

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q / math.sqrt(d // self.heads)) @ k.transpose(-2, -1)
            future = torch.ones(t, t, dtype=torch.bool).triu(1)
            y = scores.masked_fill(future, float("-inf")).softmax(-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers, heads, d, seq, vocab, sdpa):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(GptBlock(d, heads, sdpa) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.tok.weight.T


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", choices=["simple", "mobilenet", "resnet18", "gpt"], required=True)
    ap.add_argument("--gpt", default="4,4,128,128,256", help="layers,heads,d_model,seq_len,vocab")
    ap.add_argument("--attention", choices=["naive", "sdpa"], default="naive")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    if min(a.batch, a.accum, a.threads, a.steps) < 1 or a.warmup < 0:
        ap.error("--batch, --accum, --threads and --steps must be at least 1, --warmup at least 0")

    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    tokens = 1
    if a.model == "gpt":
        layers, heads, d, seq, vocab = (int(v) for v in a.gpt.split(","))
        model = Gpt(layers, heads, d, seq, vocab, a.attention == "sdpa")
        x = torch.randint(0, vocab, (a.batch, seq))
        y = torch.randint(0, vocab, (a.batch, seq))
        ce = nn.CrossEntropyLoss()
        loss_fn = lambda logits, y: ce(logits.reshape(-1, vocab), y.reshape(-1))
        tokens = seq
    else:
        models = {"simple": simple_model, "mobilenet": mobilenet, "resnet18": resnet18}
        model = models[a.model]()
        loss_fn = nn.CrossEntropyLoss()
        x = torch.randn(a.batch, 3, 32, 32)
        y = torch.randint(0, 10, (a.batch,))
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)

    def step():
        opt.zero_grad(set_to_none=True)
        for _ in range(a.accum):
            loss = loss_fn(model(x), y) / a.accum
            loss.backward()
        opt.step()
        return loss.item()

    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter:
        loss_fn(model(x), y).backward()
    flops_per_image = counter.get_total_flops() / a.batch

    for _ in range(a.warmup):
        step()
    start = time.perf_counter()
    for _ in range(a.steps):
        step()
    seconds = time.perf_counter() - start
    print(json.dumps({
        "model": a.model, "batch": a.batch, "threads": a.threads,
        "accum": a.accum, "steps": a.steps,
        "images_per_sec": a.steps * a.accum * a.batch / seconds,
        "tokens_per_sec": a.steps * a.accum * a.batch * tokens / seconds,
        "flops_per_image": flops_per_image,
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
