#!/usr/bin/env bash
# Step time of two builds side by side, interleaved round by round: did a change make the
# transformer or the denoising step slower? Cases: FLUX.1's fixture and the 73.4 M-parameter config
# of packaging/cpu-bench.sh through ditstudio-bench (transformer steps), and FLUX.2 [klein]'s
# fixture through ditstudio-cli (whole denoising steps from the worker's progress events, so a build
# whose ditstudio-bench cannot read FLUX.2 is still compared). Prints, per case, the min step time
# of each build over the rounds and new/old (< 1: the new build is faster).
# Usage: bash packaging/compare-bench.sh OLD_BIN_DIR NEW_BIN_DIR
#   (folders holding ditstudio-bench, ditstudio-cli and ditstudio-worker)
# Environment: ROUNDS (3), THREADS (1), DTYPE (float32), NP (1; > 1 runs both under mpirun with the
# given extra strategy flags in STRATEGY, e.g. NP=2 STRATEGY="--tp-degree 2").
set -euo pipefail
OLD=${1:?old build bin dir}; NEW=${2:?new build bin dir}
ROUNDS=${ROUNDS:-3}; THREADS=${THREADS:-1}; DTYPE=${DTYPE:-float32}; NP=${NP:-1}; STRATEGY=${STRATEGY:-}
command -v jq >/dev/null || { echo "compare-bench: jq is needed" >&2; exit 2; }
cd "$(dirname "$0")/.."
CFG=$(mktemp --suffix=.json)
cat > "$CFG" <<'JSON'
{"_class_name": "FluxTransformer2DModel", "attention_head_dim": 64, "axes_dims_rope": [8, 28, 28],
 "guidance_embeds": true, "in_channels": 64, "joint_attention_dim": 512, "num_attention_heads": 8,
 "num_layers": 4, "num_single_layers": 8, "out_channels": null, "patch_size": 1,
 "pooled_projection_dim": 256}
JSON
run() {  # bin_dir, args... -> min step ms
  local bin=$1; shift
  local cmd=("$bin/ditstudio-bench" "$@" $STRATEGY)
  if [ "$NP" -gt 1 ]; then cmd=(mpirun --allow-run-as-root --oversubscribe -np "$NP" -x OMP_NUM_THREADS="$THREADS" "${cmd[@]}"); fi
  OMP_NUM_THREADS=$THREADS "${cmd[@]}" 2>/dev/null | jq -r '.step_ms.min'
}
OUTDIR=$(mktemp -d)
trap 'rm -f "$CFG"; rm -rf "$OUTDIR"' EXIT
run_cli() {  # bin_dir, args... -> min step ms
  local bin=$1; shift
  if [ "$NP" -gt 1 ]; then
    # A group: the worker's progress events (the first step excluded).
    local out
    out="$OUTDIR/$(date +%s%N).png"
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=$THREADS "$bin/ditstudio-cli" "$@" --output "$out" --json $STRATEGY 2>/dev/null |
      jq -r 'select(.event == "progress" and .step > 1) | .step_ms' | sort -g | head -1
  else
    # One rank in-process: `ditstudio-cli bench` times every step after a warm-up run.
    OMP_NUM_THREADS=$THREADS "$bin/ditstudio-cli" bench "$@" --warmup 1 2>/dev/null |
      jq -r '.step_ms | min'
  fi
}
declare -A CASES=(
  [fixture]="--model tests/data/tiny-flux-A --width 64 --height 64 --text-len 16 --steps 5 --warmup 1"
  [larger]="--config $CFG --random-weights --width 256 --height 256 --text-len 64 --steps 3 --warmup 1"
)
declare -A best_old best_new
FLUX2="--model tests/data/tiny-flux2-A --prompt a-red-square --width 128 --height 128 --steps 6 --seed 7"
for r in $(seq 1 "$ROUNDS"); do
  for c in fixture larger flux2; do
    if [ "$c" = flux2 ]; then
      # shellcheck disable=SC2086
      o=$(run_cli "$OLD" $FLUX2 --dtype "$DTYPE"); n=$(run_cli "$NEW" $FLUX2 --dtype "$DTYPE")
    else
      # shellcheck disable=SC2086
      o=$(run "$OLD" ${CASES[$c]} --dtype "$DTYPE"); n=$(run "$NEW" ${CASES[$c]} --dtype "$DTYPE")
    fi
    [ -n "$o" ] && [ -n "$n" ] || { echo "compare-bench: case $c gave no step time (old '$o', new '$n')" >&2; exit 1; }
    if [ -z "${best_old[$c]:-}" ] || awk "BEGIN{exit !($o < ${best_old[$c]})}"; then best_old[$c]=$o; fi
    if [ -z "${best_new[$c]:-}" ] || awk "BEGIN{exit !($n < ${best_new[$c]})}"; then best_new[$c]=$n; fi
  done
done
echo "old: $OLD  new: $NEW  ($DTYPE, $THREADS thread(s), np $NP ${STRATEGY}, min over $ROUNDS interleaved rounds)"
printf 'case\told_step_ms\tnew_step_ms\tnew/old\n'
for c in fixture larger flux2; do
  printf '%s\t%.2f\t%.2f\t%.3f\n' "$c" "${best_old[$c]}" "${best_new[$c]}" "$(awk "BEGIN{print ${best_new[$c]} / ${best_old[$c]}}")"
done
