#!/usr/bin/env bash
# Side by side: DiT Studio's transformer step against diffusers' FluxTransformer2DModel (eager) on
# the same config, resolution, text length, dtype and thread count, interleaved round by round so
# both see the same machine state. Prints one table row per dtype: min step time of each (over the
# rounds), the ratio diffusers / DiT Studio (> 1: DiT Studio faster), the BLAS core DiT Studio ran
# and its GEMM roofline fraction. Without a diffusers Python it prints DiT Studio's figures and the
# GEMM roofline (measured GEMM FLOP/s x model FLOPs) as the reference.
#
# Usage (repository root, after building): bash packaging/peer-bench.sh [build-dir]
# Environment:
#   PEER_PYTHON  command that runs a Python with torch + diffusers, e.g.
#                "chroot /var/tmp/dit-lab env PYTHONPATH=/opt/pysrc HF_HUB_OFFLINE=1 python3"
#                (../shared/lab/setup-lab.sh builds such a Debian 13 chroot: CPU torch 2.6 and
#                diffusers from source; install libopenblas0-pthread in it first). Default: python3
#                if it can import diffusers, else none.
#   THREADS (1)  threads for both; DTYPES ("float32 bfloat16"); ROUNDS (3); STEPS (3); WARMUP (1)
#   WIDTH/HEIGHT (256), TEXT_LEN (64)
# Nothing here sets OPENBLAS_CORETYPE: DiT Studio's own start-up selection is what is measured.
set -euo pipefail
BUILD=${1:-build}
B=$BUILD/bin/ditstudio-bench
THREADS=${THREADS:-1}; DTYPES=${DTYPES:-"float32 bfloat16"}; ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-3}; WARMUP=${WARMUP:-1}; W=${WIDTH:-256}; H=${HEIGHT:-256}; L=${TEXT_LEN:-64}
command -v jq >/dev/null || { echo "peer-bench: jq is needed (packaging/install-deps.sh installs it)" >&2; exit 2; }
[ -x "$B" ] || { echo "peer-bench: $B not found; build first" >&2; exit 2; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# The 73.4 M-parameter FLUX.1-architecture config of packaging/cpu-bench.sh.
CFG=$WORK/config.json
cat > "$CFG" <<'JSON'
{"_class_name": "FluxTransformer2DModel", "attention_head_dim": 64, "axes_dims_rope": [8, 28, 28],
 "guidance_embeds": true, "in_channels": 64, "joint_attention_dim": 512, "num_attention_heads": 8,
 "num_layers": 4, "num_single_layers": 8, "out_channels": null, "patch_size": 1,
 "pooled_projection_dim": 256}
JSON
# diffusers' eager forward, random weights, the same inputs' shapes as ditstudio-bench.
cat > "$WORK/peer_step.py" <<'PY'
import json, sys, time, torch
from diffusers import FluxTransformer2DModel
cfg, W, H, L, steps, warm, th, dtn = sys.argv[1], *map(int, sys.argv[2:8]), sys.argv[8]
dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtn]
torch.set_num_threads(th); torch.manual_seed(0)
c = json.load(open(cfg)); c.pop("_class_name", None)
m = FluxTransformer2DModel(**c).to(dt).eval()
h, w = H // 16, W // 16; S = h * w
x = torch.randn(1, S, c["in_channels"], dtype=dt); e = torch.randn(1, L, c["joint_attention_dim"], dtype=dt)
p = torch.randn(1, c["pooled_projection_dim"], dtype=dt)
ids = torch.zeros(S, 3); ids[:, 1] = torch.arange(h).repeat_interleave(w); ids[:, 2] = torch.arange(w).repeat(h)
t = torch.tensor([0.5], dtype=dt); g = torch.tensor([3.5], dtype=dt) if c.get("guidance_embeds") else None
ts = []
with torch.inference_mode():
    for i in range(warm + steps):
        t0 = time.perf_counter()
        m(hidden_states=x, encoder_hidden_states=e, pooled_projections=p, timestep=t, img_ids=ids,
          txt_ids=torch.zeros(L, 3), guidance=g, return_dict=False)
        if i >= warm: ts.append((time.perf_counter() - t0) * 1e3)
