#!/usr/bin/env bash
# Re-runs every measurement the book (docs/src) quotes, on the CPU, and rewrites what the
# chapters show between `<!-- figure NAME -->` and `<!-- /figure -->`: the command, its output
# or its table, and its chart (docs/src/figures/NAME.svg). No number in the book is typed by
# hand; this script is where they come from.
# Usage: scripts/book-figures.sh [NAME...]   (default: every figure; ≈ 25 min on 2 cores)
#        scripts/book-figures.sh --check [NAME...]
#   --check regenerates the deterministic, sub-second figures (estimates, the out-of-memory
#   diagnosis, config diffs; the default) with the `trainer` on PATH, writes nothing into the
#   book, and exits 1 when a chapter's text no longer matches (the drift test runs this).
#   BOOK_SRC=DIR reads the chapters from DIR instead of docs/src.
set -euo pipefail
cd "$(dirname "$0")/.."
deterministic=(estimate-simple estimate-mobilenet accum-diff amp-diff oom-diagnosis)
check=0
if [[ "${1:-}" == --check ]]; then
  check=1
  shift
  for name in "$@"; do
    [[ " ${deterministic[*]} " == *" $name "* ]] || {
      echo "book-figures: --check takes only the deterministic figures (${deterministic[*]}), not $name" >&2
      exit 2
    }
  done
  [[ $# -gt 0 ]] || set -- "${deterministic[@]}"
  command -v trainer >/dev/null || { echo "book-figures: --check needs trainer on PATH" >&2; exit 2; }
else
  cargo build --release -p trainer
  export PATH="$PWD/target/release:$PATH"
fi
export OOMLAB_NO_CUDA=1 # the book's figures are CPU figures; GPU tables are dated by hand
src=${BOOK_SRC:-docs/src}
figures=$src/figures
work=target/book-figures
if [[ $check == 1 ]]; then
  # Its own folder: checks may run side by side (the test suite does).
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$figures" "$work"
only=("$@")
drift=0

# Every measured figure says when, where and from what it was measured.
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
# Text under docs/ changes no measurement; code and configs do.
git diff --quiet HEAD -- . ':!docs' 2>/dev/null || commit="$commit with uncommitted changes"
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
on="$(date -u +%Y-%m-%d) on $(nproc) cores (${cpu:-$(uname -m)})"
stamp="Measured $on, CPU backend (Flex), commit $commit, by scripts/book-figures.sh."
# wgpu figures run on whatever Vulkan device the machine has; here, Mesa's llvmpipe.
stamp_wgpu="Measured $on, wgpu backend (Vulkan; on a machine without a GPU, Mesa's llvmpipe), commit $commit, by scripts/book-figures.sh."

wanted() { [[ ${#only[@]} -eq 0 ]] || [[ " ${only[*]} " == *" $1 "* ]]; }

# fill NAME FILE: the lines between NAME's markers in $src/*.md become FILE's. With --check,
# they are compared instead (the stamp line, which dates the run, left out of both).
fill() {
  local name=$1 file=$2 chapter
  chapter=$(grep -l -- "<!-- figure $name -->" "$src"/*.md) || {
    echo "book-figures: no <!-- figure $name --> marker in $src" >&2
    exit 1
  }
  if [[ $check == 1 ]]; then
    # The stamp dates the run. The diagnosis's absolute peaks include the CPU backend's
    # matmul slabs (threads × this CPU's L2), which differ between machines, and so does which
    # fix fits the budget: compared are its savings, their order and the commands.
    unstamped() {
      grep -v '^\*Measured .* by scripts/book-figures\.sh\.\*$' |
        sed -E -e 's/(predicted peak of this config: )[0-9.]+ MiB/\1N MiB/' \
          -e 's/→ +[0-9.]+ MiB/→ N MiB/' -e 's/ \(fits the budget\)//' || true
    }
    awk -v start="<!-- figure $name -->" '
      $0 == start { inside = 1; next }
      inside && $0 == "<!-- /figure -->" { exit }
      inside { print }' "$chapter" | unstamped >"$work/$name.book"
    if diff -u --label "$chapter ($name)" --label "the program now" \
      "$work/$name.book" <(unstamped <"$file"); then
      echo "book-figures: $name in $chapter matches the program"
    else
      echo "book-figures: $name in $chapter has drifted: run scripts/book-figures.sh $name" >&2
      drift=1
    fi
    return 0
  fi
  awk -v start="<!-- figure $name -->" -v file="$file" '
    $0 == start { print; while ((getline line < file) > 0) print line; skip = 1; next }
    skip && $0 == "<!-- /figure -->" { skip = 0 }
    !skip { print }' "$chapter" >"$chapter.tmp"
  mv "$chapter.tmp" "$chapter"
  echo "book-figures: $name → $chapter"
}

# output NAME COMMAND...: the command and what it printed (stdout and stderr), whatever its
# exit code (the out-of-memory diagnosis exits with 3 on purpose).
output() {
  local name=$1
  shift
  wanted "$name" || return 0
  {
    echo '```text'
    echo "\$ $*"
    "$@" 2>&1 || echo "(exit code $?)"
    echo '```'
    echo
    echo "*$stamp*"
  } >"$work/$name.md"
  fill "$name" "$work/$name.md"
}

# config-diff NAME A B: what changes between two configs' keys, as a unified diff (comments
# and timestamps left out).
config-diff() {
  local name=$1
  wanted "$name" || return 0
  keys() { sed -e '/^#/d' -e 's/[[:space:]]*#.*$//' "$1" | sed '/./,$!d'; }
  {
    echo '```diff'
    # diff exits 1 when the files differ, which they do.
    diff -u --label "$2" --label "$3" <(keys "$2") <(keys "$3") || true
    echo '```'
  } >"$work/$name.md"
  fill "$name" "$work/$name.md"
}

# The caption of each chart compare draws.
declare -A captions=(
  [memory]="Peak memory per config, measured and predicted"
  [terms]="The predicted peak by term (parameters, gradients, optimizer state, activations, data set in host memory) and the measured training peak"
  [steps]="Bytes in use (solid) and reserved (dashed) after each optimizer step"
  [timeline]="Bytes in use over the window that peaked: forward, then backward, then the step"
  [batch]="Training peak against batch size: the slope is the activations per image, the intercept what does not scale with the batch"
  [seq_len]="Training peak against sequence length, each config's least-squares quadratic: the seq² term is attention's scores"
)

# compare NAME [--charts a,b] ARGS...: `trainer compare ARGS --out target/book-figures/NAME`,
# its table and its charts (default memory,terms: measured vs predicted, the prediction
# stacked by term), each stamped with when and where it was measured.
compare() {
  local name=$1 charts=memory,terms chart figure_stamp=$stamp
  shift
  if [[ "${1:-}" == --charts ]]; then
    charts=$2
    shift 2
  fi
  wanted "$name" || return 0
  [[ " $* " != *" --backend wgpu "* ]] || figure_stamp=$stamp_wgpu
  # The work folder is this script's own: a second run replaces the first's reports.
  trainer compare "$@" --note "$figure_stamp" --out "$work/$name" --overwrite >/dev/null
  {
    echo '```sh'
    echo "trainer compare $* --out $work/$name"
    echo '```'
    echo
    tail -n +3 "$work/$name/report.md"
    for chart in ${charts//,/ }; do
      # memory.svg keeps the figure's own name; the others get theirs as a suffix.
      figure=$name-$chart.svg
      [[ $chart != memory ]] || figure=$name.svg
      cp "$work/$name/$chart.svg" "$figures/$figure"
      echo
      echo "![${captions[$chart]}](figures/$figure)"
    done
    echo
    echo "*$figure_stamp*"
  } >"$work/$name.md"
  fill "$name" "$work/$name.md"
}

# 1. Why training runs out of memory
output estimate-simple trainer estimate --config configs/f32.toml
output estimate-mobilenet trainer estimate --config configs/mobilenet.toml
compare batch-sizes --charts batch,terms configs/f32.toml configs/mobilenet.toml --backend cpu \
  --steps 2 --sweep train.batch_size=16,32,64,128,256 --set data.train_size=1024 --set data.eval_size=64

# 2. Fix 1: smaller batch and gradient accumulation
config-diff accum-diff configs/f32.toml configs/accum.toml
compare accumulation configs/f32.toml configs/accum.toml configs/amp.toml \
  configs/amp-accum.toml --backend cpu --steps 60

# 3. Fix 2: mixed precision
config-diff amp-diff configs/f32.toml configs/amp.toml
# One table per model, so that "vs first" is each model's own f32 run.
compare mixed-precision configs/f32.toml configs/amp.toml configs/bf16.toml \
  configs/f16-pure.toml --backend cpu --steps 60
compare mixed-precision-mobilenet configs/mobilenet.toml configs/mobilenet-amp.toml \
  configs/mobilenet-bn16.toml --backend cpu --steps 60
if wanted loss-scale; then
  trainer --config configs/amp.toml --backend cpu --max-steps 200 \
    --set precision.growth_interval=10 --set train.batch_size=32 \
    --set train.output_dir="$work/loss-scale" --overwrite >"$work/loss-scale.table"
  cp "$work/loss-scale/loss_scale.svg" "$figures/loss-scale.svg"
  {
    echo '```sh'
    echo "trainer --config configs/amp.toml --backend cpu --max-steps 200 \\"
    echo "    --set precision.growth_interval=10 --set train.batch_size=32 \\"
    echo "    --set train.output_dir=$work/loss-scale --overwrite"
    echo '```'
    echo
    echo '```text'
    grep -E '^  (precision|loss scale|skipped steps|steps|eval accuracy) ' "$work/loss-scale.table"
    echo '```'
    echo
    echo "![The loss scale over the run; red: skipped steps](figures/loss-scale.svg)"
    echo
    echo "*$stamp*"
  } >"$work/loss-scale.md"
  fill loss-scale "$work/loss-scale.md"
fi
if wanted f16-pure-fair; then
  # The fair comparison for pure f16: the same config (SGD, its learning rate), only the mode.
  for mode in f16 f16-mixed; do
    trainer --config configs/f16-pure.toml --backend cpu --max-steps 60 \
      --set precision.mode=$mode --set train.output_dir="$work/f16-pure-$mode" --overwrite \
      >"$work/f16-pure-$mode.table"
  done
  {
    echo '```sh'
    for mode in f16 f16-mixed; do
      echo "trainer --config configs/f16-pure.toml --backend cpu --max-steps 60 --set precision.mode=$mode"
    done
    echo '```'
    echo
    echo '```text'
    for mode in f16 f16-mixed; do
      grep -E '^  (precision|optimizer|updates lost|final train loss|eval accuracy) ' \
        "$work/f16-pure-$mode.table"
      [[ $mode == f16-mixed ]] || echo
    done
    echo '```'
    echo
    echo "*$stamp*"
  } >"$work/f16-pure-fair.md"
  fill f16-pure-fair "$work/f16-pure-fair.md"
fi

# 4. Fix 3: a smaller model
compare width configs/mobilenet.toml --backend cpu --steps 2 \
  --sweep model.width_multiplier=1.0,0.5,0.25 --set data.train_size=512 --set data.eval_size=64
# What the smaller model gives up: the same 200 steps of 32 images for each width (fused
# blocks: the same function, faster on the CPU).
compare width-accuracy --charts '' configs/mobilenet-fused.toml --backend cpu --steps 200 \
  --sweep model.width_multiplier=1.0,0.5,0.25 --set train.batch_size=32 --set data.eval_size=1024
# When the model is what fills the memory: a wide MobileNet at batch 1.
compare model-too-big --charts terms configs/mobilenet.toml --backend cpu --steps 2 \
  --set model.width_multiplier=2.0 --set train.batch_size=1 --set data.train_size=64 \
  --set data.eval_size=16 --sweep train.optimizer=sgd,adam

# 5. Fix 4: freeing cached memory
compare free-cache configs/amp.toml configs/amp-free-cache.toml --backend cpu --steps 40
# A real pool: wgpu (llvmpipe on a machine without a GPU).
compare free-cache-wgpu --charts steps configs/amp.toml configs/amp-free-cache.toml \
  --backend wgpu --steps 12 --set train.batch_size=32 --set data.train_size=384 \
  --set data.eval_size=32

# 6. The other causes: autograd in evaluation, leaks, autotune
compare eval-autograd --charts '' configs/f32.toml --backend cpu --steps 10 \
  --set data.train_size=1280 --set data.eval_size=1024 --sweep mistakes.eval_with_autograd=false,true
compare keep-losses --charts steps configs/f32.toml --backend cpu --steps 100 \
  --set train.batch_size=16 --set data.train_size=2048 --set data.eval_size=64 \
  --sweep mistakes.keep_losses=false,true
if wanted autotune; then
  # The search's cost: a run that searches every shape afresh (at two levels), and one whose
  # shared cache a run before it filled.
  at=(--config configs/f32.toml --backend wgpu --max-steps 4 --set train.batch_size=32
    --set data.train_size=256 --set data.eval_size=32)
  trainer "${at[@]}" --set train.output_dir="$work/autotune-prime" --overwrite >/dev/null
  runs=("autotune=minimal autotune_cache=fresh" "autotune=full autotune_cache=fresh"
    "autotune_cache=shared")
  for i in 0 1 2; do
    sets=()
    for kv in ${runs[$i]}; do sets+=(--set "backend.$kv"); done
    trainer "${at[@]}" "${sets[@]}" --set train.output_dir="$work/autotune-$i" --overwrite \
      >"$work/autotune-$i.table"
  done
  {
    echo '```sh'
    echo "trainer ${at[*]} --set backend.autotune_cache=shared   # fills the shared cache"
    for i in 0 1 2; do
      echo -n "trainer ${at[*]}"
      for kv in ${runs[$i]}; do echo -n " --set backend.$kv"; done
      echo
    done
    echo '```'
    echo
    echo '```text'
    for i in 0 1 2; do
      grep -E '^  (autotune|warm-up|images/s|peak reserved|training peak) ' "$work/autotune-$i.table"
      [[ $i == 2 ]] || echo
    done
    echo '```'
    echo
    echo "*$stamp_wgpu*"
  } >"$work/autotune.md"
  fill autotune "$work/autotune.md"
fi

# 7. Beyond the article
compare checkpointing configs/mobilenet.toml configs/mobilenet-checkpointing.toml \
  --backend cpu --steps 20
compare fused configs/f32.toml configs/amp.toml --backend cpu --steps 3 \
  --set data.eval_size=128 --sweep memory.fuse=none,blocks
compare fused-mobilenet configs/mobilenet.toml configs/mobilenet-amp.toml --backend cpu \
  --steps 3 --set data.eval_size=128 --sweep memory.fuse=none,blocks
output find-batch-size trainer find-batch-size --config configs/mobilenet.toml --backend cpu \
  --budget 512MiB --set data.train_size=1024 --set data.eval_size=64
output oom-diagnosis trainer --config configs/mobilenet.toml --backend cpu \
  --set memory.budget=100MiB

# 8. Results: every shipped config, the f32 reference first so "vs first" is against it.
compare results configs/f32.toml $(ls configs/*.toml | grep -v '^configs/f32.toml$') \
  --backend cpu --steps 20
# Where in the step each fix acts: the peak window, forward then backward.
compare timeline --charts timeline,terms configs/mobilenet.toml configs/mobilenet-amp.toml \
  configs/mobilenet-checkpointing.toml configs/mobilenet-fused.toml --backend cpu --steps 2 \
  --set data.train_size=256 --set data.eval_size=32

# 9. Transformers: sequence length, attention and checkpointing
output gpt-learns trainer --config configs/gpt-small.toml --backend cpu --max-steps 150 \
  --set model.n_layer=2 --set model.d_model=64 --set model.seq_len=32 \
  --set data.corpus_bytes=200000 --set data.eval_size=64 --set train.lr=3e-3 \
  --set train.output_dir=target/book-figures/gpt-learns --overwrite
output estimate-gpt trainer estimate --config configs/gpt-small-amp.toml --set backend.kind=cpu
compare gpt-seq-len --charts seq_len,memory configs/gpt-small.toml \
  configs/gpt-small-memory-efficient.toml --backend cpu --steps 2 \
  --sweep model.seq_len=64,128,256,512 --set data.corpus_bytes=262144 --set data.eval_size=4
compare gpt-checkpointing --charts memory,timeline configs/gpt-small.toml \
  configs/gpt-small-amp.toml --backend cpu --steps 10 --sweep memory.checkpointing=none,blocks \
  --set data.corpus_bytes=262144 --set data.eval_size=4
output gpt-find-seq-len trainer find-batch-size --config configs/gpt-small.toml --backend cpu \
  --budget 512MiB --search seq_len --set data.corpus_bytes=262144 --set data.eval_size=4 \
  --set train.output_dir=target/book-figures/gpt-find-seq-len
output gpt-find-seq-len-me trainer find-batch-size \
  --config configs/gpt-small-memory-efficient.toml --backend cpu --budget 512MiB \
  --search seq_len --set data.corpus_bytes=262144 --set data.eval_size=4 \
  --set train.output_dir=target/book-figures/gpt-find-seq-len-me

exit $drift
