#!/usr/bin/env bash
# Bad request lines (including invalid UTF-8 and a duplicate live id) and an unwritable output path
# get a non-fatal error event each and the worker group keeps serving: a valid
# request afterwards produces its image, cancel of an unknown id is answered, shutdown is clean.
# Usage: worker_protocol_check.sh MPIRUN WORKER MODEL
set -uo pipefail
MPIRUN=$1 WORKER=$2 MODEL=$3
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
. "$(dirname "$0")/worker_check_lib.sh"
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
  run_group 120 || exit 1
expect_nonfatal_errors 19
expect_log "refusing to overwrite the existing file $OUT/ok.png" "existing output replaced"
expect_log 'not enough memory for 16384x16384' "no memory estimate refusal"
expect_log "request field 'guidance' must be a finite number in 0 .. 100" "guidance 1e300 accepted"
expect_log "request field 'type' is not valid UTF-8: invalid byte 0xff at byte offset 3" "UTF-8 field"
# The same id twice while the first is queued: the second is refused (live ids are unique); the
# first gets its name by date, id, index and seed.
expect_log "request id 'd' is already queued" "duplicate live id accepted"
[ "$(ls "$OUT/dir" | grep -c -- '-d-0-s7\.png$')" -eq 1 ] || { ls -l "$OUT/dir"; fail "output_dir name"; }
expect_log 'request must be a JSON object, got 42' "non-object line"
expect_log "request field 'output_dir' has the wrong type: 5" "field type"
expect_log "cancel: no queued or running request with id 'nope'" "unknown cancel"
expect_log 'multiples of 4' "size refusal"
expect_log 'cannot write image 0' "unwritable output is not fatal"
expect_log '"event":"done","id":"ok"' "valid request after bad ones"
# The ready event carries the family's record: its name, facts and capabilities.
expect_log '"family":"FLUX.1"' "ready event without the family"
expect_log '{"key":"blocks","label":"blocks","value":"2 double + 2 single"}' "ready event without the family's facts"
expect_log '"capabilities":{"img2img":true,"inpaint":true' "ready event without the capabilities"
[ -s "$OUT/ok.png" ] || fail "no image"
expect_bye
echo "worker protocol check passed"
