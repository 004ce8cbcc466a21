// Pre-flight of a multi-host group (issue 18): before mpirun starts, every host of the hostfile
// is checked over ssh, non-interactively and in bounded time, for what the group needs there.
// Part of dit_launcher (app/launcher/): no Torch, no Qt.
#pragma once

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
/// ConnectTimeout=C [launch.ssh_options] -- HOST WORKER --model-fingerprint PATHS...` (C =
/// min(10, timeout_s)) and kills it after `timeout_s` seconds. Fails, naming the host and the fix,
/// when ssh cannot log in without a prompt (exit 255: key, host key, sshd down, unreachable), the
/// worker is missing at launch.worker (126/127), a model path is missing (3), nothing answers
/// within the time, or the fingerprint differs from `expected_fingerprint`. `paths` are the model
/// sources fingerprinted (modelFingerprint). Never throws for a host's failure.
PreflightResult preflightHost(const std::string& host, const MpirunLaunch& launch,
                              const std::vector<std::string>& paths,
                              const std::string& expected_fingerprint, double timeout_s = 20);

}  // namespace dit::launcher
