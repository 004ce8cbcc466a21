// Starting a worker process group (app/PROTOCOL.md, first paragraph): the one mpirun
// command-line builder (GUI and CLI; the worker's strategy flags in it are
// protocol::strategyArgs, app/protocol/strategy_args.h), the port plan of a hostfile group and the
// port probe's ranges, and the parsing of mpirun's reports of a rank that died (OpenMPI 4
// wording). Part of dit_launcher (app/launcher/): no Torch, no Qt. The ranks (app/worker/,
// app/bench/) never include it: what they share with a launcher is in app/protocol/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "parallel/strategy.h"

namespace dit::launcher {

/// What starting a process group needs.
struct MpirunLaunch {
  std::string mpirun;    ///< launcher program; "" = defaultMpirun()
  Strategy strategy;     ///< world = mpirun -np; degrees become protocol::strategyArgs()
  std::string hostfile;  ///< optional --hostfile (surrounding blanks are trimmed)
  int omp_threads = 1;   ///< OMP_NUM_THREADS exported to every rank (-x), >= 1
  std::string worker;    ///< ditstudio-worker executable
  std::string model;     ///< --model folder
  std::vector<std::string> extra_worker_args;  ///< appended after the strategy flags
  /// Hostfile groups only: the interfaces (names such as "eth1" or CIDR subnets such as
  /// "10.0.0.0/24", comma-separated) every MPI channel may use. Without a hostfile the group is
  /// on this host and every channel is bound to loopback whatever this says.
  std::string network_interface;
  /// Single-host groups only: the ditstudio-isolate program (app/isolate_main.cpp) that runs
  /// mpirun in a network namespace of its own with only loopback up; "" = none (mpirun runs in
  /// the caller's namespace). See isolationProgram().
  std::string isolate;
  // Hostfile groups only (docs/multi-host.md):
  /// ssh options for mpirun's launch agent, appended after `-o BatchMode=yes -o
  /// ConnectTimeout=10` (never a password or host-key prompt); passed as `plm_rsh_args`.
  std::string ssh_options;
  /// TCP ports for everything the group listens on: "MIN-MAX", split by planPortRange()
  /// between the runtime's out-of-band channel (mpirun and its daemons) and the ranks' MPI
  /// channel; "" = any ephemeral port.
  std::string port_range;
  /// Extra mpirun arguments (whitespace-separated), inserted before the worker.
  std::string extra_mpirun_args;
  /// Pass --oversubscribe with a hostfile too (more ranks than the hostfile's slots).
  bool oversubscribe = false;
  /// Single-host groups only: the physical cores the ranks may use, for threadPlacementArgs();
  /// 0 = availableCores() of the calling process (the launcher runs on that host).
  int cores = 0;
};

/// One host line of an OpenMPI hostfile.
struct HostfileEntry {
  std::string host;  ///< host name or address
  int slots = -1;    ///< `slots=N`, -1 when absent
  int line = 0;      ///< 1-based line number
};

/// Hostfiles larger than this are refused (1 MiB: far beyond any cluster's host list).
inline constexpr std::size_t kMaxHostfileBytes = std::size_t(1) << 20;

/// The text of hostfile `path`, read as every file the program reads: it must be a regular file
/// (a FIFO, device such as /dev/zero, directory or socket is refused before it is opened, and it
/// is opened with O_NONBLOCK so nothing swapped in can block) of at most kMaxHostfileBytes.
/// Throws std::invalid_argument "hostfile <path> is a FIFO (named pipe), not a regular file",
/// "hostfile <path> is N bytes; hostfiles are limited to 1048576", "hostfile <path> cannot be
/// read: <strerror>".
std::string readHostfile(const std::string& path);

/// Parses OpenMPI hostfile text: `host [slots=N] [max_slots=M]`, `#` comments, blank lines.
/// Throws std::invalid_argument naming the line for a malformed `slots=` value, and for a host
/// name starting with '-' (ssh and mpirun would read it as an option).
std::vector<HostfileEntry> parseHostfile(const std::string& text);

/// Ranks per host as mpirun places them (--map-by slot: each host's slots in hostfile order).
/// Throws std::invalid_argument naming the file, line and fix when a host has no `slots=` (mpirun
/// would put every rank on the first host), when the file has no host, or when the slots hold
/// fewer than `world` ranks and `oversubscribe` is false. Pairs of {host, ranks}.
std::vector<std::pair<std::string, std::vector<int>>> planHostfile(
    const std::vector<HostfileEntry>& hosts, int world, bool oversubscribe,
    const std::string& file);

/// How a `--port-range MIN-MAX` is shared by the listeners of a hostfile group (inclusive port
/// numbers). The runtime's out-of-band channel (mpirun on the launching host and one daemon,
/// orted or prted, on every other host: `oob_tcp_dynamic_ipv4_ports`, the same name for OpenMPI
/// 4.1's ORTE and OpenMPI 5's PRRTE) gets the first quarter of the range, at least 2 and at most
/// 64 ports; the ranks' MPI channel (`btl_tcp_port_min_v4` / `btl_tcp_port_range_v4`, one
/// listening port per rank) gets the rest.
struct PortPlan {
  int min = 0, max = 0;          ///< the whole range
  int oob_min = 0, oob_max = 0;  ///< the runtime's channel
  int btl_min = 0, btl_max = 0;  ///< the ranks' channel
};

/// The fewest ports a `--port-range` may hold: 2 for the runtime's channel, 2 for the ranks.
inline constexpr int kMinPortRange = 4;

/// Splits `range` ("MIN-MAX", surrounding blanks ignored) as PortPlan describes. Throws
/// std::invalid_argument "port range 'R': expected MIN-MAX with 1024 <= MIN <= MAX <= 65535" for
/// a malformed range and "port range 'R' holds N ports; a group needs at least 4 (2 for mpirun's
/// channel, 2 for the ranks) ..." for one too small.
PortPlan planPortRange(const std::string& range);

/// The port ranges the pre-flight's port probe listens on (protocol::probeSpec of them is the
/// argument of `ditstudio-worker --probe-listen`, app/protocol/port_probe.h), one port in each:
/// the runtime's and the ranks' parts of planPortRange(port_range) (in that order), or {{0, 0}}
/// (one ephemeral port) when `port_range` is blank. Throws what planPortRange() throws.
std::vector<std::pair<int, int>> probeRanges(const std::string& port_range);

/// The names of the environment variables forwarded to every rank of a hostfile group with `-x
/// NAME` (set in this process, sorted): the product's own (DITSTUDIO_*) and the BLAS kernel and
/// thread policy that ensureBlasKernel() chose or the user set (OPENBLAS_*: OPENBLAS_CORETYPE,
/// OPENBLAS_NUM_THREADS, ...; GOMP_SPINCOUNT, OMP_WAIT_POLICY), so that a remote rank runs the
/// kernel the launching host chose instead of its own library's fallback.
std::vector<std::string> forwardedEnvironment();

/// `path` as an absolute, lexically normal path on this host (std::filesystem::absolute against
/// the current folder), so that every host of a group reads the same path; "" stays "".
std::string absoluteOnThisHost(const std::string& path);

/// Physical cores this process may run on: the distinct (package, core) pairs of the CPUs in
/// its affinity mask (sched_getaffinity; topology from /sys/devices/system/cpu/cpuN/topology),
/// so hyperthread siblings count once, as OpenMPI's `--bind-to core` counts them. Falls back to
/// the number of CPUs in the mask when the topology cannot be read; at least 1.
int availableCores();

/// mpirun options and OpenMP environment that place a single-host group's threads
/// (docs/strategies.md, "Thread placement"). When world x threads <= cores: each rank gets
/// `threads` cores of its own (`--map-by slot:PE=<threads> --bind-to core`) and its OpenMP threads
/// stay one per core (`-x OMP_PROC_BIND=close -x OMP_PLACES=cores`). Otherwise the group
/// oversubscribes the cores and `--bind-to none` lets the kernel spread the threads (binding
/// would stack several ranks' threads on the cores OpenMPI assigns; its default binds each rank
/// of a 2-rank group to one core, whatever its thread count). DITSTUDIO_THREAD_PLACEMENT=0 in the
/// environment: none of these options (OpenMPI's defaults). Throws std::invalid_argument when an
/// argument is < 1.
std::vector<std::string> threadPlacementArgs(int world, int threads, int cores);

/// The ditstudio-isolate executable in `dir` (the directory of the programs), or "" when
/// DITSTUDIO_NETWORK_ISOLATION is "0" or no such executable exists there.
std::string isolationProgram(const std::string& dir);

/// The MCA parameters that confine a group's MPI channels (OpenMPI 4 and 5). Single-host groups
/// (no hostfile): `pml ob1`, `btl ^tcp,ofi,openib,usnic,uct` (shared memory and self only: no
/// rank opens a listening socket). The runtime's out-of-band channel is confined by the
/// loopback-only network namespace of ditstudio-isolate instead of `oob_tcp_if_include lo`,
/// which OpenMPI 4.1's mpirun does not honour for its wildcard listener (open-mpi/ompi#12668)
/// and OpenMPI 5's PRRTE refuses outright on hosts with another interface (openpmix/prrte#2788:
/// "No network interfaces were found for out-of-band communications"). Hostfile groups:
/// `btl_tcp_if_include` and
/// `oob_tcp_if_include` set to `network_interface` (none when it is empty: OpenMPI's own choice).
/// Pairs of {name, value}.
std::vector<std::pair<std::string, std::string>> networkMcaParams(const MpirunLaunch& launch);

/// argv of `[ISOLATE] mpirun --allow-run-as-root --oversubscribe -np N [--mca NAME VALUE for
/// each networkMcaParams()] [threadPlacementArgs(N, T, cores)] -x OMP_NUM_THREADS=T <worker>
/// --model DIR <protocol::strategyArgs> [extra]` without a hostfile; with one: `mpirun
/// --allow-run-as-root [--oversubscribe when asked] -np N --hostfile F --bind-to none --mca
/// plm_rsh_args "-o BatchMode=yes -o ConnectTimeout=10 SSH" [network and port MCA parameters]
/// -x OMP_NUM_THREADS=T -x NAME for each forwardedEnvironment() [extra mpirun args] <worker>
/// ...`; argv[0] is the program to start: `isolate` for a single-host group when set (it
/// executes mpirun in place: same pid), else the launcher. Throws std::invalid_argument when
/// strategy.world < 1, omp_threads < 1, worker is empty, or (with a hostfile) port_range is
/// refused by planPortRange(). With a hostfile, `--model` is made absolute on this host
/// (absoluteOnThisHost): the ranks on other hosts start in their user's home folder.
std::vector<std::string> mpirunArgv(const MpirunLaunch& launch);

/// $DITSTUDIO_MPIRUN when set and non-empty, else "mpirun".
std::string defaultMpirun();

/// argv as one shell-quoted line for logs ('...' around arguments with other characters than
/// [A-Za-z0-9_./=:,+@%-]).
std::string shellQuoted(const std::vector<std::string>& argv);

/// A rank that died, as reported by mpirun on stderr.
struct RankFailure {
  int rank = -1;          ///< MPI_COMM_WORLD rank, -1 when mpirun did not name one
  std::int64_t pid = -1;  ///< pid of the rank, -1 when not reported
  int signal = -1;        ///< terminating signal, -1 when it exited
  int exit_code = -1;     ///< exit status, -1 when not reported
  std::string node;       ///< host name when reported
  /// One clause naming the rank and the cause, e.g. "rank 1 (pid 4242 on h) was killed by signal
  /// 9 (Killed)", "rank 1 exited with code 3", "rank 2 aborted the group (MPI_Abort, error code
  /// 1)", "rank 0 (pid 6012 on vm) lost its connection to a rank on mh-host-b mid-run".
  std::string reason;
  /// OpenMPI 5's peer-disconnect report (the TCP BTL saw a peer's socket close, then aborted the
  /// rank that saw it): true, with the fields below. `rank`, `pid` and `node` are then those of
  /// the rank that lost its peer (the reporter, -1 / "" when not named), not of the one that
  /// died: the suspects are the ranks on `peer_host` (WorkerSession names them from their hello
  /// events).
  bool peer_lost = false;
  std::string peer_host;  ///< "Peer host:" of the report; "" when only the abort lines came
};

/// Finds mpirun's report of a failed rank in `text` (OpenMPI 4: "mpirun noticed that process rank
/// 1 with PID 123 on node h exited on signal 9 (Killed)", "... exited with status 3", "MPI_ABORT
/// was invoked on rank 1 ... errorcode 1", "Process name: [[x,y],r]" + "Exit code: c", "Primary
/// job terminated normally, but 1 process returned"), in that order of preference; then OpenMPI
/// 5's peer disconnect (peer_lost: "An MPI communication peer process has unexpectedly
/// disconnected" with "Local host: H", "Local PID: P", "Peer host: Q", and/or "An error occurred
/// in Socket closed" + "reported by process [job,R]"), e.g. reason "rank 0 (pid 6012 on vm)
/// lost its connection to a rank on mh-host-b mid-run". nullopt when none is present.
std::optional<RankFailure> parseMpirunFailure(std::string_view text);

/// True when `line` is one of OpenMPI's lines of a rank's own abort ("[host:00000] *** An error
/// occurred in Socket closed", "[host:00000] *** MPI_ERRORS_ARE_FATAL ...": "[...] *** " after
/// any NUL bytes, their "\0" spelling, and blanks).
bool isMpiAbortLine(std::string_view line);

/// A host of the hostfile where mpirun could not start its daemon, in ssh's own words as mpirun
/// forwards them on stderr.
struct HostFailure {
  std::string host;   ///< the host ssh names; empty when it names none
  std::string cause;  ///< e.g. "ssh could not resolve the host name (Name or service not known)"
  std::string fix;    ///< sshAdvice() for ssh's words, e.g. "Fix: start sshd on H ..."
};

/// The fix for ssh's report `text` of a failed login to `host` ("" when ssh named none: "the
/// host" in prose, HOST in the commands it suggests), one sentence
/// starting with "Fix: ", fitted to the cause: "Connection refused" (sshd not running there, or
/// listening on another port: --ssh-options '-p PORT'), "Connection timed out" / "No route to
/// host" / "Network is unreachable" (wrong address, host down, or a firewall dropping port 22),
/// "Could not resolve hostname" (the name in the hostfile), "Permission denied" (this user's key
/// not installed there: ssh-copy-id, or --ssh-options '-i KEY'), "Host key verification failed"
/// (unknown or changed host key: `ssh HOST true` once, or a UserKnownHostsFile). "" when `text`
/// names none of these.
std::string sshAdvice(std::string_view text, const std::string& host);

/// Finds ssh's report of a host it could not reach in `text` (mpirun's stderr): "ssh: Could not
/// resolve hostname H: ...", "ssh: connect to host H port P: ...", "ssh: connect to host H port
/// P: Connection timed out", "USER@H: Permission denied (...)", "Host key verification failed.".
/// nullopt when there is none.
std::optional<HostFailure> parseHostFailure(std::string_view text);

}  // namespace dit::launcher
