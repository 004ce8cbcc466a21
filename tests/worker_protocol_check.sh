#!/usr/bin/env bash
# Bad request lines (including invalid UTF-8 and a duplicate live id) and an unwritable output path
# get a non-fatal error event each and the worker group keeps serving: a valid
# request afterwards produces its image, cancel of an unknown id is answered, shutdown is clean.
# Usage: worker_protocol_check.sh MPIRUN WORKER MODEL
set -uo pipefail
MPIRUN=$1 WORKER=$2 MODEL=$3
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
printf '%s\n' '42' '[1,2]' 'null' '{"type":5}' '{"type":"cancel","id":5}' '{"type":"generate","id":5}' \
  '{"type":"generate","id":"x","output_dir":5}' '{"type":"generate","id":"y","preview_every":"a"}' \
  '{"type":"generate","id":"z","prompts":[1,2]}' '{}' 'garbage' '{"type":"cancel","id":"nope"}' \
  '{"type":"generate","id":"w","width":30,"height":32}' "$(printf '{"type":"gen\xff"}')" \
  '{"type":"generate","id":"ro","width":32,"height":32,"steps":1,"max_sequence_length":48,"output":"/proc/nope/x.png"}' \
  '{"type":"generate","id":"ok","width":32,"height":32,"steps":2,"max_sequence_length":48,"output":"'"$OUT"'/ok.png"}' \
  '{"type":"generate","id":"again","width":32,"height":32,"steps":1,"max_sequence_length":48,"output":"'"$OUT"'/ok.png"}' \
  '{"type":"generate","id":"huge","width":16384,"height":16384,"steps":1}' \
  '{"type":"generate","id":"big","guidance":1e300}' \
  '{"type":"generate","id":"d","seed":7,"width":32,"height":32,"steps":1,"max_sequence_length":48,"output_dir":"'"$OUT"'/dir"}' \
  '{"type":"generate","id":"d","seed":7,"width":32,"height":32,"steps":1,"max_sequence_length":48,"output_dir":"'"$OUT"'/dir"}' \
  '{"type":"shutdown"}' |
  timeout 120 $MPIRUN --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$WORKER" --model "$MODEL" --ring-degree 2 > "$OUT/log" 2>&1
rc=$?
fail() { echo "FAIL: $1"; cat "$OUT/log"; exit 1; }
[ $rc -eq 0 ] || fail "worker group exited with $rc"
[ "$(grep -c '"event":"error","fatal":false' "$OUT/log")" -eq 19 ] || fail "expected 19 non-fatal error events"
grep -q "refusing to overwrite the existing file $OUT/ok.png" "$OUT/log" || fail "existing output replaced"
grep -q 'not enough memory for 16384x16384' "$OUT/log" || fail "no memory estimate refusal"
grep -q "request field 'guidance' must be a finite number in 0 .. 100" "$OUT/log" || fail "guidance 1e300 accepted"
grep -q "request field 'type' is not valid UTF-8: invalid byte 0xff at byte offset 3" "$OUT/log" || fail "UTF-8 field"
# The same id twice while the first is queued: the second is refused (live ids are unique); the
# first gets its name by date, id, index and seed.
grep -q "request id 'd' is already queued" "$OUT/log" || fail "duplicate live id accepted"
[ "$(ls "$OUT/dir" | grep -c -- '-d-0-s7\.png$')" -eq 1 ] || { ls -l "$OUT/dir"; fail "output_dir name"; }
grep -q 'request must be a JSON object, got 42' "$OUT/log" || fail "non-object line"
grep -q "request field 'output_dir' has the wrong type: 5" "$OUT/log" || fail "field type"
grep -q "cancel: no queued or running request with id 'nope'" "$OUT/log" || fail "unknown cancel"
grep -q 'multiples of 4' "$OUT/log" || fail "size refusal"
grep -q 'cannot write image 0' "$OUT/log" || fail "unwritable output is not fatal"
grep -q '"event":"done","id":"ok"' "$OUT/log" || fail "valid request after bad ones"
[ -s "$OUT/ok.png" ] || fail "no image"
grep -q '"event":"bye"' "$OUT/log" || fail "no clean shutdown"
echo "worker protocol check passed"
