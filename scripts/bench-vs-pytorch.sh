#!/usr/bin/env bash
# CPU speed against PyTorch (a benchmark, not a test; not part of CI). Trains every shipped
# config (configs/*.toml, each as shipped: composed or fused) on the CPU, and the same model in
# PyTorch eager with the same threads (all cores), batch, accumulation, optimizer (Adam),
# synthetic data and steps after one untimed warm-up step; writes one table into
# docs/src/appendix-speed.md between its `bench-vs-pytorch` markers, stamped with the date,
# machine, PyTorch version and commit: images/s beside PyTorch's, f16/bf16 runs against the
# same model's f32 run at the same fusion, and each model's floating-point operations per
# image (one training step, forward and backward, counted from the ops' shapes by PyTorch's
# flop counter) with the GFLOP/s that makes against this CPU's peak (cores × 2 FMA units ×
# f32 lanes of its widest vector × 2 × clock, read from /proc/cpuinfo; the FMA units per core
# are not readable there: 2, as on this Xeon family). PyTorch comes from the Python package
# registry into a venv under target/ (the first run installs it: 3.2 GB on disk).
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

# One TOML value of a config: `get FILE KEY DEFAULT`.
get() {
  python3 -c 'import sys, tomllib
section, key = sys.argv[2].split(".")
print(tomllib.load(open(sys.argv[1], "rb")).get(section, {}).get(key, sys.argv[3]))' "$@"
}

# oomlab CONFIG NAME [SET...]: the run's summary (JSON) in $work/NAME.json.
oomlab() {
  local config=$1 name=$2
  shift 2
  local batch accum seq
  batch=$(get "$config" train.batch_size 32)
  accum=$(get "$config" train.accum_steps 1)
  local samples=$(((steps + 1) * batch * accum))
  local sets=(--set "data.train_size=$samples" --set data.eval_size=16)
  if [[ $(get "$config" model.name simple) == gpt ]]; then
    # The built-in corpus, its train split holding a window per sample.
    seq=$(get "$config" model.seq_len 64)
    sets=(--set "data.corpus_bytes=$(((samples * seq + 1) * 10 / 9 + 10))" --set data.eval_size=4)
  fi
  for s in "$@"; do sets+=(--set "$s"); done
  target/release/trainer --config "$config" --backend cpu --max-steps $((steps + 1)) \
    --set "train.output_dir=$work/$name" --overwrite "${sets[@]}" \
    --summary-json "$work/$name.json" >/dev/null
}

# torch MODEL BATCH ACCUM LR [EXTRA...]: PyTorch's summary (JSON) in
# $work/torch-MODEL-BATCH-ACCUM.json (MODEL names a GPT's sizes and attention too).
torch_run() {
  local out="$work/torch-$1-$2-$3.json" model=${1%%:*}
  [[ -s $out ]] && return 0
  "$venv/bin/python" scripts/bench/pytorch_bench.py --model "$model" --batch "$2" --accum "$3" \
    --lr "$4" --threads "$threads" --warmup 1 --steps "$steps" "${@:5}" >"$out"
}

rm -f "$work"/torch-*.json
rows=()
for config in configs/*.toml; do
  name=$(basename "$config" .toml)
  model=$(get "$config" model.name simple)
  [[ $model == resnet ]] && model=resnet18
  batch=$(get "$config" train.batch_size 32)
  accum=$(get "$config" train.accum_steps 1)
  lr=$(get "$config" train.lr 1e-3)
  precision=$(get "$config" precision.mode f32)
  fuse=$(get "$config" memory.fuse none)
  echo "bench-vs-pytorch: $name" >&2
  # The same model in f32 at the same fusion, for the half-precision runs' ratio.
  if [[ $precision != f32 ]]; then
    oomlab "$config" "$name-as-f32" precision.mode=f32 precision.loss_scale=off
  fi
  oomlab "$config" "$name"
  if [[ $model == gpt ]]; then
    # The same GPT in PyTorch; memory-efficient attention against its fused SDPA kernel.
    sizes=$(get "$config" model.n_layer 4),$(get "$config" model.n_head 4),$(get "$config" model.d_model 128)
    seq=$(get "$config" model.seq_len 64)
    sizes=$sizes,$seq,$(get "$config" model.vocab_size 256)
    attention=naive
    [[ $(get "$config" model.attention naive) == naive ]] || attention=sdpa
    model="gpt:$sizes:$attention"
    torch_run "$model" "$batch" "$accum" "$lr" --gpt "$sizes" --attention "$attention"
    rows+=("$(python3 scripts/bench/table_row.py "$work" "$name" "$model-$batch-$accum" \
      "$precision" "$fuse" "$seq")")
    continue
  fi
  torch_run "$model" "$batch" "$accum" "$lr"
  rows+=("$(python3 scripts/bench/table_row.py "$work" "$name" "$model-$batch-$accum" \
    "$precision" "$fuse")")
done

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- . ':!docs' 2>/dev/null || commit="$commit with uncommitted changes"
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
peak=$(python3 scripts/bench/table_row.py --peak)
{
  echo "<!-- bench-vs-pytorch -->"
  echo "Measured $(date -u +%Y-%m-%d) on $threads cores (${cpu:-$(uname -m)}), $threads threads in both,"
  echo "$steps timed steps after one warm-up step, PyTorch $torch_version eager, commit $commit,"
  echo "by \`scripts/bench-vs-pytorch.sh $steps\`. This CPU's f32 peak: $peak."
  echo
  echo "| config | fuse | precision | oomlab images/s | PyTorch f32 images/s | ratio | half vs f32 | GFLOP per image | GFLOP/s | of peak |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo "<!-- /bench-vs-pytorch -->"
} >"$work/table.md"
awk -v file="$work/table.md" '
  $0 == "<!-- bench-vs-pytorch -->" { while ((getline line < file) > 0) print line; skip = 1; next }
  skip && $0 == "<!-- /bench-vs-pytorch -->" { skip = 0; next }
  !skip { print }' docs/src/appendix-speed.md >"$work/speed.md"
mv "$work/speed.md" docs/src/appendix-speed.md
cat "$work/table.md"
