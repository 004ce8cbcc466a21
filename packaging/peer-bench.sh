#!/usr/bin/env bash
# Side by side, every family: DiT Studio's transformer step (ditstudio-bench) against diffusers'
# eager forward of the same config (packaging/peer_step.py: FluxTransformer2DModel,
# Flux2Transformer2DModel, ZImageTransformer2DModel, QwenImageTransformer2DModel), on the same
# resolution, text length, dtype and thread count, random weights, interleaved round by round (each
# round runs every family on both sides) so both see the same machine state. Prints one row per
# family and dtype: the min step time of each side over the rounds, the ratio diffusers / DiT
# Studio (> 1: DiT Studio faster), DiT Studio's GEMM roofline (its measured GEMM FLOP/s x the
# model's FLOPs) and fraction of it, both sides' parameter counts and the BLAS core each side ran.
# Without a diffusers Python the diffusers columns say "skipped" and the rest is printed.
#
# Configs: packaging/bench-configs/<family>.json (about 70-80 M parameters each, diffusers' own
# config keys and _class_name). Token counts as the pipelines build them: WIDTH x HEIGHT pixels
# -> (H/16) x (W/16) image tokens (VAE scale 8, 2x2 patches), TEXT_LEN text tokens.
#
# Usage (repository root, after building): bash packaging/peer-bench.sh [build-dir]
# Environment:
#   PEER_PYTHON  command that runs a Python with torch + diffusers, e.g.
#                "chroot /work/lab-root env PYTHONPATH=/opt/pysrc HF_HUB_OFFLINE=1 python3"
#                (../shared/lab/setup-lab.sh builds such a Debian 13 chroot: CPU torch 2.6 and
#                diffusers from source; install libopenblas0-pthread in it first). Default: python3
#                if it can import diffusers, else none (diffusers skipped).
#   FAMILIES ("flux1 flux2-klein zimage qwenimage"); DTYPES ("float32"; bfloat16 too if wanted)
#   THREADS (1) threads for both; ROUNDS (3); STEPS (3); WARMUP (1); WIDTH/HEIGHT (256);
#   TEXT_LEN (64)
# Nothing here sets OPENBLAS_CORETYPE: each side's own start-up selection is what is measured.
# The machine's load (uptime) is printed before and after: rerun on an idle machine for figures.
set -euo pipefail
BUILD=${1:-build}
B=$BUILD/bin/ditstudio-bench
HERE=$(cd "$(dirname "$0")" && pwd)
FAMILIES=${FAMILIES:-"flux1 flux2-klein zimage qwenimage"}
THREADS=${THREADS:-1}; DTYPES=${DTYPES:-float32}; ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-3}; WARMUP=${WARMUP:-1}; W=${WIDTH:-256}; H=${HEIGHT:-256}; L=${TEXT_LEN:-64}
command -v jq >/dev/null || { echo "peer-bench: jq is needed (packaging/install-deps.sh installs it)" >&2; exit 2; }
[ -x "$B" ] || { echo "peer-bench: $B not found; build first" >&2; exit 2; }
for f in $FAMILIES; do
  [ -f "$HERE/bench-configs/$f.json" ] || { echo "peer-bench: no config $HERE/bench-configs/$f.json" >&2; exit 2; }
done

WORK=$(mktemp -d)
PEER=${PEER_PYTHON:-}
if [ -z "$PEER" ] && python3 -c "import diffusers, torch" 2>/dev/null; then PEER=python3; fi
PDIR=$WORK  # where the peer reads peer_step.py and the configs
ROOT=
if [[ "$PEER" == chroot\ * ]]; then  # a chroot sees its own file system: hand over through its /tmp
  ROOT=$(awk '{print $2}' <<<"$PEER")
  PDIR=$(mktemp -d "$ROOT/tmp/peer.XXXX")
