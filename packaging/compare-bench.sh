#!/usr/bin/env bash
# Step time of two builds of ditstudio-bench side by side, interleaved round by round, on the fixture
# and on the 73.4 M-parameter config of packaging/cpu-bench.sh: did a change make the transformer
# slower? Prints, per case, the min step time of each build over the rounds and new/old (< 1: the
# new build is faster).
# Usage: bash packaging/compare-bench.sh OLD_BIN_DIR NEW_BIN_DIR   (folders holding ditstudio-bench)
# Environment: ROUNDS (3), THREADS (1), DTYPE (float32), NP (1; > 1 runs both under mpirun with the
# given extra strategy flags in STRATEGY, e.g. NP=2 STRATEGY="--tp-degree 2").
set -euo pipefail
OLD=${1:?old build bin dir}; NEW=${2:?new build bin dir}
ROUNDS=${ROUNDS:-3}; THREADS=${THREADS:-1}; DTYPE=${DTYPE:-float32}; NP=${NP:-1}; STRATEGY=${STRATEGY:-}
command -v jq >/dev/null || { echo "compare-bench: jq is needed" >&2; exit 2; }
cd "$(dirname "$0")/.."
CFG=$(mktemp --suffix=.json)
trap 'rm -f "$CFG"' EXIT
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
declare -A CASES=(
  [fixture]="--model tests/data/tiny-flux-A --width 64 --height 64 --text-len 16 --steps 5 --warmup 1"
  [larger]="--config $CFG --random-weights --width 256 --height 256 --text-len 64 --steps 3 --warmup 1"
)
declare -A best_old best_new
for r in $(seq 1 "$ROUNDS"); do
  for c in fixture larger; do
    # shellcheck disable=SC2086
    o=$(run "$OLD" ${CASES[$c]} --dtype "$DTYPE"); n=$(run "$NEW" ${CASES[$c]} --dtype "$DTYPE")
    if [ -z "${best_old[$c]:-}" ] || awk "BEGIN{exit !($o < ${best_old[$c]})}"; then best_old[$c]=$o; fi
    if [ -z "${best_new[$c]:-}" ] || awk "BEGIN{exit !($n < ${best_new[$c]})}"; then best_new[$c]=$n; fi
  done
done
echo "old: $OLD  new: $NEW  ($DTYPE, $THREADS thread(s), np $NP ${STRATEGY}, min over $ROUNDS interleaved rounds)"
printf 'case\told_step_ms\tnew_step_ms\tnew/old\n'
for c in fixture larger; do
  printf '%s\t%.2f\t%.2f\t%.3f\n' "$c" "${best_old[$c]}" "${best_new[$c]}" "$(awk "BEGIN{print ${best_new[$c]} / ${best_old[$c]}}")"
done
