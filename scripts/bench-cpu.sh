#!/usr/bin/env bash
# Speed benchmark (not a test): SimpleModel, f32, batch 128, Adam, on the CPU (Flex).
# Writes the run's summary to docs/bench/cpu-simple-f32.json and prints images/s.
# Usage: scripts/bench-cpu.sh [STEPS]   (default 100 optimizer steps)
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-100}"
cargo build --release -p trainer
mkdir -p docs/bench
out=docs/bench/cpu-simple-f32.json
target/release/trainer --config configs/f32.toml --backend cpu --max-steps "$steps" \
  --set train.output_dir=runs/bench --overwrite --summary-json "$out"
echo "cores: $(nproc); images/s: $(grep images_per_sec "$out")"