fi
trap 'rm -rf "$WORK"; if [ -n "$ROOT" ]; then rm -rf "$PDIR"; fi' EXIT
cp "$HERE/peer_step.py" "$PDIR/"
for f in $FAMILIES; do cp "$HERE/bench-configs/$f.json" "$PDIR/"; done
PIN=${PDIR#"$ROOT"}  # the same folder as the peer sees it

peer_run() {  # family dtype -> the peer's JSON line, or nothing
  [ -n "$PEER" ] || return 0
  OMP_NUM_THREADS=$THREADS $PEER "$PIN/peer_step.py" "$PIN/$1.json" "$W" "$H" "$L" "$STEPS" "$WARMUP" \
    "$THREADS" "$2" 2>"$WORK/peer-$1-$2.err" | tail -1 | jq -c . 2>/dev/null || true
}
ours_run() {  # family dtype -> our JSON, summarised
  OMP_NUM_THREADS=$THREADS "$B" --config "$HERE/bench-configs/$1.json" --random-weights --width "$W" \
    --height "$H" --text-len "$L" --dtype "$2" --steps "$STEPS" --warmup "$WARMUP" 2>"$WORK/ours-$1-$2.err" |
    jq -c '{ms: .step_ms.min, core: .blas.core, sel: .blas.selection, params: .config.parameters,
            img: .image_tokens, txt: .text_tokens, cls: .config.transformer_class,
            roof: .gemm_roofline.fraction_of_roofline, roofms: .gemm_roofline.roofline_step_ms}'
}
better() { awk "BEGIN{exit !($1 < $2)}"; }

echo "load before: $(uptime)"
declare -A best_ours best_peer info pinfo
for r in $(seq 1 "$ROUNDS"); do
  for f in $FAMILIES; do
    for dt in $DTYPES; do
      k="$f/$dt"
      o=$(ours_run "$f" "$dt") || { echo "peer-bench: ditstudio-bench failed on $f $dt:" >&2; tail -5 "$WORK/ours-$f-$dt.err" >&2; exit 1; }
      ms=$(jq -r .ms <<<"$o")
      if [ -z "${best_ours[$k]:-}" ] || better "$ms" "${best_ours[$k]}"; then best_ours[$k]=$ms; info[$k]=$o; fi
      p=$(peer_run "$f" "$dt")
      if [ -n "$p" ]; then
        pms=$(jq -r .step_ms_min <<<"$p")
        if [ -z "${best_peer[$k]:-}" ] || better "$pms" "${best_peer[$k]}"; then best_peer[$k]=$pms; pinfo[$k]=$p; fi
      elif [ -n "$PEER" ] && [ "$r" = 1 ]; then
        echo "peer-bench: diffusers failed on $f $dt: $(tail -1 "$WORK/peer-$f-$dt.err")" >&2
      fi
    done
  done
done
echo "load after:  $(uptime)"

echo "configs: packaging/bench-configs/{${FAMILIES// /,}}.json, ${W}x${H} ($((W / 16)) x $((H / 16)) image tokens), $L text tokens, $THREADS thread(s), min of $STEPS steps x $ROUNDS interleaved rounds, random weights"
echo "diffusers: ${PEER:-skipped (no Python with diffusers; set PEER_PYTHON, see ../shared/lab/README.md)}"
printf 'family\tdtype\tparams_ours\tparams_diffusers\tditstudio_ms\tdiffusers_ms\tspeedup_vs_diffusers\tgemm_roofline_ms\tfraction_of_roofline\tblas_core_ours\tblas_core_diffusers\n'
for f in $FAMILIES; do
  for dt in $DTYPES; do
    k="$f/$dt"; o=${info[$k]}; p=${pinfo[$k]:-}
    pms=-; ratio=-; pparams=-; pcore=skipped
    if [ -n "$p" ]; then
      pms=$(printf %.1f "${best_peer[$k]}"); ratio=$(awk "BEGIN{printf \"%.2f\", ${best_peer[$k]} / ${best_ours[$k]}}")
      pparams=$(jq -r .params <<<"$p"); pcore=$(jq -r '.blas_core + ", torch " + .torch' <<<"$p")
    fi
    printf '%s (%s)\t%s\t%s\t%s\t%.1f\t%s\t%s\t%.1f\t%.2f\t%s (%s)\t%s\n' "$f" "$(jq -r .cls <<<"$o")" "$dt" \
      "$(jq -r .params <<<"$o")" "$pparams" "${best_ours[$k]}" "$pms" "$ratio" "$(jq -r .roofms <<<"$o")" \
      "$(jq -r .roof <<<"$o")" "$(jq -r .core <<<"$o")" "$(jq -r .sel <<<"$o")" "$pcore"
    if [ -n "$p" ] && [ "$(jq -r .params <<<"$o")" != "$pparams" ]; then
      echo "peer-bench: $f: parameter counts differ (ours $(jq -r .params <<<"$o"), diffusers $pparams): not the same model" >&2
    fi
    if [ "$(jq -r '.img' <<<"$o")" != "$(((W / 16) * (H / 16)))" ] || [ "$(jq -r .txt <<<"$o")" != "$L" ]; then
      echo "peer-bench: $f: ditstudio-bench ran $(jq -r .img <<<"$o") image / $(jq -r .txt <<<"$o") text tokens" >&2
    fi
  done
done
