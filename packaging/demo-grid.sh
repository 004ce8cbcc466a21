#!/usr/bin/env bash
# The grid of docs/embedded-model.md: held-out prompts of the synthetic shapes data set (never drawn in
# training) and the embedded default model's images for them, on one rank and under tp 2,
# ulysses 2 and ring 2 (real mpirun groups), each column scored by `ditstudio-cli eval-demo`.
#
# Usage (repository root, after building): bash packaging/demo-grid.sh [build-dir] [out.png]
#   default out: resources/screenshots/demo-grid.png
# Environment: COUNT (8 prompts), STEPS (28), SEED (3), MODEL (the embedded default), CFG (true
# CFG scale with the empty negative prompt, 5 as in the model's TRAINING.md; 1 = no CFG).
# Needs ImageMagick's montage/convert for the picture (apt-get install imagemagick); the images
# and the scores are DiT Studio's own.
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-resources/screenshots/demo-grid.png}
CLI=$BUILD/bin/ditstudio-cli
COUNT=${COUNT:-8}; STEPS=${STEPS:-28}; SEED=${SEED:-3}; CFG=${CFG:-5}
GEN=(--steps "$STEPS" --seed "$SEED")
[ "$CFG" = 1 ] || GEN+=(--negative-prompt "" --true-cfg-scale "$CFG")
MODEL=${MODEL:-$BUILD/share/ditstudio/models/tiny-flux}
[ -x "$CLI" ] || { echo "demo-grid: $CLI not found; build first" >&2; exit 2; }
command -v montage > /dev/null || { echo "demo-grid: ImageMagick's montage is needed" >&2; exit 2; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

mapfile -t PROMPTS < <("$CLI" eval-demo --list-prompts --count "$COUNT")
declare -a NAMES=(one-rank tp2 ulysses2 ring2)
declare -A FLAGS=([one-rank]="" [tp2]="--tp-degree 2" [ulysses2]="--ulysses-degree 2" [ring2]="--ring-degree 2")
for n in "${NAMES[@]}"; do
  mkdir -p "$WORK/$n"
  # shellcheck disable=SC2086
  "$CLI" --model "$MODEL" --prompts "${PROMPTS[@]}" --width 64 --height 64 "${GEN[@]}" \
    ${FLAGS[$n]} --output "$WORK/$n/img.png" > "$WORK/$n.log" 2>&1 ||
    { cat "$WORK/$n.log" >&2; exit 1; }
  echo "== $n (${FLAGS[$n]:-1 rank})"
  "$CLI" eval-demo --images "$WORK/$n/img.png" --count "$COUNT" | tail -7
done

# Rows: the prompt, then its image under each strategy (nearest-neighbour x2).
heads=(); tiles=()
for h in "prompt (held out)" "${NAMES[@]}"; do
  convert -size 128x24 -background white -fill black -gravity center -pointsize 13 \
    caption:"$h" "$WORK/head-${#heads[@]}.png"
  heads+=("$WORK/head-${#heads[@]}.png")
done
for i in $(seq 0 $((COUNT - 1))); do
  convert -size 128x128 -background white -fill black -gravity west -pointsize 12 \
    caption:"${PROMPTS[$i]}" "$WORK/prompt-$i.png"
  tiles+=("$WORK/prompt-$i.png")
  for n in "${NAMES[@]}"; do
    convert "$WORK/$n/img-$i.png" -filter point -resize 200% "$WORK/$n/x2-$i.png"
    tiles+=("$WORK/$n/x2-$i.png")
  done
done
mkdir -p "$(dirname "$OUT")"
montage "${heads[@]}" -tile 5x1 -geometry '128x24+4+2' -background white "$WORK/header.png"
montage "${tiles[@]}" -tile 5x -geometry '128x128+4+4' -background white "$WORK/body.png"
convert "$WORK/header.png" "$WORK/body.png" -append "$OUT"
echo "wrote $OUT"
