#!/usr/bin/env bash
# Issue 14 bad input through the worker group (2 ranks, ring 2): an init image that is not an
# image or does not exist, strength outside (0, 1], an unknown cache mode, a mask without an init
# image, a changed init image (SHA-256 of a recalled request) each get one clear non-fatal error
# event, and the group keeps serving: an inpaint request whose mask has another size than the
# output (resized, as diffusers does) and a cached img2img request then make their images, the
# cache report is logged, and shutdown is clean.
# Usage: worker_i2i_check.sh MPIRUN WORKER MODEL
set -uo pipefail
MPIRUN=$1 WORKER=$2 MODEL=$3
P="$MODEL/pipelines"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
. "$(dirname "$0")/worker_check_lib.sh"
base='"width":32,"height":32,"steps":4,"max_sequence_length":48'
printf '%s\n' \
  '{"type":"generate","id":"notimg",'"$base"',"init_image":"'"$P"'/golden.json"}' \
  '{"type":"generate","id":"missing",'"$base"',"init_image":"'"$OUT"'/nope.png"}' \
  '{"type":"generate","id":"s15",'"$base"',"init_image":"'"$P"'/input_32x24.png","strength":1.5}' \
  '{"type":"generate","id":"s0",'"$base"',"init_image":"'"$P"'/input_32x24.png","strength":0}' \
  '{"type":"generate","id":"cache",'"$base"',"cache":"fast:2"}' \
  '{"type":"generate","id":"maskonly",'"$base"',"mask_image":"'"$P"'/mask_32x24.png"}' \
  '{"type":"generate","id":"sha",'"$base"',"init_image":"'"$P"'/input_32x24.png","init_image_sha256":"'"$(printf '0%.0s' $(seq 64))"'"}' \
  '{"type":"generate","id":"inpaint",'"$base"',"init_image":"'"$P"'/input_32x24.png","mask_image":"'"$P"'/input_32x24.png","strength":0.9,"output":"'"$OUT"'/inpaint.png"}' \
  '{"type":"generate","id":"cached",'"$base"',"steps":8,"init_image":"'"$P"'/input_32x24.png","strength":1.0,"cache":"taylorseer:1,2,2","output":"'"$OUT"'/cached.png"}' \
  '{"type":"shutdown"}' |
  run_group 150 || exit 1
expect_nonfatal_errors 7
expect_log "image file $P/golden.json is not a readable image" "non-image init image"
expect_log "cannot open image file $OUT/nope.png" "missing init image"
expect_log "request field 'strength' must be a finite number in (0, 1], got 1.5" "strength 1.5"
expect_log "request field 'strength' must be a finite number in (0, 1], got 0" "strength 0"
expect_log "unknown cache mode 'fast'" "unknown cache mode"
expect_log "request field 'mask_image' needs an init_image" "mask without init image"
expect_log "not the recorded 0000" "SHA-256 mismatch"
expect_log '"event":"done","id":"inpaint"' "inpaint after bad requests"
expect_log '"event":"done","id":"cached"' "cached img2img"
expect_log 'cache taylorseer:1,2,2: image 0 computed steps [0,1,3,5,7] of 8' "cache report"
[ -s "$OUT/inpaint.png" ] && [ -s "$OUT/cached.png" ] || fail "no images"
expect_bye
echo "worker img2img/inpaint/cache bad-input check passed"
