#!/usr/bin/env bash
# Re-measures the figures docs/precision.md quotes, on the CPU: each precision config trained
# for the same steps from the same seed. Writes docs/bench/precision-cpu.md (a Markdown table
# that the chapter includes verbatim) and one summary JSON per run next to it.
# Usage: scripts/precision-figures.sh [SIMPLE_STEPS] [MOBILENET_STEPS]   (default 64 and 40)
# TABLE_ONLY=1 rebuilds the table from the JSON files already there. Takes ≈ 11 min on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
simple_steps="${1:-64}"
mobilenet_steps="${2:-40}"
cargo build --release -p trainer
out=docs/bench/precision
mkdir -p "$out"
run() { # name config steps [extra trainer args...]
  local name=$1 config=$2 steps=$3
  shift 3
  target/release/trainer --config "$config" --backend cpu --max-steps "$steps" \
    --set "train.output_dir=runs/figures/$name" --overwrite --summary-json "$out/$name.json" "$@" >/dev/null
}
if [[ "${TABLE_ONLY:-}" != 1 ]]; then
  for c in f32 amp amp-accum bf16 f16-pure; do run "$c" "configs/$c.toml" "$simple_steps"; done
  # f16-pure's settings (SGD, lr 2e-5) with f32 master weights: what pure f16 loses.
  run f16-pure-mixed configs/f16-pure.toml "$simple_steps" --set precision.mode=f16-mixed
  for c in mobilenet mobilenet-amp mobilenet-bn16; do
    run "$c" "configs/$c.toml" "$mobilenet_steps"
  done
fi
label() {
  case $1 in
    f16-pure-mixed) echo '`f16-pure.toml` + `mode=f16-mixed`' ;;
    *) echo "\`$1.toml\`" ;;
  esac
}
{
  echo "| config | model | precision | BN | batch × accum | steps | loss scale at end | skipped | updates lost | final train loss | eval accuracy | images/s |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  for c in f32 amp amp-accum bf16 f16-pure f16-pure-mixed mobilenet mobilenet-amp mobilenet-bn16; do
    jq -r --arg c "$(label "$c")" '"| \($c) | \(.model) | \(.precision) | \(.batch_norm // "—") | \(.batch_size) × \(.accum_steps) | \(.steps) | \(.loss_scale) | \(.skipped_steps) | \(if .updates_lost then "\(.updates_lost * 1000 | round / 10)%" else "—" end) | \(.final_train_loss * 10000 | round / 10000) | \(.eval_accuracy * 1000 | round / 10)% | \(.images_per_sec | round) |"' "$out/$c.json"
  done
} > docs/bench/precision-cpu.md
echo "cores: $(nproc)"
cat docs/bench/precision-cpu.md
