#!/usr/bin/env bash
# Two simulated hosts for the `multihost` tests (issue 18): network namespaces mh<id>-a
# (10.77.0.1, where the command runs: the launcher and rank 0) and mh<id>-b (10.77.0.2, sshd with a
# generated host key, root's login by a generated user key only), joined by a veth pair. Host b
# also has a mount namespace of its own in which WORK/model and WORK/out are bind mounts of
# WORK/model-b and WORK/out-b, so a test can give the second host another checkpoint at the same
# path, or see where a result was written. 10.77.0.9 is a host that silently drops packets (a
# static neighbour entry with a MAC nobody has).
# Usage: multihost_env.sh FIXTURE COMMAND...   runs COMMAND in host a with MH_WORK, MH_HOSTFILE,
# MH_SSH_OPTIONS, MH_MODEL, MH_MODEL_B, MH_OUT, MH_OUT_B, MH_NS_B (host b's namespace), MH_VETH_B (its end of the veth pair) exported. Where the namespaces or the veth
# pair cannot be created (not root, no CAP_NET_ADMIN), COMMAND runs once with MH_SKIP_REASON set
# instead, and every test skips with that reason (GTEST_SKIP). openssh-server missing is a failure
# (packaging/install-deps.sh installs it). Everything it made is removed on exit, failure included.
set -uo pipefail
FIXTURE=$1
shift
skip() {
  echo "multihost: skipped: $*" >&2
  MH_SKIP_REASON="$*" "${CMD[@]}"
  exit $?
}
fail() { echo "multihost: $*" >&2; exit 1; }
CMD=("$@")
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces and a veth pair"
SSHD=$(command -v sshd || echo /usr/sbin/sshd)
[ -x "$SSHD" ] || fail "needs openssh-server (sshd): sudo bash packaging/install-deps.sh"
command -v ssh >/dev/null || fail "needs openssh-client (ssh): sudo bash packaging/install-deps.sh"
command -v ssh-keygen >/dev/null || fail "needs ssh-keygen (openssh-client)"

ID=$$
NA=mh$ID-a NB=mh$ID-b
WORK=$(mktemp -d /tmp/ditstudio-multihost.XXXXXX)
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  # Every process of either host (sshd, ranks, mpirun's daemons, a stuck launcher), then the
  # namespaces themselves (the veth pair goes with them).
  for n in "$NB" "$NA"; do
    for p in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  done
  [ -f "$WORK/sshd.pid" ] && kill -9 "$(cat "$WORK/sshd.pid")" 2>/dev/null
  ip netns del "$NA" 2>/dev/null
  ip netns del "$NB" 2>/dev/null
  rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT INT TERM

ip netns add "$NA" 2>"$WORK/netns.err" ||
  skip "cannot create a network namespace (ip netns add: $(head -c 200 "$WORK/netns.err"))"
ip netns add "$NB" 2>"$WORK/netns.err" ||
  skip "cannot create a second network namespace ($(head -c 200 "$WORK/netns.err"))"
ip link add "v$ID-a" netns "$NA" type veth peer name "v$ID-b" netns "$NB" 2>"$WORK/netns.err" ||
  skip "cannot create a veth pair ($(head -c 200 "$WORK/netns.err"))"
# `ip netns exec` remounts / and /sys for the namespace; inside a chroot (/ not a mount point) the
# kernel refuses, and no host can be simulated there.
ip netns exec "$NA" true 2>"$WORK/netns.err" ||
  skip "ip netns exec is refused here ($(head -c 200 "$WORK/netns.err" | tr '\n' ' ')); inside a chroot / is not a mount point"
ip -n "$NA" addr add 10.77.0.1/24 dev "v$ID-a"
ip -n "$NB" addr add 10.77.0.2/24 dev "v$ID-b"
for n in "$NA" "$NB"; do ip -n "$n" link set lo up; done
ip -n "$NA" link set "v$ID-a" up
ip -n "$NB" link set "v$ID-b" up
ip -n "$NA" neigh add 10.77.0.9 lladdr 02:00:00:00:77:09 dev "v$ID-a" nud permanent

mkdir -p "$WORK/model" "$WORK/model-b" "$WORK/out" "$WORK/out-b" "$WORK/ssh"
cp -r "$FIXTURE"/. "$WORK/model/"
cp -r "$FIXTURE"/. "$WORK/model-b/"
ssh-keygen -q -t ed25519 -N '' -f "$WORK/ssh/host_key" || exit 1
ssh-keygen -q -t ed25519 -N '' -f "$WORK/ssh/user_key" || exit 1
cp "$WORK/ssh/user_key.pub" "$WORK/ssh/authorized_keys"
echo "10.77.0.2 $(cat "$WORK/ssh/host_key.pub")" > "$WORK/ssh/known_hosts"
cat > "$WORK/ssh/sshd_config" <<CFG
ListenAddress 10.77.0.2
HostKey $WORK/ssh/host_key
AuthorizedKeysFile $WORK/ssh/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile $WORK/sshd.pid
CFG
mkdir -p /run/sshd
# Host b: its own host name, mount and network namespace; sshd (and every rank it starts) sees
# the bind mounts.
ip netns exec "$NB" unshare --mount --uts --propagation private bash -c "
  hostname mh-host-b
  mount --bind '$WORK/model-b' '$WORK/model' && mount --bind '$WORK/out-b' '$WORK/out' &&
  exec '$SSHD' -f '$WORK/ssh/sshd_config' -E '$WORK/sshd.log'" || fail "cannot start sshd in host b"
for _ in $(seq 50); do [ -s "$WORK/sshd.pid" ] && break; sleep 0.1; done
[ -s "$WORK/sshd.pid" ] || { cat "$WORK/sshd.log" >&2; fail "sshd did not start in host b"; }

printf '10.77.0.1 slots=1\n10.77.0.2 slots=1\n' > "$WORK/hostfile"
export MH_WORK=$WORK MH_HOSTFILE=$WORK/hostfile MH_MODEL=$WORK/model MH_MODEL_B=$WORK/model-b
export MH_OUT=$WORK/out MH_OUT_B=$WORK/out-b MH_NS_B=$NB MH_VETH_B=v$ID-b
export MH_SSH_OPTIONS="-i $WORK/ssh/user_key -o UserKnownHostsFile=$WORK/ssh/known_hosts -o StrictHostKeyChecking=yes"
export OMP_NUM_THREADS=1
ip netns exec "$NA" "${CMD[@]}"
