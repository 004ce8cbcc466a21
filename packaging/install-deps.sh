#!/usr/bin/env bash
# Installs the Debian packages DiT Studio needs to build, test and run.
# Usage: sudo bash packaging/install-deps.sh [--cuda]   (runs apt-get; root or sudo required)
#
# Platforms (detected from /etc/os-release):
#   Debian 12 (bookworm): LibTorch 1.13 (CPU), Qt 6.4, OpenMPI 4.1.
#   Debian 13 (trixie):   LibTorch 2.6 (CPU, libtorch-dev), Qt 6.8, OpenMPI 5.
#   Debian 13 --cuda:     LibTorch 2.6 for CUDA 12.4 (libtorch-cuda-dev, contrib), NCCL 2.22
#                         (libnccl-dev, non-free) and the CUDA 12.4 toolkit (nvidia-cuda-toolkit,
#                         non-free) in place of the CPU LibTorch; contrib and non-free must be
#                         enabled in the APT sources. Then build with `cmake --preset gpu`.
#                         cuDNN caveat: libtorch-cuda-dev depends on `nvidia-cudnn`, an installer
#                         package whose post-install step downloads cuDNN from NVIDIA's servers;
#                         without that access its configuration fails and LibTorch's CUDA library
#                         cannot load. packaging/debian13-check.sh compiles and links the GPU build
#                         without cuDNN (-Wl,--allow-shlib-undefined) and runs nothing.
# Any other distribution: install the equivalents by hand, or use PyTorch's LibTorch 2.x CUDA
# archive with -DCMAKE_PREFIX_PATH (see packaging/gpu-check.sh).
set -euo pipefail
CUDA=0
for a in "$@"; do
  case "$a" in
    --cuda) CUDA=1 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "install-deps: unknown option '$a' (expected --cuda)" >&2; exit 2 ;;
  esac
done
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

ID="" VERSION_ID="" VERSION_CODENAME=""
if [ -r /etc/os-release ]; then
  # shellcheck disable=SC1091
  . /etc/os-release
fi
case "${ID}:${VERSION_ID:-}:${VERSION_CODENAME:-}" in
  debian:12:*|debian:*:bookworm) DEBVER=12 ;;
  debian:13:*|debian:*:trixie) DEBVER=13 ;;
  *)
    echo "install-deps: unsupported system '${PRETTY_NAME:-unknown}' (Debian 12 or 13 expected)." >&2
    echo "  Install LibTorch, OpenMPI, Qt 6 (Widgets, Charts), spdlog, fmt, stb, nlohmann-json," >&2
    echo "  sentencepiece, PCRE2, ICU, CLI11, GoogleTest and zlib by hand (see README.md)." >&2
    exit 1 ;;
esac
if [ "$CUDA" = 1 ] && [ "$DEBVER" != 13 ]; then
  echo "install-deps: --cuda needs Debian 13 (Debian 12 has no CUDA LibTorch); on other systems" >&2
  echo "  use PyTorch's LibTorch 2.x CUDA archive (see packaging/gpu-check.sh)." >&2
  exit 1
fi

PKGS=(
  build-essential cmake ninja-build pkg-config git
  libopenblas0-pthread
  libopenmpi-dev openmpi-bin
  qt6-base-dev qt6-charts-dev libqt6opengl6-dev libgl-dev libxkbcommon-dev
  libspdlog-dev libfmt-dev libstb-dev nlohmann-json3-dev
  libsentencepiece-dev libpcre2-dev libicu-dev libcli11-dev
  libxxhash-dev  # content hashes that the ranks of a multi-host group compare
  libgtest-dev libgmock-dev
  xvfb xauth fonts-dejavu-core
  dbus-daemon  # test_ui_desktop: the taskbar progress signal on a private D-Bus session bus
  zlib1g-dev libssl-dev file dpkg-dev jq
  openssh-client openssh-server  # multi-host groups (ssh) and the `multihost` test (sshd)
  iproute2  # the `multihost` test: network namespaces and a veth pair (ip netns, ip link)
  nftables  # the `multihost` test's firewall on its second host (--port-range)
  curl  # the `multihost` test's server case asks ditstudio-server over HTTP
  libcpp-httplib-dev libwebp-dev  # ditstudio-server: HTTP (server-sent events) and WebP output
  nodejs  # the server tests drive it with the official `openai` npm client (tests/server/client)
  chromium  # server_page: the server's page in headless Chromium
)
# npm: Debian's package, unless an npm is already installed (NodeSource's nodejs bundles one and
# conflicts with Debian's npm).
if ! command -v npm > /dev/null 2>&1; then PKGS+=(npm); fi
# The format test (tests/format.cmake) needs the clang-format the tree is formatted with: 14,
# Debian 12's. Debian 13 ships newer ones only; there the test is not registered (configure says so).
if [ "$DEBVER" = 12 ]; then PKGS+=(clang-format-14); fi
if [ "$CUDA" = 1 ]; then
  # libtorch-cuda-dev replaces (conflicts with) the CPU libtorch-dev.
  PKGS+=(libtorch-cuda-dev libnccl-dev nvidia-cuda-toolkit)
else
  PKGS+=(libtorch-dev)
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  if [ "$CUDA" = 1 ]; then
    for p in libtorch-cuda-dev libnccl-dev nvidia-cuda-toolkit; do
      cand=$(apt-cache policy "$p" 2>/dev/null | sed -n 's/^ *Candidate: *//p')
      if [ -z "$cand" ] || [ "$cand" = "(none)" ]; then
        echo "install-deps: no candidate for $p: enable the 'contrib non-free' components in" >&2
        echo "  /etc/apt/sources.list (or sources.list.d/debian.sources) and run again." >&2
        exit 1
      fi
    done
  fi
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "install-deps: all packages present (Debian $DEBVER$([ "$CUDA" = 1 ] && echo ', CUDA'))"