print(json.dumps({"torch": torch.__version__, "step_ms_min": min(ts)}))
PY

PEER=${PEER_PYTHON:-}
if [ -z "$PEER" ] && python3 -c "import diffusers, torch" 2>/dev/null; then PEER=python3; fi
peer_run() {  # dtype -> min ms or empty
  [ -n "$PEER" ] || return 0
  local dir=$WORK
  # A chroot sees its own file system: hand the files over through its /tmp.
  if [[ "$PEER" == chroot\ * ]]; then
    local root; root=$(awk '{print $2}' <<<"$PEER")
    dir=$(mktemp -d "$root/tmp/peer.XXXX"); cp "$CFG" "$WORK/peer_step.py" "$dir/"
    dir=${dir#"$root"}
  fi
  OMP_NUM_THREADS=$THREADS $PEER "$dir/peer_step.py" "$dir/config.json" "$W" "$H" "$L" "$STEPS" "$WARMUP" "$THREADS" "$1" 2>/dev/null |
    tail -1 | jq -r '.step_ms_min'
  if [[ "$PEER" == chroot\ * ]]; then rm -rf "${root:?}$dir"; fi
}
ours_run() {  # dtype -> json line
  OMP_NUM_THREADS=$THREADS "$B" --config "$CFG" --random-weights --width "$W" --height "$H" --text-len "$L" \
    --dtype "$1" --steps "$STEPS" --warmup "$WARMUP" 2>/dev/null |
    jq -c '{ms: .step_ms.min, core: .blas.core, sel: .blas.selection, roof: .gemm_roofline.fraction_of_roofline, roofms: .gemm_roofline.roofline_step_ms}'
}

declare -A best_ours best_peer info
for r in $(seq 1 "$ROUNDS"); do
  for dt in $DTYPES; do
    o=$(ours_run "$dt"); ms=$(jq -r .ms <<<"$o")
    if [ -z "${best_ours[$dt]:-}" ] || awk "BEGIN{exit !($ms < ${best_ours[$dt]})}"; then best_ours[$dt]=$ms; info[$dt]=$o; fi
    p=$(peer_run "$dt" || true)
    if [ -n "$p" ] && [ "$p" != null ]; then
      if [ -z "${best_peer[$dt]:-}" ] || awk "BEGIN{exit !($p < ${best_peer[$dt]})}"; then best_peer[$dt]=$p; fi
    fi
  done
done

echo "config: 73.4 M-parameter FLUX.1 architecture, ${W}x${H} (${W}/16 x ${H}/16 image tokens), $L text tokens, $THREADS thread(s), min of $STEPS steps x $ROUNDS interleaved rounds"
echo "peer: ${PEER:-none (no Python with diffusers; set PEER_PYTHON)}"
printf 'dtype\tditstudio_ms\tdiffusers_ms\tspeedup_vs_diffusers\tgemm_roofline_ms\tfraction_of_roofline\tblas_core\n'
for dt in $DTYPES; do
  o=${info[$dt]}; p=${best_peer[$dt]:-}
  ratio=-; [ -n "$p" ] && ratio=$(awk "BEGIN{printf \"%.2f\", $p / ${best_ours[$dt]}}")
  printf '%s\t%.1f\t%s\t%s\t%.1f\t%.2f\t%s (%s)\n' "$dt" "${best_ours[$dt]}" "${p:+$(printf %.1f "$p")}" "$ratio" \
    "$(jq -r .roofms <<<"$o")" "$(jq -r .roof <<<"$o")" "$(jq -r .core <<<"$o")" "$(jq -r .sel <<<"$o")"
done
