#!/usr/bin/env bash
# What a lent GPU must confirm, in one run of under 8 minutes, from a release binary and the
# configs (no Rust toolchain, no registry):
#   1. the device (nvidia-smi where present) and the adapter the trainer picks;
#   2. `compare` over every shipped config: peak in use, reserved, images/s, loss; bf16 on its
#      own, since an adapter without it must refuse it (exit 2, one line) before training;
#   3. free_cache: reserved-after-step with `never` vs `step`, peak in use unchanged;
#   4. an out-of-memory: a run sized past the device, exit 3 with the ranked fixes, and the
#      checkpoint an earlier run left in the same folder still intact (it resumes);
#   5. find-batch-size against the device's real free memory (CUDA) or a budget (wgpu);
#   6. estimate against measured, from the compare report;
#   7. with more than one CUDA GPU: data parallel over two of them against one GPU at the
#      doubled micro-batch (the loss curves must agree; images/s and memory per device).
#
# usage: scripts/gpu-check.sh BACKEND OUTDIR [--small]
#   BACKEND  cuda | wgpu
#   --small  small sizes for a CPU-speed rehearsal (wgpu on llvmpipe)
#   TRAINER  the binary (default target/release/trainer)
# Everything lands in OUTDIR: one .out/.err per step, and gpu-check.md, the report.
set -uo pipefail
cd "$(dirname "$0")/.."

backend=${1:?usage: scripts/gpu-check.sh cuda|wgpu OUTDIR [--small]}
out=${2:?usage: scripts/gpu-check.sh cuda|wgpu OUTDIR [--small]}
small=${3:-}
trainer=${TRAINER:-target/release/trainer}
[[ -x "$trainer" ]] || { echo "error: no trainer binary at $trainer (set TRAINER)" >&2; exit 2; }
[[ "$backend" == cuda || "$backend" == wgpu ]] || { echo "error: BACKEND is cuda or wgpu" >&2; exit 2; }
mkdir -p "$out"
report="$out/gpu-check.md"
: >"$report"

