#!/usr/bin/env bash
# Makes a folder written by ditstudio-train the embedded default model: copies its own files into
# resources/models/tiny-flux (the trained transformer and VAE, their configs, the scheduler, the
# pipeline index and tokenizer_2's config with the trained text length). The frozen CLIP/T5
# encoders and tokenizers are the fixture's (tests/data/tiny-flux-A) and are not copied: the build
# assembles build/share/ditstudio/models/tiny-flux from both (app/CMakeLists.txt). Refuses a
# folder whose encoders differ from the fixture's, since the build would pair the trained weights
# with other encoders.
# Usage (repository root): bash packaging/embed-model.sh TRAINED_DIR
set -euo pipefail
SRC=${1:?usage: embed-model.sh TRAINED_DIR}
FIX=tests/data/tiny-flux-A
DST=resources/models/tiny-flux
for c in text_encoder text_encoder_2 tokenizer; do
  diff -rq "$SRC/$c" "$FIX/$c" > /dev/null ||
    { echo "embed-model: $SRC/$c differs from $FIX/$c (train with --template $FIX)" >&2; exit 1; }
done
rm -rf "$DST.new"
mkdir -p "$DST.new/transformer" "$DST.new/vae" "$DST.new/scheduler" "$DST.new/tokenizer_2"
cp "$SRC/model_index.json" "$DST.new/"
cp "$SRC/scheduler/scheduler_config.json" "$DST.new/scheduler/"
cp "$SRC/tokenizer_2/tokenizer_config.json" "$DST.new/tokenizer_2/"
for c in transformer vae; do
  cp "$SRC/$c/config.json" "$SRC/$c/diffusion_pytorch_model.safetensors" "$DST.new/$c/"
done
[ -f "$DST/TRAINING.md" ] && cp "$DST/TRAINING.md" "$DST.new/"
rm -rf "$DST"
mv "$DST.new" "$DST"
du -sh "$DST"
