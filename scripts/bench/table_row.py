"""One row of scripts/bench-vs-pytorch.sh's table, or this CPU's f32 peak.

table_row.py WORK NAME TORCH PRECISION FUSE [TOKENS]: reads WORK/NAME.json (oomlab's run summary),
WORK/NAME-as-f32.json (the same config in f32, for half-precision runs) and
WORK/torch-TORCH.json (PyTorch's), prints a Markdown row. With TOKENS (a language model's
tokens per sequence) the rates are tokens/s and the FLOPs per token.
table_row.py --peak: prints the peak, e.g. "333 GFLOP/s (2 cores × 2 FMA × 16 lanes × 2 × 2.60 GHz)".
"""

import json
import os
import sys


def peak():
    """(GFLOP/s, how): cores × FMA units × f32 lanes of the widest vector × 2 × clock."""
    flags, mhz = set(), None
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "flags" and not flags:
                flags = set(value.split())
            elif key == "cpu MHz" and mhz is None:
                mhz = float(value)
    lanes = 16 if "avx512f" in flags else 8 if "avx2" in flags else 4
    cores, fma = os.cpu_count() or 1, 2
    ghz = (mhz or 0.0) / 1000
    how = f"{cores} cores × {fma} FMA × {lanes} lanes × 2 × {ghz:.2f} GHz"
    return cores * fma * lanes * 2 * ghz, how


def main():
    if sys.argv[1:] == ["--peak"]:
        gflops, how = peak()
        print(f"{gflops:.0f} GFLOP/s ({how})")
        return
    work, name, torch, precision, fuse, *rest = sys.argv[1:]
    tokens = int(rest[0]) if rest else 1
    unit = " tok/s" if rest else ""
    load = lambda path: json.load(open(os.path.join(work, path)))
    ours = load(f"{name}.json")["images_per_sec"] * tokens
    theirs_json = load(f"torch-{torch}.json")
    theirs = theirs_json["images_per_sec"] * tokens
    flops = theirs_json["flops_per_image"] / tokens
    half = "—"
    if precision != "f32":
        f32 = load(f"{name}-as-f32.json")["images_per_sec"] * tokens
        half = f"{ours / f32:.2f}× of f32"
    gflops = ours * flops / 1e9
    print(
        f"| {name} | {fuse} | {precision} | {ours:.0f}{unit} | {theirs:.0f}{unit} | "
        f"{ours / theirs:.2f}× | {half} | {flops / 1e9:.3f}{' per token' if rest else ''} | "
        f"{gflops:.1f} | {100 * gflops / peak()[0]:.0f}% |"
    )


if __name__ == "__main__":
    main()
