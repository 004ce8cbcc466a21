#!/usr/bin/env bash
# Install test: installs the build tree into a temporary prefix (as the .deb / .tar.gz do) and
# checks that the installed programs work from there on the embedded default model, and that the
# desktop integration files are in place. Usage: install_check.sh BUILD_DIR
set -euo pipefail
BUILD=$1
PREFIX=$(mktemp -d)
trap 'rm -rf "$PREFIX"' EXIT
cmake --install "$BUILD" --prefix "$PREFIX" > "$PREFIX.log" 2>&1 || { cat "$PREFIX.log"; exit 1; }
unset DITSTUDIO_MODEL_DIR DITSTUDIO_SPM_MODULE
for f in bin/ditstudio-cli bin/ditstudio-worker bin/ditstudio-bench bin/ditstudio-make-model bin/ditstudio-server \
         lib/ditstudio/libdit_spm.so share/ditstudio/models/tiny-flux/model_index.json \
         share/ditstudio/models/tiny-flux/transformer/diffusion_pytorch_model.safetensors; do
  [ -e "$PREFIX/$f" ] || { echo "missing in the installed tree: $f"; exit 1; }
done
if [ -e "$BUILD/bin/ditstudio" ]; then
  for f in bin/ditstudio share/applications/ditstudio.desktop \
           share/icons/hicolor/scalable/apps/ditstudio.svg share/ditstudio/presets/builtin-presets.json; do
    [ -e "$PREFIX/$f" ] || { echo "missing in the installed tree: $f"; exit 1; }
  done
  grep -q '^Exec=ditstudio' "$PREFIX/share/applications/ditstudio.desktop" || { echo "desktop file has no Exec=ditstudio"; exit 1; }
  if command -v desktop-file-validate > /dev/null; then desktop-file-validate "$PREFIX/share/applications/ditstudio.desktop"; fi
fi
# The installed CLI on the installed default model (found relative to the executable), one rank
# and two ranks through the installed worker.
cd "$PREFIX"
OMP_NUM_THREADS=1 "$PREFIX/bin/ditstudio-cli" --prompt "install test" --width 32 --height 32 --steps 2 --output "$PREFIX/one.png"
OMP_NUM_THREADS=1 "$PREFIX/bin/ditstudio-cli" --prompt "install test" --width 32 --height 32 --steps 2 --tp-degree 2 --output "$PREFIX/two.png"
[ -s "$PREFIX/one.png" ] && [ -s "$PREFIX/two.png" ] || { echo "no image written"; exit 1; }
echo "install check passed: $PREFIX"
