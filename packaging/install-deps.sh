#!/usr/bin/env bash
# Installs the Debian 12 packages DiT Studio needs to build, test and run.
# Usage: sudo bash packaging/install-deps.sh   (runs apt-get; root or sudo required)
set -euo pipefail
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
PKGS=(
  build-essential cmake ninja-build pkg-config git
  libtorch-dev libopenblas0-pthread
  libopenmpi-dev openmpi-bin
  qt6-base-dev qt6-charts-dev libqt6opengl6-dev libgl-dev libxkbcommon-dev
  libspdlog-dev libfmt-dev libstb-dev nlohmann-json3-dev
  libsentencepiece-dev libpcre2-dev libicu-dev libcli11-dev
  libgtest-dev libgmock-dev
  xvfb xauth fonts-dejavu-core
  zlib1g-dev file dpkg-dev jq
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "install-deps: all packages present"
