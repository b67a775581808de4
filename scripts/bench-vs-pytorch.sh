#!/usr/bin/env bash
# CPU speed against PyTorch (a benchmark, not a test; not part of CI). Trains oomlab's two
# models in both frameworks, one after the other, with the same threads (all cores), batch,
# optimizer (Adam), synthetic data and steps after one untimed warm-up step, and writes the
# table into docs/src/appendix-speed.md between its `bench-vs-pytorch` markers, stamped with the date,
# machine, PyTorch version and commit. PyTorch comes from the Python package registry into a
# venv under target/ (the first run installs it: 3.2 GB on disk, torch and the CUDA libraries
# its Linux wheel requires even to run on the CPU).
# Usage: scripts/bench-vs-pytorch.sh [STEPS]   (timed steps per run; default 20, at most 10000)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
if ! [[ $steps =~ ^[0-9]+$ ]] || ((10#$steps < 1 || 10#$steps > 10000)); then
  echo "bench-vs-pytorch: STEPS must be a whole number from 1 to 10000, got '$steps'" >&2
  exit 2
fi
steps=$((10#$steps))
threads=$(nproc)
torch_version=2.15.0
venv=target/bench-venv
work=target/bench-vs-pytorch
mkdir -p "$work"
grep -q -- "<!-- bench-vs-pytorch -->" docs/src/appendix-speed.md || {
  echo "bench-vs-pytorch: docs/src/appendix-speed.md has no <!-- bench-vs-pytorch --> marker" >&2
  exit 1
}

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  echo "bench-vs-pytorch: installing torch $torch_version into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "torch==$torch_version" numpy
fi
cargo build --release -p trainer
export OOMLAB_NO_CUDA=1 # a CPU benchmark, on machines with a GPU too

# oomlab CONFIG NAME [SET...]: images/s after the warm-up window, from the run's summary.
oomlab() {
  local config=$1 name=$2
  shift 2
  local sets=(--set data.train_size=$(((steps + 1) * 128)) --set data.eval_size=16)
  for s in "$@"; do sets+=(--set "$s"); done
  target/release/trainer --config "$config" --backend cpu --max-steps $((steps + 1)) \
    --set "train.output_dir=$work/$name" --overwrite "${sets[@]}" \
    --summary-json "$work/$name.json" >/dev/null
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["images_per_sec"])' "$work/$name.json"
}

# torch MODEL BATCH LR: images/s of the same model in PyTorch.
torch_rate() {
  "$venv/bin/python" scripts/bench/pytorch_bench.py --model "$1" --batch "$2" --lr "$3" \
    --threads "$threads" --warmup 1 --steps "$steps" |
    python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["images_per_sec"])'
}

rows=()
row() { # what, oomlab rate, reference rate, reference name
  rows+=("$(python3 -c 'import sys; w, a, b, r = sys.argv[1:]; a, b = float(a), float(b)
print(f"| {w} | {a:.0f} | {b:.0f} | {a / b:.2f}× {r} |")' "$@")")
}
for fuse in none blocks; do
  s=$(oomlab configs/f32.toml "simple-f32-$fuse" "memory.fuse=$fuse")
  m=$(oomlab configs/mobilenet.toml "mobilenet-f32-$fuse" "memory.fuse=$fuse")
  sh=$(oomlab configs/amp.toml "simple-amp-$fuse" "memory.fuse=$fuse")
  mh=$(oomlab configs/mobilenet-amp.toml "mobilenet-amp-$fuse" "memory.fuse=$fuse")
  eval "s_$fuse=$s m_$fuse=$m sh_$fuse=$sh mh_$fuse=$mh"
done
ts=$(torch_rate simple 128 1e-3)
tm=$(torch_rate mobilenet 64 2e-3)
for fuse in none blocks; do
  eval "s=\$s_$fuse m=\$m_$fuse sh=\$sh_$fuse mh=\$mh_$fuse"
  row "SimpleModel f32 b128, fuse = $fuse" "$s" "$ts" "of PyTorch"
  row "MobileNet α 0.5 f32 b64, fuse = $fuse" "$m" "$tm" "of PyTorch"
  row "SimpleModel f16-mixed b128, fuse = $fuse" "$sh" "$s" "of oomlab f32"
  row "MobileNet α 0.5 f16-mixed b64, fuse = $fuse" "$mh" "$m" "of oomlab f32"
done

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- . ':!docs' 2>/dev/null || commit="$commit with uncommitted changes"
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
{
  echo "<!-- bench-vs-pytorch -->"
  echo "Measured $(date -u +%Y-%m-%d) on $threads cores (${cpu:-$(uname -m)}), $threads threads in both,"
  echo "$steps timed steps after one warm-up step, PyTorch $torch_version eager (PyTorch: $(printf '%.0f' "$ts") images/s"
  echo "for SimpleModel, $(printf '%.0f' "$tm") for MobileNet), commit $commit, by \`scripts/bench-vs-pytorch.sh $steps\`."
  echo
  echo "| run | oomlab images/s | reference images/s | ratio |"
  echo "|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo "<!-- /bench-vs-pytorch -->"
} >"$work/table.md"
awk -v file="$work/table.md" '
  $0 == "<!-- bench-vs-pytorch -->" { while ((getline line < file) > 0) print line; skip = 1; next }
  skip && $0 == "<!-- /bench-vs-pytorch -->" { skip = 0; next }
  !skip { print }' docs/src/appendix-speed.md >"$work/speed.md"
mv "$work/speed.md" docs/src/appendix-speed.md
cat "$work/table.md"
