// Port probe of the multi-host pre-flight (issue 36): before mpirun starts, the launching host
// checks that it can open a TCP connection to each other host on the ports the group will
// listen on there (the `--port-range`, or an ephemeral port without one), so that a firewall
// that drops them fails the start in seconds, naming the host and the port, instead of leaving
// mpirun waiting on TCP's retries (137 s). The remote side is `ditstudio-worker --probe-listen
// SPEC SECONDS` (runProbeListener), run over the pre-flight's ssh call; the launcher connects
// with probeConnect() to the ports it prints. Also the advice both ends give when MPI traffic
// between the hosts does not get through (hostNetworkAdvice). The wire between a launcher
// (app/launcher/, which plans the ranges: probeRanges) and its ranks (app/worker/); part of
// dit_protocol (app/protocol/): no Torch, no Qt.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace dit::protocol {

/// `ranges` (the launcher's probeRanges()) as the probe's command-line argument:
/// "MIN-MAX,MIN-MAX" ("0-0" for an ephemeral port).
std::string probeSpec(const std::vector<std::pair<int, int>>& ranges);

/// Parses probeSpec()'s text back. Throws std::invalid_argument naming the text when it is not
/// a comma-separated list of MIN-MAX with 0 <= MIN <= MAX <= 65535.
std::vector<std::pair<int, int>> parseProbeSpec(const std::string& spec);

/// The remote side (`ditstudio-worker --probe-listen SPEC SECONDS`): binds one TCP port on every
/// IPv4 address in each range of `spec` (the first free one), writes `probe listening P1 P2 ...`
/// to stdout, then accepts one connection on each until all came or `seconds` passed, and writes
/// `probe connected` or `probe timeout`. Returns the exit code: 0 all connected, 4 timed out, 5
/// no free port in a range (`probe no free port in MIN-MAX` on stdout), 2 a malformed spec.
int runProbeListener(const std::string& spec, double seconds);

/// Opens a TCP connection to `host` (name or address) on `port` within `timeout_s` seconds and
/// closes it. Returns "" on success, else the cause: "connection refused", "no answer within N
/// s" (a firewall dropping packets), "cannot resolve HOST: ...", or strerror's text.
std::string probeConnect(const std::string& host, int port, double timeout_s);

/// The advice for a hostfile group whose ranks cannot exchange MPI traffic, whichever way the
/// group then ends (a start-up collective timing out under OpenMPI 4, a peer's socket closing
/// under OpenMPI 5): the shared-subnet trap, --network-interface, a firewall. One sentence, no
/// trailing period. The ranks put it in their collective-timeout error, the launcher
/// (WorkerSession) in the failure it reports for a lost peer.
std::string hostNetworkAdvice();

}  // namespace dit::protocol
