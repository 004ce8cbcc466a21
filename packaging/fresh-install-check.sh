#!/usr/bin/env bash
# Installs the built .deb on a fresh Debian 12 (a minbase debootstrap chroot, root and network to
# the Debian mirror required) and checks the desktop entry, the CLI on 1 and 2 ranks, the headless
# main job and the GUI (offscreen, real worker) there. Usage (after `cd build && cpack -G DEB`):
#   sudo bash packaging/fresh-install-check.sh build/ditstudio_*_amd64.deb [/tmp/fresh]
set -euo pipefail
DEB=$(readlink -f "$1")
ROOT=${2:-/tmp/ditstudio-fresh}
command -v debootstrap > /dev/null || apt-get install -y -qq debootstrap
[ -d "$ROOT/usr" ] || debootstrap --variant=minbase bookworm "$ROOT" http://deb.debian.org/debian
cp "$DEB" "$ROOT/tmp/ditstudio.deb"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
mount -t proc proc "$ROOT/proc"
mount --bind /dev "$ROOT/dev"
trap 'umount "$ROOT/proc" "$ROOT/dev"' EXIT
chroot "$ROOT" bash -ec '
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends /tmp/ditstudio.deb
  cd /tmp
  grep -q "^Exec=ditstudio" /usr/share/applications/ditstudio.desktop
  test -f /usr/share/icons/hicolor/scalable/apps/ditstudio.svg
  OMP_NUM_THREADS=1 ditstudio-cli --prompt "fresh machine" --width 32 --height 32 --steps 2 --overwrite --output /tmp/one.png
  OMP_NUM_THREADS=1 ditstudio-cli --prompt "fresh machine" --width 32 --height 32 --steps 2 --tp-degree 2 --overwrite --output /tmp/two.png
  env -u DISPLAY ditstudio
  QT_QPA_PLATFORM=offscreen ditstudio --screenshot /tmp/gui.png --auto-generate
  ls -la /tmp/one.png /tmp/two.png /tmp/ditstudio-output.png /tmp/gui.png'
echo "fresh install check passed; GUI screenshot: $ROOT/tmp/gui.png"
