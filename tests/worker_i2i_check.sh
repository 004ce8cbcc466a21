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
  timeout 150 $MPIRUN --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$WORKER" --model "$MODEL" --ring-degree 2 > "$OUT/log" 2>&1
rc=$?
fail() { echo "FAIL: $1"; cat "$OUT/log"; exit 1; }
[ $rc -eq 0 ] || fail "worker group exited with $rc"
n=$(grep -c '"event":"error","fatal":false' "$OUT/log")
[ "$n" -eq 7 ] || fail "expected 7 non-fatal error events, got $n"
grep -q "image file $P/golden.json is not a readable image" "$OUT/log" || fail "non-image init image"
grep -q "cannot open image file $OUT/nope.png" "$OUT/log" || fail "missing init image"
grep -q "request field 'strength' must be a finite number in (0, 1], got 1.5" "$OUT/log" || fail "strength 1.5"
grep -q "request field 'strength' must be a finite number in (0, 1], got 0" "$OUT/log" || fail "strength 0"
grep -q "unknown cache mode 'fast'" "$OUT/log" || fail "unknown cache mode"
grep -q "request field 'mask_image' needs an init_image" "$OUT/log" || fail "mask without init image"
grep -q "not the recorded 0000" "$OUT/log" || fail "SHA-256 mismatch"
grep -q '"event":"done","id":"inpaint"' "$OUT/log" || fail "inpaint after bad requests"
grep -q '"event":"done","id":"cached"' "$OUT/log" || fail "cached img2img"
grep -q 'cache taylorseer:1,2,2: image 0 computed steps \[0,1,3,5,7\] of 8' "$OUT/log" || fail "cache report"
[ -s "$OUT/inpaint.png" ] && [ -s "$OUT/cached.png" ] || fail "no images"
grep -q '"event":"bye"' "$OUT/log" || fail "no clean shutdown"
echo "worker img2img/inpaint/cache bad-input check passed"