configs=(configs/*.toml)
if [[ "$small" == --small ]]; then
    # Two steps: the first is warm-up (kernel compilation), the second is measured.
    steps=2
    # llvmpipe compiles kernels at a CPU's speed: a fresh process costs 10–90 s per model.
    compare_limit=600
    # llvmpipe has no bf16: compare the rest; the bf16 step below checks the refusal.
    configs=()
    for c in configs/*.toml; do [[ "$c" == configs/bf16.toml ]] || configs+=("$c"); done
    sets=(--set data.train_size=128 --set data.eval_size=32 --set train.batch_size=32)
    # Past llvmpipe's memory would be past this machine's: the rehearsal's "device" is a budget,
    # checked against the estimate before training.
    oom=(--set train.batch_size=512 --set memory.budget=64MiB)
    # Answer near 76 on amp.toml: 12 trials, each a fresh process.
    find=(--budget 32MiB --max-batch 256)
    export CUBECL_AUTOTUNE_LEVEL=${CUBECL_AUTOTUNE_LEVEL:-minimal}
else
    steps=20
    compare_limit=420
    sets=(--set data.train_size=4096 --set data.eval_size=512)
    # MobileNet α=1 at 1024² in f32, batch 512: several times any GPU's memory. The estimate
    # would stop it before training; --skip-memory-check makes the allocation really fail.
    oom=(--set model.width_multiplier=1 --set model.input_size=1024 --set train.batch_size=512
         --skip-memory-check)
    find=(--max-batch 65536)
fi

say() { echo "$*" | tee -a "$report"; }
# step NAME SECONDS COMMAND…: runs it with a time limit, keeps its output, reports its exit.
step() {
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout "$limit" "$@" >"$out/$name.out" 2>"$out/$name.err"
    local rc=$?
    say "- \`$name\`: exit $rc in $((SECONDS - start)) s"
    return $rc
}
block() { say '```'; cat "$@" | tee -a "$report"; say '```'; }

say "# GPU check: $backend, $(date -u +%Y-%m-%dT%H:%MZ)${small:+ (small sizes)}"
say
say "## 1. Device"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$out/nvidia-smi.out" 2>&1
    block "$out/nvidia-smi.out"
fi
step device 300 "$trainer" --config configs/amp.toml --backend "$backend" --max-steps 2 \
    "${sets[@]}" --set train.output_dir="$out/device" --overwrite
grep -E '^  (backend|warm-up|images/s|peak in use|peak measured as|predicted peak|peak reserved|reserved after step|device used peak) ' \
    "$out/device.out" >"$out/device.rows"
block "$out/device.rows"

say
say "## 2. compare over the shipped configs"
step compare "$compare_limit" "$trainer" compare "${configs[@]}" --backend "$backend" \
    --steps "$steps" "${sets[@]}" --out "$out/compare"
[[ -f "$out/compare/report.md" ]] && block "$out/compare/report.md"
say
say "bf16 on its own: exit 0 where the adapter has bf16; else exit 2, one line, nothing written."
step bf16 300 "$trainer" --config configs/bf16.toml --backend "$backend" --max-steps "$steps" \
    "${sets[@]}" --set train.output_dir="$out/bf16" --overwrite
grep -E '^  (backend|peak in use|predicted peak) ' "$out/bf16.out" >"$out/bf16.rows"
cat "$out/bf16.err" >>"$out/bf16.rows"
[[ -e "$out/bf16" ]] || echo "(no run folder written)" >>"$out/bf16.rows"
block "$out/bf16.rows"

say
say "## 3. free_cache: reserved after step"
for mode in never step; do
    step "free-cache-$mode" 300 "$trainer" --config configs/amp.toml --backend "$backend" \
        --max-steps "$steps" "${sets[@]}" --set memory.free_cache="$mode" \
        --set train.output_dir="$out/free-cache-$mode" --overwrite
    grep -E '^  (free cache|peak in use|peak reserved|reserved after step) ' \
        "$out/free-cache-$mode.out" >"$out/free-cache-$mode.rows"
    block "$out/free-cache-$mode.rows"
done

say
say "## 4. Out of memory, and the checkpoint it must not touch"
run_dir="$out/oom-run"
step oom-before 300 "$trainer" --config configs/mobilenet.toml --backend "$backend" \
    --max-steps 2 "${sets[@]}" --set train.output_dir="$run_dir" --overwrite
sha256sum "$run_dir"/checkpoint/* >"$out/oom-sums-before" 2>&1
step oom 300 "$trainer" --config configs/mobilenet.toml --backend "$backend" --max-steps 2 \
    "${sets[@]}" "${oom[@]}" --set train.output_dir="$run_dir" --overwrite
say "  (exit 3 expected)"
block "$out/oom.err"
sha256sum "$run_dir"/checkpoint/* >"$out/oom-sums-after" 2>&1
if cmp -s "$out/oom-sums-before" "$out/oom-sums-after"; then
    say "- checkpoint: unchanged (sha256 of every file)"
else
    say "- checkpoint: CHANGED"
fi
step oom-resume 300 "$trainer" --config configs/mobilenet.toml --backend "$backend" \
    --max-steps 3 "${sets[@]}" --set train.output_dir="$run_dir" \
    --resume "$run_dir/checkpoint"
grep -E '^  (steps|final train loss) ' "$out/oom-resume.out" >"$out/oom-resume.rows"
block "$out/oom-resume.rows"

say
say "## 5. find-batch-size"
step find 420 "$trainer" find-batch-size --config configs/amp.toml --backend "$backend" \
    "${find[@]}" --set train.output_dir="$out/find"
block "$out/find.out" "$out/find.err"

say
say "## 6. Estimate against measured"
say "The compare report above: 'predicted' against 'peak in use' per config."
say
say "## 7. More than one GPU"
gpus=0
if [[ "$backend" == cuda ]] && command -v nvidia-smi >/dev/null; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
fi
if (( gpus > 1 )); then
    for run in one two; do
        if [[ $run == one ]]; then
            dp=(--set train.batch_size=128)
        else
            dp=(--set train.batch_size=64 --set 'distributed.devices=["cuda:0","cuda:1"]')
        fi
        step "dp-$run" 300 "$trainer" --config configs/amp.toml --backend cuda \
            --max-steps "$steps" "${sets[@]}" "${dp[@]}" \
            --set train.output_dir="$out/dp-$run" --overwrite
        grep -E '^  (data parallel|batch|images/s|peak in use|device used peak|final train loss) ' \
            "$out/dp-$run.out" >"$out/dp-$run.rows"
        cat "$out/dp-$run.err" >>"$out/dp-$run.rows"
        block "$out/dp-$run.rows"
    done
    say "Step losses, one GPU at 128 | two GPUs at 64 each (equal up to summation order):"
    paste -d' ' <(cut -d, -f3 "$out/dp-one/steps.csv") <(cut -d, -f3 "$out/dp-two/steps.csv") \
        >"$out/dp-losses" 2>&1
    block "$out/dp-losses"
else
    say "skipped: $gpus CUDA GPU(s) visible; it needs two."
fi

say
say "Done: $report"
