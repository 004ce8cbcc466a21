#!/usr/bin/env bash
# Issue 46's bad inputs through ditstudio-cli: each is refused with a message naming the file or
# field, the exit status is not 0, and no output file is written.
# Usage: edit_bad_inputs.sh CLI TEST_DATA
set -u
CLI=$1
DATA=$2
T=$(mktemp -d "${TMPDIR:-/tmp}/ditstudio-edit-bad-XXXXXX")
trap 'rm -rf "$T"' EXIT
K=$DATA/tiny-flux2-A
REF=$K/golden/edit_ref_0.png
fail=0
# expect NAME PATTERN ARGS...: the run fails, its output matches PATTERN, OUT is not written.
expect() {
  local name=$1 pattern=$2
  shift 2
  local out="$T/out-$name.png"
  local log
  log=$("$CLI" "$@" --prompt x --steps 1 --output "$out" 2>&1)
  local rc=$?
  if [ $rc -eq 0 ]; then echo "FAIL $name: exit 0"; fail=1; fi
  if ! grep -qE -- "$pattern" <<<"$log"; then echo "FAIL $name: no /$pattern/ in: $log"; fail=1; fi
  if [ -e "$out" ]; then echo "FAIL $name: $out was written"; fail=1; fi
  [ $rc -ne 0 ] && grep -qE -- "$pattern" <<<"$log" && [ ! -e "$out" ] && echo "ok $name: $(tail -1 <<<"$log")"
}
echo "hello" >"$T/notimage.png"
head -c 3000 "$REF" >"$T/truncated.png"
# A PNG header promising 20000 x 20000 RGB pixels (1.2 GB decoded) in a 33-byte file.
printf '\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x00\x4e\x20\x00\x00\x4e\x20\x08\x02\x00\x00\x00\x00\x00\x00\x00' >"$T/bomb.png"
# A FLUX.1 Kontext folder whose model_index.json lost its pipeline class.
mkdir -p "$T/kontext-noclass"
for c in scheduler text_encoder text_encoder_2 tokenizer tokenizer_2 transformer vae; do
  ln -s "$DATA/tiny-flux-A/$c" "$T/kontext-noclass/$c"
done
grep -v '"_class_name": "FluxKontextPipeline"' "$DATA/tiny-flux-kontext-A/model_index.json" \
  >"$T/kontext-noclass/model_index.json"

expect not_an_image "reference image 1: .*notimage.png is not a readable image" --model "$K" --image "$T/notimage.png"
expect truncated "reference image 1: .*truncated.png is cut short" --model "$K" --image "$T/truncated.png"
expect bomb "reference image 1: .*bomb.png" --model "$K" --image "$T/bomb.png"
expect too_many "7 reference images given; Flux2KleinPipeline takes at most 6" --model "$K" \
  --image "$REF" --image "$REF" --image "$REF" --image "$REF" --image "$REF" --image "$REF" --image "$REF"
expect model_takes_none "reference images are not supported for FLUX.1 \(FluxPipeline\)" \
  --model "$DATA/tiny-flux-A" --image "$REF"
expect kontext_takes_one "2 reference images given; FluxKontextPipeline takes at most 1" \
  --model "$DATA/tiny-flux-kontext-A" --image "$REF" --image "$REF"
expect too_small "reference image 1 .*kontext_ref_2.png. is 30x26 pixels; both sides must be at least 64" \
  --model "$K" --image "$DATA/tiny-flux-A/golden/kontext_ref_2.png"
expect with_init_image "reference images and an init image cannot be combined" --model "$K" \
  --image "$REF" --init-image "$REF"
expect missing_file "reference image 1: .*no-such-file.png" --model "$K" --image "$T/no-such-file.png"
expect kontext_without_class "model_index.json: no \"_class_name\"" --model "$T/kontext-noclass" --image "$REF"
exit $fail
