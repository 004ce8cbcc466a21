// Pre-flight of a multi-host group (issue 18): before mpirun starts, every host of the hostfile
// is checked over ssh, non-interactively and in bounded time, for what the group needs there.
// Part of dit_launcher (app/launcher/): no Torch, no Qt.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "app/launcher/launch.h"

namespace dit::launcher {

/// True when `host` names this machine: "localhost", a 127.x.x.x / ::1 address, this machine's
/// host name, or an address of one of its interfaces (getifaddrs).
bool isLocalHost(const std::string& host);

/// What one host's check found.
struct PreflightResult {
  std::string host;
  bool ok = false;
  std::string fingerprint;  ///< the host's model fingerprint when read
  std::string message;      ///< on failure: the host, the cause and the fix
  double seconds = 0;       ///< how long the check took
};

/// Checks `host` for the group described by `launch`: runs `ssh -o BatchMode=yes -o
/// ConnectTimeout=C [launch.ssh_options] -- HOST 'WORKER --probe-listen SPEC S & WORKER
/// --model-fingerprint PATHS...; ...'` (the two side by side, the fingerprint's exit code first;
/// C = min(10, timeout_s), S = min(10, timeout_s / 2) seconds; SPEC =
/// protocol::probeSpec(probeRanges(launch.port_range))) and kills it after `timeout_s` seconds.
/// When the worker there says which ports it listens on, this machine connects to each
/// (protocol::probeConnect, app/protocol/port_probe.h; at most 5 s each). Fails, naming the host
/// and the fix, when ssh cannot log in without a prompt (exit 255; the fix follows ssh's words,
/// sshAdvice: refused, timed out, key, host key, name), the worker is missing at launch.worker
/// (126/127), a model path is missing (3), nothing answers within the time, the fingerprint
/// differs from `expected_fingerprint`, or a probed port cannot be reached from here (naming the
/// port, its part of the range and the cause). `paths` are the files fingerprinted
/// (protocol::modelFingerprint, app/protocol/file_fingerprint.h): the model sources and, when
/// listed, launch.worker itself; a difference in the worker's entry is named apart ("host H runs a
/// different worker binary: PATH differs (size A here, B there). Fix: install the same DiT Studio
/// build at the same path on every host"), one in the model's as "host H holds a different model
/// at M (fingerprint F, this machine G): PATH differs (same size). Fix: copy the same checkpoint
/// to the same path on every host". Never throws for a host's failure; a malformed
/// launch.port_range is returned as the failure's message.
PreflightResult preflightHost(const std::string& host, const MpirunLaunch& launch,
                              const std::vector<std::string>& paths,
                              const std::string& expected_fingerprint, double timeout_s = 20);

/// The state of process `pid` on `host`, asked over ssh (`ssh -o BatchMode=yes -o
/// ConnectTimeout=C [ssh_options] -- HOST` reading /proc/PID/stat; killed after `timeout_s`
/// seconds): "stopped (state T: SIGSTOP or a debugger)", "running (state S)" or "exited"; ""
/// when the host does not answer within the time (a link that is down) or pid <= 0. For naming
/// a rank that stopped answering (issue 36): stopped, not cut off. Never throws.
std::string remoteProcessState(const std::string& host, std::int64_t pid,
                               const std::string& ssh_options, double timeout_s = 10);

}  // namespace dit::launcher
