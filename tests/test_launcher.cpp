// dit_launcher without Torch, Qt or MPI: GroupProcess's streams, exit status and teardown policy
// (shutdown line honoured; a child that ignores SIGTERM; a grandchild in a session of its own that
// ignores SIGTERM and would outlive mpirun), and WorkerSession's state machine, queue, cancel,
// fatal-event dedup and failure attribution against a scripted bash stand-in for
// "mpirun ... ditstudio-worker" that speaks app/PROTOCOL.md.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "app/launcher/group_process.h"
#include "app/launcher/group_start.h"
#include "app/launcher/host_group.h"
#include "app/launcher/launch.h"
#include "app/launcher/preflight.h"
#include "app/launcher/worker_session.h"
#include "app/protocol/file_fingerprint.h"
#include "app/protocol/port_probe.h"

namespace fs = std::filesystem;
using namespace dit::launcher;
using namespace std::chrono_literals;
using Stream = GroupProcess::Stream;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/dit-launcher-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

bool pidAlive(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return false;
  const auto close = stat.rfind(')');
  const char state = close + 2 < stat.size() ? stat[close + 2] : '?';
  return state != 'Z' && state != 'X';
}

pid_t readPid(const fs::path& file, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    std::ifstream in(file);
    long pid = 0;
    if (in >> pid && pid > 0) return static_cast<pid_t>(pid);
    std::this_thread::sleep_for(20ms);
  }
  return -1;
}

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST(GroupProcess, LinesAndExitStatus) {
  GroupProcess g;
  g.start({"bash", "-c", "echo out1; echo err1 >&2; echo 'out 2'; printf partial; exit 3"});
  std::vector<std::string> out, err;
  const auto st = g.wait(
      10s, [&](Stream s, const std::string& l) { (s == Stream::Stdout ? out : err).push_back(l); });
  ASSERT_TRUE(st.has_value());
  EXPECT_TRUE(st->exited);
  EXPECT_EQ(st->code, 3);
  EXPECT_EQ(st->shellCode(), 3);
  // Complete lines; the partial last one once the stream ended.
  for (const std::string& l : g.read(Stream::Stdout)) out.push_back(l);
  if (std::string rest = g.flushPartial(Stream::Stdout); !rest.empty()) out.push_back(rest);
  EXPECT_EQ(out, (std::vector<std::string>{"out1", "out 2", "partial"}));
  EXPECT_EQ(err, (std::vector<std::string>{"err1"}));
  EXPECT_NE(g.stderrTail().find("err1"), std::string::npos);
}

TEST(GroupProcess, EnvironmentAndOwnProcessGroup) {
  GroupProcess g;
  g.start({"bash", "-c", "echo \"$DIT_TEST_VALUE\"; ps -o pgid= -p $$"},
          {{"DIT_TEST_VALUE", "v1"}});
  std::vector<std::string> out;
  g.wait(10s, [&](Stream s, const std::string& l) {
    if (s == Stream::Stdout) out.push_back(l);
  });
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0], "v1");
  EXPECT_EQ(std::stol(out[1]), static_cast<long>(g.pid()));  // leader of its own group
  EXPECT_NE(::getpgrp(), g.pid());
}

TEST(GroupProcess, MissingProgramFailsAtStart) {
  GroupProcess g;
  try {
    g.start({"/nonexistent/dir/no-such-mpirun", "-np", "2"});
    FAIL() << "expected an exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot start /nonexistent/dir/no-such-mpirun"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(g.running());
  EXPECT_THROW(g.start({}), std::invalid_argument);
}

TEST(GroupProcess, ShutdownLineEndsACooperativeChild) {
  GroupProcess g;
  g.start({"bash", "-c", "read line; echo \"got $line\"; exit 0"});
  const auto t0 = std::chrono::steady_clock::now();
  const auto st = g.terminate("{\"type\":\"shutdown\"}", GroupProcess::Teardown{5000ms, 3000ms});
  ASSERT_TRUE(st.has_value());
  EXPECT_LT(secondsSince(t0), 3.0);
  EXPECT_TRUE(st->exited);
  EXPECT_EQ(st->code, 0);  // exited by itself: no signal was needed
}

TEST(GroupProcess, ChildIgnoringSigtermIsKilled) {
  GroupProcess g;
  g.start({"bash", "-c", "trap '' TERM; echo ready; while :; do sleep 0.05; done"});
  // Wait until the trap is installed.
  bool ready = false;
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!ready && std::chrono::steady_clock::now() < until) {
    for (const std::string& l : g.read(Stream::Stdout)) ready |= l == "ready";
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(ready);
  const auto t0 = std::chrono::steady_clock::now();
  const auto st = g.terminate("", GroupProcess::Teardown{200ms, 500ms});
  ASSERT_TRUE(st.has_value());
  EXPECT_FALSE(st->exited);
  EXPECT_EQ(st->signal, SIGKILL);
  EXPECT_EQ(st->shellCode(), 128 + SIGKILL);
  const double s = secondsSince(t0);
  EXPECT_GE(s, 0.6);  // SIGTERM at 0.2 s was ignored; SIGKILL at 0.7 s
  EXPECT_LT(s, 3.0);
}

TEST(GroupProcess, GrandchildInItsOwnSessionIsEnded) {
  // As mpirun's ssh sessions: a descendant in a process group (here a session) of its own that
  // ignores SIGTERM and holds the output pipe. The teardown ends it too.
  TempDir dir;
  const fs::path pidFile = dir.path / "grandchild.pid";
  GroupProcess g;
  g.start({"bash", "-c",
           "setsid bash -c 'trap \"\" TERM; echo $$ > " + pidFile.string() +
               "; while :; do sleep 0.05; done' & wait"});
  const pid_t grandchild = readPid(pidFile, 10s);
  ASSERT_GT(grandchild, 0);
  ASSERT_TRUE(pidAlive(grandchild));
  EXPECT_NE(::getpgid(grandchild), g.pid());  // not reachable through the process group
  const auto t0 = std::chrono::steady_clock::now();
  const auto st = g.terminate("", GroupProcess::Teardown{100ms, 500ms});
  ASSERT_TRUE(st.has_value());
  // The grandchild was reparented when its parent died, and is ended all the same.
  const auto until = std::chrono::steady_clock::now() + 3s;
  while (pidAlive(grandchild) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(pidAlive(grandchild)) << "grandchild " << grandchild << " survived the teardown";
  EXPECT_LT(secondsSince(t0), 3.0);
  EXPECT_NE(std::find(g.signalledDescendants().begin(), g.signalledDescendants().end(), grandchild),
            g.signalledDescendants().end());
}

TEST(LineBuffer, SplitsAndBoundsLines) {
  LineBuffer b(8);
  EXPECT_EQ(b.feed("ab\r\ncd"), (std::vector<std::string>{"ab"}));
  EXPECT_EQ(b.feed("e\n0123456789abcdef\nx"), (std::vector<std::string>{"cde", "01234567"}));
  EXPECT_EQ(b.flush(), "x");
  EXPECT_EQ(b.flush(), "");
}

// ------------------------------------------------------------------------------ WorkerSession

namespace {

// A stand-in for "mpirun -np N ditstudio-worker" (FAKE_MODE: ok, fatal, fatal_hang, crash).
const char kFakeWorker[] = R"SH(
mode=${FAKE_MODE:-ok}
rule=--------------------------------------------------------------------------
if [ "$mode" = ssh_refused ] || [ "$mode" = unknown_block ]; then
  [ "$mode" = ssh_refused ] && echo "ssh: connect to host 10.0.0.7 port 22: Connection refused" >&2
  printf '%s\nORTE was unable to reliably start one or more daemons.\n%s\n' "$rule" "$rule" >&2
  exit 1
fi
echo "library noise"
host0=h host1=h
if [ "$mode" = peer_lost ] || [ "$mode" = peer_lost_start ]; then host0=vm host1=mh-host-b; fi
echo '@@DIT {"event":"hello","rank":0,"world":2,"pid":5000,"host":"'$host0'"}'
echo '@@DIT {"event":"hello","rank":1,"world":2,"pid":5001,"host":"'$host1'"}'
if [ "$mode" = peer_lost_start ]; then cat "$FAKE_DIR/openmpi5.txt" >&2; exit 14; fi
echo '@@DIT {"event":"status","stage":"loading","message":"loading"}'
echo '@@DIT {"event":"ready","world":2,"strategy":{},"model":{},"load_seconds":0.1}'
id_of() { printf '%s' "$1" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p'; }
while IFS= read -r line; do
  echo "$line" >> "$FAKE_DIR/requests.txt"
  case "$line" in
    *'"type":"shutdown"'*) echo '@@DIT {"event":"bye"}'; exit 0 ;;
    *'"type":"cancel"'*) echo "@@DIT {\"event\":\"cancelled\",\"id\":\"$(id_of "$line")\",\"step\":1}" ;;
    *'"type":"generate"'*)
      id=$(id_of "$line")
      case "$line" in  # rank 0's refusals at the door (app/PROTOCOL.md): no `accepted` follows
        *REFUSE_NOID*)
          echo '@@DIT {"event":"error","id":null,"rank":0,"message":"request line longer than 16777216 bytes refused unread","fatal":false,"refused":true}'
          continue ;;
        *REFUSE_ID*)
          echo "@@DIT {\"event\":\"error\",\"id\":\"$id\",\"rank\":0,\"message\":\"request is not valid JSON\",\"fatal\":false,\"refused\":true}"
          continue ;;
      esac
      echo "@@DIT {\"event\":\"accepted\",\"id\":\"$id\",\"queue_position\":0}"
      echo "@@DIT {\"event\":\"ranks\",\"ranks\":[{\"rank\":0,\"stage\":\"denoising\",\"step\":1,\"steps\":2},{\"rank\":1,\"stage\":\"denoising\",\"step\":1,\"steps\":2}]}"
      echo "@@DIT {\"event\":\"progress\",\"id\":\"$id\",\"step\":1,\"steps\":2,\"step_ms\":5,\"eta_s\":0.005,\"image_index\":0}"
      case "$mode" in
        fatal|fatal_hang)
          ev='@@DIT {"event":"error","id":null,"rank":1,"message":"boom","fatal":true}'
          echo "$ev"
          echo "[rank 0/2] da$ev" >&2
          echo "[rank 1] fatal: boom" >&2
          if [ "$mode" = fatal_hang ]; then trap '' TERM; while :; do sleep 0.05; done; fi
          exit 1 ;;
        fatal_two)  # rank 0's timeout names the cause; rank 1, woken by the teardown, times out too
          ev0='@@DIT {"event":"error","id":null,"rank":0,"message":"collective timeout: rank 1 is stopped","fatal":true}'
          ev1='@@DIT {"event":"error","id":null,"rank":1,"message":"collective timeout: rank 0 did not answer","fatal":true}'
          echo "$ev0"; echo "$ev0" >&2
          echo "$ev1"; echo "$ev1" >&2
          exit 1 ;;
        crash)
          echo "mpirun noticed that process rank 1 with PID 0 on node h exited on signal 9 (Killed)." >&2
          exit 137 ;;
        peer_lost)  # OpenMPI 5's report of rank 1's death, as prterun forwards it
          cat "$FAKE_DIR/openmpi5.txt" >&2
          exit 14 ;;
        exit_quietly)
          exit 14 ;;
      esac
      if [ -n "$FAKE_SLOW" ]; then sleep "$FAKE_SLOW"; fi
      echo "@@DIT {\"event\":\"image\",\"id\":\"$id\",\"image_index\":0,\"path\":\"/tmp/x.png\",\"seed\":18446744073709551615,\"params\":{},\"rank\":0,\"seconds\":0.1,\"cache\":null}"
      echo "@@DIT {\"event\":\"done\",\"id\":\"$id\",\"seconds\":0.2}" ;;
  esac
done
)SH";

struct Recorder : SessionObserver {
  std::vector<State> states;
  std::vector<std::string> done, cancelled, failedRequests, events, output, debug;
  std::vector<GroupFailure> errors, groupFailures;
  std::vector<int> stopped;
  void stateChanged(State s) override { states.push_back(s); }
  void event(const dit::protocol::Event& raw, const dit::protocol::WorkerEvent&) override {
    events.push_back(raw.type);
  }
  void requestDone(const std::string& id, double) override { done.push_back(id); }
  void requestCancelled(const std::string& id, int) override { cancelled.push_back(id); }
  void requestFailed(const std::string& id, const std::string&) override {
    failedRequests.push_back(id);
  }
  void errorReported(const GroupFailure& f) override { errors.push_back(f); }
  void groupFailed(const GroupFailure& f) override { groupFailures.push_back(f); }
  void groupStopped(int code) override { stopped.push_back(code); }
  void outputLine(GroupProcess::Stream, const std::string& l) override { output.push_back(l); }
  void logLine(int, const std::string& level, const std::string& text) override {
    if (level == "debug") debug.push_back(text);
  }
};

class SessionTest : public ::testing::Test {
 protected:
  TempDir dir;
  SessionLaunch launch(const std::string& mode) {
    const fs::path script = dir.path / "fake-worker.sh";
    std::ofstream(script) << kFakeWorker;
    SessionLaunch l;
    l.argv = {"bash", script.string()};
    l.env = {{"FAKE_MODE", mode}, {"FAKE_DIR", dir.path.string()}};
    l.world = 2;
    return l;
  }
  template <class Pred>
  static bool pollUntil(WorkerSession& s, Pred done, std::chrono::seconds timeout = 10s) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (!done()) {
      if (std::chrono::steady_clock::now() >= end) return false;
      s.pollOnce(100ms);
    }
    return true;
  }
};

using State = WorkerSession::State;

}  // namespace

TEST_F(SessionTest, StateMachineQueueAndStop) {
  Recorder r;
  WorkerSession s(&r, "t1");
  EXPECT_EQ(s.state(), State::Stopped);
  EXPECT_FALSE(s.start(SessionLaunch{}));  // nothing to start
  ASSERT_TRUE(s.start(launch("ok")));
  EXPECT_FALSE(s.start(launch("ok")));  // already running
  EXPECT_EQ(s.state(), State::Starting);
  // Held until `ready`, then sent; ids carry the tag.
  dit::protocol::GenerateRequest g;
  g.params.steps = 2;
  const std::string id = s.submit(g);
  EXPECT_EQ(id, "r1-t1");
  EXPECT_FALSE(s.queue().front().sent);
  ASSERT_TRUE(pollUntil(s, [&] { return !r.done.empty(); }));
  EXPECT_EQ(r.done, std::vector<std::string>{id});
  EXPECT_EQ(s.state(), State::Ready);
  EXPECT_TRUE(s.queue().empty());
  EXPECT_EQ(s.rankPids().at(1), 5001);
  EXPECT_EQ(s.world(), 2);
  EXPECT_EQ(s.readyInfo().at("world"), 2);
  EXPECT_EQ(s.stage(), "idle");
  // Unsent cancel is local; unknown ids are refused.
  EXPECT_FALSE(s.cancel("nope"));
  s.stop(2000ms);
  EXPECT_EQ(s.state(), State::Stopping);  // the exit is handled on the next turn of the loop
  ASSERT_TRUE(pollUntil(s, [&] { return s.state() == State::Stopped; }));
  EXPECT_EQ(r.stopped, std::vector<int>{0});
  EXPECT_EQ(r.states, (std::vector<State>{State::Starting, State::Ready, State::Busy, State::Ready,
                                          State::Stopping, State::Stopped}));
  EXPECT_TRUE(r.groupFailures.empty());
  // Noise reached the output, events did not.
  EXPECT_NE(std::find(r.output.begin(), r.output.end(), "library noise"), r.output.end());
  for (const auto& l : r.output) EXPECT_EQ(l.find("@@DIT"), std::string::npos) << l;
  std::ifstream req(dir.path / "requests.txt");
  std::string first, last, line;
  std::getline(req, first);
  while (std::getline(req, line)) last = line;
  EXPECT_NE(first.find("\"id\":\"r1-t1\""), std::string::npos) << first;
  EXPECT_EQ(last, "{\"type\":\"shutdown\"}");
}

TEST_F(SessionTest, StopCancelsUnsentAndSent) {
  Recorder r;
  WorkerSession s(&r, "t2");
  ::setenv("FAKE_SLOW", "30", 1);  // the request runs until cancelled (the fake ignores it)
  ASSERT_TRUE(s.start(launch("ok")));
  ::unsetenv("FAKE_SLOW");
  ASSERT_TRUE(pollUntil(s, [&] { return s.state() == State::Ready; }));
  const std::string a = s.submit({});
  ASSERT_TRUE(pollUntil(s, [&] { return s.queue().front().step == 1; }));
  EXPECT_EQ(s.state(), State::Busy);
  EXPECT_EQ(s.activeId(), a);
  // A sent request that never ends and a group that ignores the shutdown while busy: the
  // teardown policy ends it after the grace.
  const auto t0 = std::chrono::steady_clock::now();
  s.stop(300ms);
  ASSERT_TRUE(pollUntil(
      s, [&] { return s.state() == State::Stopped; }, 10s));
  EXPECT_LT(secondsSince(t0), 5.0);
  EXPECT_EQ(r.cancelled, std::vector<std::string>{a});  // interrupted: reported cancelled
  EXPECT_TRUE(s.queue().empty());
}

TEST_F(SessionTest, FatalErrorOnBothStreamsIsReportedOnce) {
  Recorder r;
  WorkerSession s(&r);
  ASSERT_TRUE(s.start(launch("fatal")));
  s.submit({});
  s.submit({});
  ASSERT_TRUE(pollUntil(s, [&] { return s.state() == State::Failed; }));
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_TRUE(r.errors[0].fatal);
  EXPECT_EQ(r.errors[0].rank, 1);
  EXPECT_EQ(r.errors[0].pid, 5001);
  ASSERT_EQ(r.groupFailures.size(), 1u);
  EXPECT_EQ(r.groupFailures[0].message, "rank 1: boom");
  EXPECT_NE(r.groupFailures[0].detail.find("[rank 1] fatal: boom"), std::string::npos);
  EXPECT_EQ(r.groupFailures[0].detail.find("@@DIT"), std::string::npos);
  EXPECT_EQ(r.failedRequests.size(), 2u);
  // The text before the stderr copy is output; the copy is not.
  EXPECT_NE(std::find(r.output.begin(), r.output.end(), "[rank 0/2] da"), r.output.end());
  EXPECT_EQ(s.lastFailure().message, "rank 1: boom");
}

TEST_F(SessionTest, TheFirstFatalErrorIsTheGroupsFailure) {
  // Issue 45 (the GUI's multihost case failed in CI): rank 0's timeout named rank 1 as stopped;
  // MPI_Abort's SIGCONT then woke rank 1, whose own collective had timed out meanwhile. The
  // group's failure (the window's banner) is the first fatal error, the cause, not the last.
  Recorder r;
  WorkerSession s(&r);
  ASSERT_TRUE(s.start(launch("fatal_two")));
  s.submit({});
  ASSERT_TRUE(pollUntil(s, [&] { return s.state() == State::Failed; }));
  // Each reported once (the stderr copies dropped), in order.
  ASSERT_EQ(r.errors.size(), 2u);
  EXPECT_EQ(r.errors[0].rank, 0);
  EXPECT_EQ(r.errors[1].rank, 1);
  ASSERT_EQ(r.groupFailures.size(), 1u);
  EXPECT_EQ(r.groupFailures[0].rank, 0);
  EXPECT_EQ(r.groupFailures[0].message, "rank 0: collective timeout: rank 1 is stopped");
  EXPECT_EQ(s.lastFailure().message, "rank 0: collective timeout: rank 1 is stopped");
}

TEST_F(SessionTest, FatalErrorEndsAGroupThatDoesNotExit) {
  Recorder r;
  WorkerSession s(&r);
  s.setFatalTeardown(GroupProcess::Teardown{300ms, 300ms});
  ASSERT_TRUE(s.start(launch("fatal_hang")));
  s.submit({});
  ASSERT_TRUE(pollUntil(s, [&] { return !r.errors.empty(); }));
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(pollUntil(
      s, [&] { return s.state() == State::Failed; }, 10s));
  EXPECT_LT(secondsSince(t0), 5.0);
  ASSERT_TRUE(s.exitStatus().has_value());
  EXPECT_EQ(s.exitStatus()->signal, SIGKILL);  // it ignored SIGTERM
  EXPECT_EQ(r.groupFailures.at(0).message, "rank 1: boom");
}

TEST_F(SessionTest, CrashNamesTheRankWithItsPidAndStage) {
  Recorder r;
  WorkerSession s(&r);
  ASSERT_TRUE(s.start(launch("crash")));
  s.submit({});
  ASSERT_TRUE(pollUntil(s, [&] { return s.state() == State::Failed; }));
  ASSERT_EQ(r.groupFailures.size(), 1u);
  const GroupFailure& f = r.groupFailures[0];
  EXPECT_EQ(f.rank, 1);
  EXPECT_EQ(f.pid, 5001);  // mpirun said PID 0: the hello event's pid
  EXPECT_NE(f.message.find("rank 1"), std::string::npos) << f.message;
  EXPECT_NE(f.message.find("signal 9"), std::string::npos) << f.message;
  EXPECT_NE(f.message.find("while denoising (step 1/2)"), std::string::npos) << f.message;
  EXPECT_EQ(s.exitStatus()->code, 137);
  // Recovers: start again.
  ASSERT_TRUE(s.start(launch("ok")));
  s.submit({});
  ASSERT_TRUE(pollUntil(s, [&] { return r.done.size() == 1; }));
  s.stop();
  ASSERT_TRUE(pollUntil(s, [&] { return s.state() == State::Stopped; }));
}

TEST_F(SessionTest, FailedStartAndRestart) {
  Recorder r;
  WorkerSession s(&r);
  SessionLaunch bad;
  bad.argv = {(dir.path / "no-such-mpirun").string()};
  EXPECT_TRUE(s.start(bad));
  EXPECT_EQ(s.state(), State::Failed);
  ASSERT_EQ(r.groupFailures.size(), 1u);
  EXPECT_NE(r.groupFailures[0].message.find("no-such-mpirun"), std::string::npos);
  // Restart: the old group stops, the new one starts and serves the unsent requests.
  ASSERT_TRUE(s.start(launch("ok")));
  ASSERT_TRUE(pollUntil(s, [&] { return s.state() == State::Ready; }));
  s.restart(launch("ok"));
  const std::string id = s.submit({});
  ASSERT_TRUE(pollUntil(s, [&] { return r.done.size() == 1; }));
  EXPECT_EQ(r.done[0], id);
  EXPECT_EQ(r.stopped.size(), 1u);
  s.stopWhenIdle();
  ASSERT_TRUE(pollUntil(s, [&] { return s.state() == State::Stopped; }));
}

TEST_F(SessionTest, PollSessionsDrivesSeveralGroupsFromOneThread) {
  Recorder r1, r2;
  WorkerSession a(&r1, "a"), b(&r2, "b");
  ASSERT_TRUE(a.start(launch("ok")));
  ASSERT_TRUE(b.start(launch("ok")));
  a.submit({});
  b.submit({});
  a.stopWhenIdle();
  b.stopWhenIdle();
  const auto end = std::chrono::steady_clock::now() + 15s;
  while ((a.state() != State::Stopped || b.state() != State::Stopped) &&
         std::chrono::steady_clock::now() < end)
    pollSessions({&a, &b}, 200ms);
  EXPECT_EQ(a.state(), State::Stopped);
  EXPECT_EQ(b.state(), State::Stopped);
  EXPECT_EQ(r1.done, std::vector<std::string>{"r1-a"});
  EXPECT_EQ(r2.done, std::vector<std::string>{"r1-b"});
}

// Issue 35: the hostfile is read as every file the program reads: a FIFO, /dev/zero or a
// directory is refused at once by its kind (nothing blocks, nothing grows), an oversized file by
// its size; a host name starting with '-' is refused, and ssh gets "--" before the host.
TEST(Hostfile, ReadAsABoundedRegularFile) {
  TempDir d;
  auto errorOf = [](const std::string& path) -> std::string {
    try {
      readHostfile(path);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  const auto t0 = std::chrono::steady_clock::now();
  const std::string fifo = (d.path / "hosts.fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(errorOf(fifo), "hostfile " + fifo + " is a FIFO (named pipe), not a regular file");
  EXPECT_EQ(errorOf("/dev/zero"), "hostfile /dev/zero is a character device, not a regular file");
  EXPECT_EQ(errorOf(d.path.string()),
            "hostfile " + d.path.string() + " is a directory, not a regular file");
  EXPECT_LT(secondsSince(t0), 2.0);
  const std::string big = (d.path / "big").string();
  {
    std::ofstream o(big);
    o << std::string(kMaxHostfileBytes + 1, '#');
  }
  EXPECT_EQ(errorOf(big), "hostfile " + big + " is " + std::to_string(kMaxHostfileBytes + 1) +
                              " bytes; hostfiles are limited to 1048576");
  EXPECT_NE(errorOf((d.path / "none").string()).find("cannot be read: No such file"),
            std::string::npos);
  const std::string ok = (d.path / "hosts").string();
  std::ofstream(ok) << "a slots=1\nb slots=2\n";
  EXPECT_EQ(readHostfile(ok), "a slots=1\nb slots=2\n");
  EXPECT_EQ(parseHostfile(readHostfile(ok)).size(), 2u);
  try {
    parseHostfile("a slots=1\n-oProxyCommand=touch_x slots=1\n");
    ADD_FAILURE() << "a host starting with '-' was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "hostfile line 2: host '-oProxyCommand=touch_x' starts with '-'; ssh and mpirun "
              "would read it as an option");
  }
}

TEST(Hostfile, SshGetsTheHostAfterDoubleDash) {
  TempDir d;
  const fs::path args = d.path / "args";
  const fs::path ssh = d.path / "ssh";
  {
    std::ofstream o(ssh);
    o << "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > " << args.string()
      << "\nexit 255\n";
  }
  fs::permissions(ssh, fs::perms::owner_all);
  const char* oldPath = std::getenv("PATH");
  const std::string saved = oldPath ? oldPath : "";
  ::setenv("PATH", (d.path.string() + ":" + saved).c_str(), 1);
  MpirunLaunch launch;
  launch.worker = "/opt/ditstudio-worker";
  (void)preflightHost("hostb", launch, {}, "", 5.0);
  ::setenv("PATH", saved.c_str(), 1);
  std::ifstream in(args);
  std::vector<std::string> argv;
  for (std::string l; std::getline(in, l);) argv.push_back(l);
  const auto dd = std::find(argv.begin(), argv.end(), "--");
  ASSERT_NE(dd, argv.end());
  ASSERT_NE(dd + 1, argv.end());
  EXPECT_EQ(*(dd + 1), "hostb");
  EXPECT_EQ(std::find(argv.begin(), dd, "hostb"), dd) << "the host came before --";
}

// Issue 36: a rank that a collective timeout finds silent on another host is named by what its
// host says (asked through an injected query here: no network): stopped, exited, or the host not
// answering over ssh either; a rank of this host, a running one and the rest of the text stay.
TEST(RemoteRankWatch, NamesASilentRankByItsHostsAnswer) {
  const HostPlan plan{{"localhost", {0}}, {"hb", {1}}, {"hc", {2}}, {"hd", {3}}, {"he", {4}}};
  std::vector<std::string> asked;
  RemoteRankWatch watch(plan, "", [&](const std::string& host, std::int64_t pid) -> std::string {
    asked.push_back(host + ":" + std::to_string(pid));
    if (host == "hb") return "stopped (state T: SIGSTOP or a debugger)";
    if (host == "hc") return "exited";
    if (host == "he") return "running (state S)";
    return "";
  });
  auto silent = [](int rank, int pid, const std::string& host) {
    return "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + " on " + host +
           ") is on another host that did not answer (is the link to it up?)";
  };
  const std::string msg = "collective timeout after 8 s in allreduce: " + silent(1, 101, "mh-b") +
                          "; " + silent(2, 102, "mh-c") + "; " + silent(3, 103, "mh-d") + "; " +
                          silent(4, 104, "mh-e") + "; " + silent(0, 100, "mh-a") + ".";
  EXPECT_TRUE(RemoteRankWatch::hasSilentRank(msg));
  EXPECT_FALSE(RemoteRankWatch::hasSilentRank("rank 1 failed"));
  EXPECT_EQ(watch.rewrite(msg),
            "collective timeout after 8 s in allreduce: rank 1 (pid 101 on mh-b) is stopped "
            "(state T: SIGSTOP or a debugger) (asked over ssh): it is not cut off, it does not "
            "run; rank 2 (pid 102 on mh-c) has exited (asked over ssh); rank 3 (pid 103 on mh-d) "
            "is on another host that did not answer, nor does hd over ssh: the link to it is down "
            "(or the host is); " +
                silent(4, 104, "mh-e") + "; " + silent(0, 100, "mh-a") + ".");
  // Each remote rank's host asked once, with the pid of the clause; this host never.
  EXPECT_EQ(asked, (std::vector<std::string>{"hb:101", "hc:102", "hd:103", "he:104"}));
  // Another copy of the error (a rank's stderr line) in the same words, without asking again;
  // a rank never asked about stays as it is.
  EXPECT_EQ(watch.rewriteKnown("[rank 0] fatal: " + silent(1, 101, "mh-b") + "; " +
                               silent(4, 104, "mh-e") + "; " + silent(9, 109, "mh-z")),
            "[rank 0] fatal: rank 1 (pid 101 on mh-b) is stopped (state T: SIGSTOP or a "
            "debugger) (asked over ssh): it is not cut off, it does not run; " +
                silent(4, 104, "mh-e") + "; " + silent(9, 109, "mh-z"));
  EXPECT_EQ(asked.size(), 4u);
  // Rank 0 may be the one on another host; a number too large for a rank names none (and
  // throws nothing).
  RemoteRankWatch first({{"hx", {0}}, {"localhost", {1}}}, "",
                        [](const std::string&, std::int64_t) -> std::string { return "exited"; });
  EXPECT_EQ(first.rewrite(silent(0, 7, "mh-x")),
            "rank 0 (pid 7 on mh-x) has exited (asked over ssh)");
  const std::string huge =
      "rank 99999999999999999999 (pid 99999999999999999999 on h) is on "
      "another host that did not answer (is the link to it up?)";
  EXPECT_EQ(first.rewrite(huge), huge);
  // Without a plan (a single-host group) nothing is asked and nothing changes.
  RemoteRankWatch none({}, "", [&](const std::string&, std::int64_t) -> std::string {
    ADD_FAILURE() << "asked without a plan";
    return "";
  });
  EXPECT_FALSE(none.active());
  EXPECT_EQ(none.rewrite(msg), msg);
}

// The stall check asks once per stall, keeps what it learnt for the error that follows (the
// group's abort ends a stopped process before it could be asked then), and asks again only
// after an event.
TEST(RemoteRankWatch, StallCheckKeepsTheStateForTheError) {
  using namespace std::chrono_literals;
  const HostPlan plan{{"127.0.0.1", {0}}, {"hb", {1}}};
  int queries = 0;
  std::string answer = "stopped (state T: SIGSTOP or a debugger)";
  RemoteRankWatch watch(plan, "", [&](const std::string& host, std::int64_t pid) {
    ++queries;
    EXPECT_EQ(host, "hb");
    EXPECT_EQ(pid, 4242);
    return answer;
  });
  const auto t0 = SteadyClock::now();
  watch.noteEvent(t0);
  EXPECT_FALSE(watch.stallDue(4s, t0 + 3s));
  EXPECT_TRUE(watch.stallDue(4s, t0 + 4s));
  const std::map<int, std::int64_t> pids{{0, 4241}, {1, 4242}};
  const auto named = watch.checkStall(pids);
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0].rank, 1);
  EXPECT_EQ(named[0].host, "hb");
  EXPECT_EQ(named[0].state, "stopped (state T: SIGSTOP or a debugger)");
  EXPECT_EQ(queries, 1);
  // Once per stall.
  EXPECT_FALSE(watch.stallDue(4s, t0 + 10s));
  EXPECT_TRUE(watch.checkStall(pids).empty());
  EXPECT_FALSE(watch.claimStall());
  EXPECT_EQ(queries, 1);
  // The error after the abort: the kept state, not a new question (it would say "exited").
  answer = "exited";
  EXPECT_EQ(watch.rewrite("x: rank 1 (pid 4242 on mh-host-b) is on another host that did not "
                          "answer (is the link to it up?)"),
            "x: rank 1 (pid 4242 on mh-host-b) is stopped (state T: SIGSTOP or a debugger) "
            "(asked over ssh): it is not cut off, it does not run");
  EXPECT_EQ(queries, 1);
  // An event: a later stall is asked about again; a running rank is not kept.
  watch.noteEvent(t0 + 20s);
  EXPECT_TRUE(watch.stallDue(4s, t0 + 24s));
  answer = "running (state R)";
  EXPECT_TRUE(watch.checkStall(pids).empty());
  EXPECT_EQ(queries, 2);
  EXPECT_EQ(watch.known().at(1), "stopped (state T: SIGSTOP or a debugger)");
  // No answer to the stall check (ssh past its bound on a loaded host) is not kept: the
  // error asks again, and names the rank by that answer.
  RemoteRankWatch slow(plan, "", [&](const std::string&, std::int64_t) { return answer; });
  slow.noteEvent(t0);
  answer = "";
  EXPECT_TRUE(slow.checkStall(pids).empty());
  EXPECT_EQ(slow.known().count(1), 0u);
  answer = "stopped (state T: SIGSTOP or a debugger)";
  EXPECT_EQ(slow.rewrite("x: rank 1 (pid 4242 on mh-host-b) is on another host that did not "
                         "answer (is the link to it up?)"),
            "x: rank 1 (pid 4242 on mh-host-b) is stopped (state T: SIGSTOP or a debugger) "
            "(asked over ssh): it is not cut off, it does not run");
  // Half the collective timeout, 2..60 s.
  EXPECT_EQ(RemoteRankWatch::stallAfter(8), 4s);
  EXPECT_EQ(RemoteRankWatch::stallAfter(1), 2s);
  EXPECT_EQ(RemoteRankWatch::stallAfter(300), 60s);
}

// The GUI's race (seen under load): the stall check's ssh is still out when the error comes. The
// error waits for that answer ("stopped") instead of asking again after the group's abort ended
// the stopped rank (which would say "exited").
TEST(RemoteRankWatch, ErrorDuringTheStallCheckWaitsForItsAnswer) {
  using namespace std::chrono_literals;
  const HostPlan plan{{"127.0.0.1", {0}}, {"hb", {1}}};
  std::atomic<int> queries{0};
  std::atomic<bool> release{false};
  RemoteRankWatch watch(plan, "", [&](const std::string&, std::int64_t) -> std::string {
    if (++queries == 1) {  // the stall check: answers late
      while (!release) std::this_thread::sleep_for(5ms);
      return "stopped (state T: SIGSTOP or a debugger)";
    }
    return "exited";  // a second question, after the abort
  });
  std::thread stall([&] { watch.askStall({{0, 4241}, {1, 4242}}); });
  while (queries == 0) std::this_thread::sleep_for(1ms);
  std::thread late([&] {
    std::this_thread::sleep_for(100ms);
    release = true;
  });
  const std::string named = watch.rewrite(
      "x: rank 1 (pid 4242 on mh-host-b) is on another host that did not answer (is the link to "
      "it up?)");
  stall.join();
  late.join();
  EXPECT_EQ(named,
            "x: rank 1 (pid 4242 on mh-host-b) is stopped (state T: SIGSTOP or a debugger) "
            "(asked over ssh): it is not cut off, it does not run");
  EXPECT_EQ(queries, 1);
}

// The hostfile plan and pre-flight the CLI and the GUI share: the plan is reported before any
// host is asked, a port range too narrow for the busiest host is refused, a host whose ssh login
// fails is named with the cause and the fix (a stand-in ssh: no network), and cancelling stops
// before the next host.
TEST(HostGroup, PlanAndPreflightNameTheHost) {
  TempDir d;
  const std::string hostfile = (d.path / "hosts").string();
  std::ofstream(hostfile) << "localhost slots=2\nhostb slots=1\n";
  const std::string model = (d.path / "model.bin").string();
  std::ofstream(model) << "weights";
  MpirunLaunch launch;
  launch.hostfile = hostfile;
  launch.strategy.world = 3;
  launch.worker = "/opt/ditstudio-worker";
  HostGroupProgress progress;
  std::string planned;
  std::vector<std::string> checked;
  progress.planned = [&](const HostPlan& p) { planned = describeHostPlan(p); };
  progress.checked = [&](const PreflightResult& r) { checked.push_back(r.host); };
  // Without the pre-flight: the plan only.
  HostGroupCheck c = checkHostGroup(launch, {model}, false, progress);
  EXPECT_EQ(planned, "localhost: rank 0 1; hostb: rank 2");
  EXPECT_EQ(hostOfRank(c.plan, 2), "hostb");
  EXPECT_EQ(hostOfRank(c.plan, 7), "");
  EXPECT_TRUE(c.ok());
  EXPECT_TRUE(c.hosts.empty());
  EXPECT_EQ(c.failure(), "");
  // 4 ports: 2 for mpirun's channel, 2 for the ranks: enough for 2 ranks a host, not for 3.
  launch.port_range = "50000-50003";
  EXPECT_NO_THROW(checkHostGroup(launch, {model}, false));
  launch.strategy.world = 4;
  std::ofstream(hostfile) << "localhost slots=3\nhostb slots=1\n";
  try {
    checkHostGroup(launch, {model}, false);
    ADD_FAILURE() << "a port range too narrow was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "--port-range 50000-50003 leaves 2 ports (50002-50003) for the ranks, but 3 ranks "
              "run on one host: give a wider range");
  }
  launch.port_range.clear();
  launch.strategy.world = 3;
  std::ofstream(hostfile) << "localhost slots=2\nhostb slots=1\n";
  // hostb's ssh login is refused: named with ssh's cause and the fix.
  const fs::path ssh = d.path / "ssh";
  std::ofstream(ssh) << "#!/bin/sh\necho 'ssh: connect to host hostb port 22: Connection "
                        "refused' >&2\nexit 255\n";
  fs::permissions(ssh, fs::perms::owner_all);
  const char* oldPath = std::getenv("PATH");
  const std::string saved = oldPath ? oldPath : "";
  ::setenv("PATH", (d.path.string() + ":" + saved).c_str(), 1);
  c = checkHostGroup(launch, {model}, true, progress);
  EXPECT_EQ(checked, std::vector<std::string>{"hostb"});
  EXPECT_FALSE(c.ok());
  EXPECT_EQ(c.failedHost(), "hostb");
  EXPECT_EQ(c.failure().rfind("pre-flight failed:\n", 0), 0u) << c.failure();
  EXPECT_NE(c.failure().find("hostb"), std::string::npos) << c.failure();
  EXPECT_NE(c.failure().find("Fix: "), std::string::npos) << c.failure();
  // Cancelled before the first remote host: nothing asked.
  checked.clear();
  progress.cancelled = [] { return true; };
  c = checkHostGroup(launch, {model}, true, progress);
  ::setenv("PATH", saved.c_str(), 1);
  EXPECT_TRUE(checked.empty());
  EXPECT_TRUE(c.hosts.empty());
}

// ssh's report of a hostfile host it could not reach, as mpirun forwards it on stderr: the host
// and the cause (the GUI's banner and the session's failure name them).
TEST(HostFailure, SshReportsAsMpirunForwardsThem) {
  auto f = dit::launcher::parseHostFailure(
      "ssh: Could not resolve hostname node-b.invalid: Name or service not known\r\n"
      "------------------------------------------------------------\n"
      "ORTE was unable to reliably start one or more daemons.\n");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->host, "node-b.invalid");
  EXPECT_EQ(f->cause, "ssh could not resolve the host name (Name or service not known)");
  f = dit::launcher::parseHostFailure(
      "ssh: connect to host 10.0.0.7 port 22: Connection refused\n");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->host, "10.0.0.7");
  EXPECT_EQ(f->cause, "ssh could not connect to port 22 (Connection refused)");
  f = dit::launcher::parseHostFailure("alice@gpu2: Permission denied (publickey,password).\n");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->host, "gpu2");
  EXPECT_EQ(f->cause,
            "ssh could not log in without a prompt (Permission denied (publickey,password))");
  f = dit::launcher::parseHostFailure("Host key verification failed.\n");
  ASSERT_TRUE(f);
  EXPECT_TRUE(f->host.empty());
  EXPECT_FALSE(dit::launcher::parseHostFailure(
      "mpirun noticed that process rank 1 with PID 5001 on node h exited on signal 9 (Killed)."));
}

// ------------------------------------------------------------------------------ issue 36

// One port range for every listener of a hostfile group: mpirun's channel gets the first quarter
// (2..64 ports), the ranks the rest; too small a range is refused with the fix.
TEST(PortRange, SplitBetweenMpirunAndTheRanks) {
  PortPlan p = planPortRange(" 50000-50099 ");
  EXPECT_EQ(p.min, 50000);
  EXPECT_EQ(p.max, 50099);
  EXPECT_EQ(p.oob_min, 50000);
  EXPECT_EQ(p.oob_max, 50024);
  EXPECT_EQ(p.btl_min, 50025);
  EXPECT_EQ(p.btl_max, 50099);
  p = planPortRange("40000-40003");  // the smallest: 2 + 2
  EXPECT_EQ(p.oob_max, 40001);
  EXPECT_EQ(p.btl_min, 40002);
  p = planPortRange("20000-29999");  // mpirun's share is capped at 64 ports
  EXPECT_EQ(p.oob_max, 20063);
  EXPECT_EQ(p.btl_min, 20064);
  try {
    planPortRange("50000-50002");
    FAIL() << "a 3-port range was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("holds 3 ports; a group needs at least 4"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(planPortRange("1000-2000"), std::invalid_argument);
  EXPECT_THROW(planPortRange("2000-1000"), std::invalid_argument);
  MpirunLaunch l;
  l.hostfile = "hosts";
  l.port_range = "50000-50099";
  const auto mca = networkMcaParams(l);
  using P = std::pair<std::string, std::string>;
  EXPECT_EQ(mca, (std::vector<P>{{"oob_tcp_dynamic_ipv4_ports", "50000-50024"},
                                 {"btl_tcp_port_min_v4", "50025"},
                                 {"btl_tcp_port_range_v4", "75"}}));
  l.hostfile.clear();  // one host: no TCP listener at all, the range does not apply
  EXPECT_EQ(networkMcaParams(l).size(), 2u);
}

// The BLAS kernel and thread policy reach every rank of a hostfile group (-x NAME).
TEST(ForwardedEnvironment, CarriesTheBlasKernelAndThreadPolicy) {
  ::setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
  ::setenv("GOMP_SPINCOUNT", "10000", 1);
  ::setenv("DITSTUDIO_BLAS_AUTO", "SkylakeX", 1);
  ::setenv("NOT_FORWARDED_X", "1", 1);
  const auto names = forwardedEnvironment();
  ::unsetenv("DITSTUDIO_BLAS_AUTO");
  ::unsetenv("NOT_FORWARDED_X");
  for (const char* n : {"OPENBLAS_CORETYPE", "GOMP_SPINCOUNT", "DITSTUDIO_BLAS_AUTO"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  EXPECT_EQ(std::find(names.begin(), names.end(), "NOT_FORWARDED_X"), names.end());
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  MpirunLaunch l;
  l.hostfile = "hosts";
  l.worker = "/w";
  const auto argv = mpirunArgv(l);
  const auto x = std::find(argv.begin(), argv.end(), "OPENBLAS_CORETYPE");
  ASSERT_NE(x, argv.end());
  EXPECT_EQ(*(x - 1), "-x");
}

// Paths the ranks of other hosts read are absolute on the launching host.
TEST(Paths, MadeAbsoluteOnTheLaunchingHost) {
  const std::string cwd = fs::current_path().string();
  EXPECT_EQ(absoluteOnThisHost("models/tiny"), cwd + "/models/tiny");
  EXPECT_EQ(absoluteOnThisHost("./a/../b"), cwd + "/b");
  EXPECT_EQ(absoluteOnThisHost("/m/x"), "/m/x");
  EXPECT_EQ(absoluteOnThisHost(""), "");
  MpirunLaunch l;
  l.worker = "/w";
  l.model = "tiny";
  l.hostfile = "hosts";
  auto argv = mpirunArgv(l);
  auto m = std::find(argv.begin(), argv.end(), "--model");
  ASSERT_NE(m, argv.end());
  EXPECT_EQ(*(m + 1), cwd + "/tiny");
  l.hostfile.clear();  // one host: as given
  argv = mpirunArgv(l);
  m = std::find(argv.begin(), argv.end(), "--model");
  EXPECT_EQ(*(m + 1), "tiny");
}

// The pre-flight's and mpirun's ssh failures get the fix that fits ssh's words.
TEST(HostFailure, AdviceFitsTheCause) {
  auto f = parseHostFailure("ssh: connect to host 10.0.0.7 port 22: Connection refused\n");
  ASSERT_TRUE(f);
  EXPECT_NE(f->fix.find("start sshd on 10.0.0.7"), std::string::npos) << f->fix;
  EXPECT_NE(f->fix.find("-p PORT"), std::string::npos) << f->fix;
  EXPECT_EQ(f->fix.find("ssh-copy-id"), std::string::npos) << f->fix;
  f = parseHostFailure("ssh: connect to host 10.0.0.9 port 22: Connection timed out\n");
  ASSERT_TRUE(f);
  EXPECT_NE(f->fix.find("firewall"), std::string::npos) << f->fix;
  f = parseHostFailure("ssh: connect to host 10.0.0.9 port 22: No route to host\n");
  ASSERT_TRUE(f);
  EXPECT_NE(f->fix.find("does not answer"), std::string::npos) << f->fix;
  f = parseHostFailure("root@10.0.0.2: Permission denied (publickey).\n");
  ASSERT_TRUE(f);
  EXPECT_NE(f->fix.find("ssh-copy-id 10.0.0.2"), std::string::npos) << f->fix;
  f = parseHostFailure("Host key verification failed.\n");
  ASSERT_TRUE(f);
  EXPECT_NE(f->fix.find("`ssh HOST true`"), std::string::npos) << f->fix;
  f = parseHostFailure("ssh: Could not resolve hostname nodeb: Name or service not known\n");
  ASSERT_TRUE(f);
  EXPECT_NE(f->fix.find("host name nodeb"), std::string::npos) << f->fix;
  EXPECT_EQ(sshAdvice("something else", "h"), "");
}

// The pre-flight's port probe: a listener on a port of each range, and this machine's connect.
TEST(PortProbe, ListenerAndConnect) {
  EXPECT_EQ(probeRanges(""), (std::vector<std::pair<int, int>>{{0, 0}}));
  EXPECT_EQ(probeRanges("50000-50099"),
            (std::vector<std::pair<int, int>>{{50000, 50024}, {50025, 50099}}));
  EXPECT_EQ(dit::protocol::probeSpec({{50000, 50024}, {50025, 50099}}), "50000-50024,50025-50099");
  EXPECT_EQ(dit::protocol::parseProbeSpec("0-0,7-9"),
            (std::vector<std::pair<int, int>>{{0, 0}, {7, 9}}));
  EXPECT_THROW(dit::protocol::parseProbeSpec("9-7"), std::invalid_argument);
  EXPECT_THROW(dit::protocol::parseProbeSpec(""), std::invalid_argument);
  // The listener in a child (it writes its ports on stdout), this process connects.
  GroupProcess g;
  g.start({"/proc/self/exe", "--gtest_filter=PortProbe.DISABLED_ListenerChild",
           "--gtest_also_run_disabled_tests"},
          {{"DIT_PROBE_CHILD", "0-0,0-0"}});
  std::vector<int> ports;
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (ports.empty() && std::chrono::steady_clock::now() < until) {
    for (const std::string& l : g.read(Stream::Stdout))
      if (l.rfind("probe listening", 0) == 0) {
        std::istringstream w(l.substr(15));
        for (int p; w >> p;) ports.push_back(p);
      }
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(ports.size(), 2u);
  for (int p : ports) EXPECT_EQ(dit::protocol::probeConnect("127.0.0.1", p, 2.0), "") << p;
  const auto st = g.wait(10s);
  ASSERT_TRUE(st.has_value());
  EXPECT_TRUE(st->exited);
  EXPECT_EQ(st->code, 0);
  // Nothing listens there any more: refused at once.
  EXPECT_EQ(dit::protocol::probeConnect("127.0.0.1", ports[0], 2.0), "connection refused");
  EXPECT_NE(dit::protocol::probeConnect("no-such-host.invalid", 1, 2.0).find("cannot resolve"),
            std::string::npos);
}

// The child of PortProbe.ListenerAndConnect (disabled: runs only there).
TEST(PortProbe, DISABLED_ListenerChild) {
  const char* spec = std::getenv("DIT_PROBE_CHILD");
  if (!spec) GTEST_SKIP() << "started by PortProbe.ListenerAndConnect";
  std::cout.flush();
  std::_Exit(dit::protocol::runProbeListener(spec, 8));
}

// After a fatal error the teardown may skip SIGTERM (an mpirun in its own abort crashes on it).
TEST(GroupProcess, TeardownWithoutSigterm) {
  GroupProcess g;
  g.start({"bash", "-c",
           "trap 'echo got TERM; exit 3' TERM; echo ready; while :; do sleep 0.05; done"});
  bool ready = false;
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!ready && std::chrono::steady_clock::now() < until) {
    for (const std::string& l : g.read(Stream::Stdout)) ready |= l == "ready";
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(ready);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> lines;
  g.beginTeardown("", GroupProcess::Teardown{200ms, 5s, /*sigterm=*/false});
  const auto st = g.wait(5s, [&](Stream, const std::string& l) { lines.push_back(l); });
  ASSERT_TRUE(st.has_value());
  EXPECT_FALSE(st->exited);
  EXPECT_EQ(st->signal, SIGKILL);  // at the end of the grace, not 5 s later
  EXPECT_LT(secondsSince(t0), 2.0);
  EXPECT_EQ(std::find(lines.begin(), lines.end(), "got TERM"), lines.end());
}

// OpenMPI's report of a failure whose cause the session names (ssh's words) is not shown raw;
// a report it cannot name is (issue 36, `--no-preflight`).
TEST_F(SessionTest, OpenMpiBlocksShownOnlyWhenTheCauseIsUnknown) {
  const std::string orte = "ORTE was unable to reliably start one or more daemons.";
  {
    Recorder r;
    WorkerSession s(&r);
    ASSERT_TRUE(s.start(launch("ssh_refused")));
    ASSERT_TRUE(pollUntil(s, [&] { return s.state() == State::Failed; }));
    EXPECT_EQ(std::find(r.output.begin(), r.output.end(), orte), r.output.end());
    EXPECT_NE(std::find(r.debug.begin(), r.debug.end(), orte), r.debug.end());
    ASSERT_EQ(r.groupFailures.size(), 1u);
    const std::string& m = r.groupFailures[0].message;
    EXPECT_NE(m.find("host 10.0.0.7: ssh could not connect to port 22 (Connection refused)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("start sshd on 10.0.0.7"), std::string::npos) << m;
    EXPECT_EQ(r.groupFailures[0].detail, "");  // no OpenMPI text beside the named cause
  }
  Recorder r;
  WorkerSession s(&r);
  ASSERT_TRUE(s.start(launch("unknown_block")));
  ASSERT_TRUE(pollUntil(s, [&] { return s.state() == State::Failed; }));
  EXPECT_NE(std::find(r.output.begin(), r.output.end(), orte), r.output.end());
}

// After a rank named a fatal error, the group's further stderr is the teardown's noise: logged
// at debug level, not shown as output; the text a rank wrote before the event on its line is.
TEST_F(SessionTest, StderrAfterAFatalErrorGoesToTheDebugLog) {
  Recorder r;
  WorkerSession s(&r);
  s.setFatalTeardown(GroupProcess::Teardown{300ms, 300ms, /*sigterm=*/false});
  ASSERT_TRUE(s.start(launch("fatal_hang")));
  s.submit({});
  ASSERT_TRUE(pollUntil(s, [&] { return s.state() == State::Failed; }));
  EXPECT_EQ(std::find(r.output.begin(), r.output.end(), "[rank 1] fatal: boom"), r.output.end());
  EXPECT_NE(std::find(r.debug.begin(), r.debug.end(), "[rank 1] fatal: boom"), r.debug.end());
  EXPECT_NE(std::find(r.output.begin(), r.output.end(), "[rank 0/2] da"), r.output.end());
  ASSERT_TRUE(s.exitStatus().has_value());
  EXPECT_EQ(s.exitStatus()->signal, SIGKILL);
}

// ------------------------------------------------------------------------------ issue 36

namespace {

// OpenMPI 5.0's (PRRTE) stderr when remote rank 1 was SIGKILLed mid-run (Debian 13), as the CLI
// showed it: rank 0's TCP BTL saw the socket close and aborted rank 0 at once.
std::string openMpi5PeerLost(const std::string& elided) {
  const std::string rule =
      "--------------------------------------------------------------------------\n";
  return rule +
         "An MPI communication peer process has unexpectedly disconnected.  This\n"
         "usually indicates a failure in the peer process (e.g., a crash or\n"
         "otherwise exiting without calling MPI_FINALIZE first).\n" +
         elided +
         "  Local host: vm\n"
         "  Local PID:  6012\n"
         "  Peer host:  mh-host-b\n" +
         rule + std::string(1, '\0') +
         "[vm:00000] *** An error occurred in Socket closed\n"
         "[vm:00000] *** reported by process [3333816321,0]\n"
         "[vm:00000] *** on a NULL communicator\n"
         "[vm:00000] *** Unknown error\n"
         "[vm:00000] *** MPI_ERRORS_ARE_FATAL (processes in this communicator will now abort,\n"
         "[vm:00000] ***    and MPI will try to terminate your MPI job as well)\n" +
         rule +
         "prterun has exited due to process rank 0 with PID 0 on node vm calling\n"
         "\"abort\". This may have caused other processes in the application to be\n"
         "terminated by signals sent by prterun (as reported here).\n" +
         rule;
}

const char kElided[] = "...\n";
const char kFullHelp[] =
    "\n"
    "Although this local MPI process will likely now behave unpredictably\n"
    "(it may even hang or crash), the root cause of this problem is the\n"
    "failure of the peer -- that is what you need to investigate.  For\n"
    "example, there may be a core file that you can examine.  More\n"
    "generally: such peer hangups are frequently caused by application bugs\n"
    "or other external events.\n"
    "\n";

}  // namespace

TEST(MpirunFailure, OpenMpi5PeerDisconnectNamesTheReporterAndThePeerHost) {
  for (const char* elided : {kElided, kFullHelp}) {
    const auto f = parseMpirunFailure(openMpi5PeerLost(elided));
    ASSERT_TRUE(f);
    EXPECT_TRUE(f->peer_lost);
    EXPECT_EQ(f->rank, 0);
    EXPECT_EQ(f->pid, 6012);
    EXPECT_EQ(f->node, "vm");
    EXPECT_EQ(f->peer_host, "mh-host-b");
    EXPECT_EQ(f->signal, -1);
    EXPECT_EQ(f->reason,
              "rank 0 (pid 6012 on vm) lost its connection to a rank on mh-host-b mid-run");
  }
  // The abort lines alone: the reporter, no peer host.
  const auto a = parseMpirunFailure(
      "[vm:00000] *** An error occurred in Socket closed\n"
      "[vm:00000] *** reported by process [3333816321,2]\n");
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->peer_lost);
  EXPECT_EQ(a->rank, 2);
  EXPECT_EQ(a->peer_host, "");
  EXPECT_EQ(a->reason, "rank 2 (on vm) lost its connection to another rank mid-run");
  // OpenMPI 4's report of the rank's signal wins over a peer-disconnect block beside it.
  const auto o4 = parseMpirunFailure(
      openMpi5PeerLost(kElided) +
      "mpirun noticed that process rank 1 with PID 77 on node 10.77.0.2 exited on signal 9 "
      "(Killed).\n");
  ASSERT_TRUE(o4);
  EXPECT_FALSE(o4->peer_lost);
  EXPECT_EQ(o4->reason, "rank 1 (pid 77 on 10.77.0.2) was killed by signal 9 (Killed)");
  EXPECT_TRUE(isMpiAbortLine(std::string(1, '\0') + "[vm:00000] *** Unknown error"));
  EXPECT_TRUE(isMpiAbortLine("\\0[vm:00000] *** on a NULL communicator"));
  EXPECT_FALSE(isMpiAbortLine("prterun has exited due to process rank 0"));
}

// The session names the ranks on the peer host from their hello events, in one line without
// OpenMPI's text, and never says "failed to start" for a group that was ready.
TEST_F(SessionTest, OpenMpi5PeerDisconnectNamesTheRankOnThePeerHost) {
  std::ofstream(dir.path / "openmpi5.txt") << openMpi5PeerLost(kFullHelp);
  Recorder r;
  WorkerSession s(&r);
  ASSERT_TRUE(s.start(launch("peer_lost")));
  s.submit({});
  ASSERT_TRUE(pollUntil(s, [&] { return s.state() == State::Failed; }));
  EXPECT_EQ(s.rankHosts(), (std::map<int, std::string>{{0, "vm"}, {1, "mh-host-b"}}));
  ASSERT_EQ(r.groupFailures.size(), 1u);
  const GroupFailure& f = r.groupFailures[0];
  EXPECT_EQ(f.message,
            "rank 1 (pid 5001 on mh-host-b) disconnected: rank 0 (pid 6012 on vm) lost its "
            "connection to it mid-run");
  EXPECT_EQ(f.rank, 1);
  EXPECT_EQ(f.pid, 5001);
  EXPECT_EQ(f.detail, "");
  EXPECT_TRUE(RemoteRankWatch::hasDisconnectedRank(f.message));
  EXPECT_FALSE(
      RemoteRankWatch::hasDisconnectedRank("rank 1 (pid 5 on h) is on another host that "
                                           "did not answer (is the link to it up?)"));
  for (const std::string& l : r.output) {
    EXPECT_EQ(l.find("An MPI communication peer"), std::string::npos) << l;
    EXPECT_EQ(l.find("MPI_ERRORS_ARE_FATAL"), std::string::npos) << l;
    EXPECT_EQ(l.find("Socket closed"), std::string::npos) << l;
    EXPECT_EQ(l.find("prterun has exited"), std::string::npos) << l;
  }
  EXPECT_NE(std::find(r.debug.begin(), r.debug.end(), "  Peer host:  mh-host-b"), r.debug.end());

  // A hostfile group asks the peer host over ssh (RemoteRankWatch, the CLI's and the GUI's).
  const HostPlan plan{{"localhost", {0}}, {"10.77.0.2", {1}}};
  std::vector<std::string> asked;
  auto watchSaying = [&](std::string answer) {
    return RemoteRankWatch(plan, "", [&asked, answer](const std::string& host, std::int64_t pid) {
      asked.push_back(host + ":" + std::to_string(pid));
      return answer;
    });
  };
  RemoteRankWatch exited = watchSaying("exited");
  EXPECT_EQ(exited.rewrite(f.message),
            "rank 1 (pid 5001 on 10.77.0.2, host name mh-host-b) has exited (asked over ssh): "
            "rank 0 (pid 6012 on vm) lost its connection to it mid-run");
  EXPECT_EQ(asked, (std::vector<std::string>{"10.77.0.2:5001"}));
  RemoteRankWatch silent = watchSaying("");
  EXPECT_EQ(silent.rewrite(f.message),
            "rank 1 (pid 5001 on 10.77.0.2, host name mh-host-b) disconnected, and 10.77.0.2 "
            "does not answer over ssh either: the link to it is down (or the host is): rank 0 "
            "(pid 6012 on vm) lost its connection to it mid-run");
  RemoteRankWatch running = watchSaying("running (state S)");
  EXPECT_EQ(running.rewrite(f.message),
            "rank 1 (pid 5001 on 10.77.0.2, host name mh-host-b) is still running (state S) "
            "(asked over ssh): the connection between the hosts dropped, not the rank: rank 0 "
            "(pid 6012 on vm) lost its connection to it mid-run");
  // Without a plan (no hostfile) the message stays as the session named it.
  RemoteRankWatch none;
  EXPECT_EQ(none.rewrite(f.message), f.message);
}

// OpenMPI 5 under load sometimes forwards only the abort lines, without the block that names the
// peer host (seen in the Debian 13 chroot's multihost test): the rank on the other host is still
// named from the hellos, so a hostfile group's watch can ask its host over ssh.
TEST_F(SessionTest, OpenMpi5ShortPeerDisconnectNamesTheRankOnTheOtherHost) {
  std::ofstream(dir.path / "openmpi5.txt")
      << std::string(1, '\0') +
             "[vm:00000] *** An error occurred in Socket closed\n"
             "[vm:00000] *** reported by process [3333816321,0]\n"
             "[vm:00000] *** on a NULL communicator\n"
             "[vm:00000] *** MPI_ERRORS_ARE_FATAL (processes in this communicator will now abort,\n"
             "prterun has exited due to process rank 0 with PID 0 on node vm calling\n";
  Recorder r;
  WorkerSession s(&r);
  ASSERT_TRUE(s.start(launch("peer_lost")));
  s.submit({});
  ASSERT_TRUE(pollUntil(s, [&] { return s.state() == State::Failed; }));
  ASSERT_EQ(r.groupFailures.size(), 1u);
  const GroupFailure& f = r.groupFailures[0];
  EXPECT_EQ(f.message,
            "rank 1 (pid 5001 on mh-host-b) disconnected: rank 0 (pid 5000 on vm) lost its "
            "connection to it mid-run");
  EXPECT_EQ(f.rank, 1);
  EXPECT_EQ(f.pid, 5001);
  const HostPlan plan{{"localhost", {0}}, {"10.77.0.2", {1}}};
  RemoteRankWatch exited(plan, "", [](const std::string&, std::int64_t) { return "exited"; });
  EXPECT_EQ(exited.rewrite(f.message),
            "rank 1 (pid 5001 on 10.77.0.2, host name mh-host-b) has exited (asked over ssh): "
            "rank 0 (pid 5000 on vm) lost its connection to it mid-run");
}

TEST_F(SessionTest, AGroupThatWasReadyIsNeverSaidToHaveFailedToStart) {
  Recorder r;
  WorkerSession s(&r);
  ASSERT_TRUE(s.start(launch("exit_quietly")));
  s.submit({});
  ASSERT_TRUE(pollUntil(s, [&] { return s.state() == State::Failed; }));
  ASSERT_EQ(r.groupFailures.size(), 1u);
  EXPECT_EQ(r.groupFailures[0].message,
            "the worker group exited unexpectedly (mpirun exit code 14)");
}

// Issue 48: a request line rank 0 refuses (too long, not JSON, ...) ends its request, named by
// id or, when the line gave none, as the oldest sent request without an `accepted` event; the
// requests around it run as usual and nothing stays running.
TEST_F(SessionTest, ARefusedLineFailsItsRequestAndNothingStaysRunning) {
  struct Failures : Recorder {
    std::map<std::string, std::string> messages;
    void requestFailed(const std::string& id, const std::string& m) override {
      Recorder::requestFailed(id, m);
      messages[id] = m;
    }
  } r;
  WorkerSession s(&r, "rf");
  ASSERT_TRUE(s.start(launch("ok")));
  auto request = [](const std::string& prompt) {
    dit::protocol::GenerateRequest g;
    g.params.prompt = prompt;
    return g;
  };
  const std::string a = s.submit(request("REFUSE_NOID"));
  const std::string b = s.submit(request("a cat"));
  const std::string c = s.submit(request("REFUSE_ID"));
  const std::string d = s.submit(request("REFUSE_NOID again"));
  const std::string e = s.submit(request("a dog"));
  ASSERT_TRUE(pollUntil(s, [&] { return s.queue().empty(); })) << s.queue().size() << " left";
  EXPECT_EQ(r.failedRequests, (std::vector<std::string>{a, c, d}));
  EXPECT_EQ(r.done, (std::vector<std::string>{b, e}));
  EXPECT_EQ(r.messages[a], "rank 0: request line longer than 16777216 bytes refused unread");
  EXPECT_EQ(r.messages[c], "rank 0: request is not valid JSON");
  // The error reported to the observer names the request it ended.
  ASSERT_EQ(r.errors.size(), 3u);
  EXPECT_EQ(r.errors[0].id, a);
  EXPECT_EQ(r.errors[2].id, d);
  EXPECT_EQ(s.state(), State::Ready);
  s.stop(2000ms);
  ASSERT_TRUE(pollUntil(s, [&] { return s.state() == State::Stopped; }));
}

// Issue 48: OpenMPI 5 ends a hostfile group whose MPI traffic does not get through (a subnet the
// hosts share without it connecting them) with a lost connection during the start-up, where
// OpenMPI 4 times out in the first collective: the advice comes either way.
TEST_F(SessionTest, AHostfileGroupThatLosesAPeerDuringStartUpGetsTheNetworkAdvice) {
  std::ofstream(dir.path / "openmpi5.txt") << openMpi5PeerLost(kFullHelp);
  for (const bool hostfile : {true, false}) {
    Recorder r;
    WorkerSession s(&r);
    SessionLaunch l = launch("peer_lost_start");
    if (hostfile) l.argv.insert(l.argv.end(), {"--hostfile", (dir.path / "hosts").string()});
    ASSERT_TRUE(s.start(l));
    ASSERT_TRUE(pollUntil(s, [&] { return s.state() == State::Failed; }));
    ASSERT_EQ(r.groupFailures.size(), 1u);
    const std::string& m = r.groupFailures[0].message;
    EXPECT_EQ(m.rfind("rank 1 (pid 5001 on mh-host-b) disconnected: rank 0 (pid 6012 on vm) lost "
                      "its connection to it ",
                      0),
              0u)
        << m;
    if (hostfile) {
      EXPECT_NE(m.find("during the group's start-up. Likely " + dit::protocol::hostNetworkAdvice()),
                std::string::npos)
          << m;
      EXPECT_NE(m.find("--network-interface"), std::string::npos);
      EXPECT_NE(m.find("subnet the hosts share"), std::string::npos);
    } else {
      EXPECT_EQ(m.find("--network-interface"), std::string::npos) << m;  // one host: no advice
    }
  }
}

// Issue 45: one group start for the CLI, the GUI and the server. A single-host group's argv is
// mpirunArgv's (placed by withCpuSet when asked), with the spec's env and world, and a watch that
// names nothing; a hostfile group's component paths become absolute, and a host whose worker
// binary or model files differ (a stand-in ssh answering with this machine's file list, one
// digest changed) is refused before mpirun, naming the host and the file.
TEST(GroupStart, OnePathFromSpecToArgv) {
  TempDir d;
  GroupSpec spec;
  spec.launch.strategy.world = 2;
  spec.launch.strategy.tp_degree = 2;
  spec.launch.worker = "/opt/ditstudio-worker";
  spec.launch.model = "/models/tiny";
  spec.launch.extra_worker_args = {"--dtype", "float32", "--vae", "rel/vae"};
  spec.env = {{"OMP_NUM_THREADS", "1"}};
  PreparedGroup g = prepareGroup(spec);
  EXPECT_EQ(g.session.argv, mpirunArgv(spec.launch));
  EXPECT_EQ(g.session.env, spec.env);
  EXPECT_EQ(g.session.world, 2);
  ASSERT_TRUE(g.watch);
  EXPECT_FALSE(g.watch->active());
  EXPECT_EQ(g.planText(), "");
  const std::string silent =
      "rank 1 (pid 42 on hostb) is on another host that did not answer (is the link to it up?)";
  EXPECT_EQ(nameSilentRanks(g.watch.get(), silent), silent);
  EXPECT_EQ(modelSourcePaths("/m", {"--dtype", "bf16", "--vae", "v", "--text-encoder-2=t5", "x"}),
            (std::vector<std::string>{"/m", "v", "t5"}));
  // A server's group beside others: its CPU slice.
  spec.cpu_set = "2,3";
  g = prepareGroup(spec);
  EXPECT_EQ(g.session.argv, withCpuSet(mpirunArgv(spec.launch), "2,3"));
  EXPECT_EQ(g.session.argv.front(), "taskset");
  // Refused before any host is asked: no ranks.
  spec.launch.strategy.world = 0;
  EXPECT_THROW(prepareGroup(spec), std::invalid_argument);

  // A hostfile group: localhost holds rank 0, hostb rank 1.
  const std::string hostfile = (d.path / "hosts").string();
  std::ofstream(hostfile) << "localhost slots=1\nhostb slots=1\n";
  const fs::path model = d.path / "model";
  fs::create_directories(model / "transformer");
  std::ofstream(model / "transformer" / "weights.bin") << "weights";
  const fs::path worker = d.path / "bin" / "ditstudio-worker";
  fs::create_directories(worker.parent_path());
  std::ofstream(worker) << "#!/bin/sh\nexit 0\n";
  spec = GroupSpec{};
  spec.launch.strategy.world = 2;
  spec.launch.hostfile = hostfile;
  spec.launch.worker = worker.string();
  spec.launch.model = model.string();
  spec.launch.extra_worker_args = {"--vae", "rel/vae"};
  spec.preflight = false;
  g = prepareGroup(spec);
  EXPECT_EQ(g.planText(), "localhost: rank 0; hostb: rank 1");
  EXPECT_TRUE(g.watch->active());
  const auto vae = std::find(g.session.argv.begin(), g.session.argv.end(), "--vae");
  ASSERT_NE(vae, g.session.argv.end());
  EXPECT_EQ(*(vae + 1), absoluteOnThisHost("rel/vae"));

  // The stand-in ssh answers with this machine's files, one digest changed.
  const std::vector<dit::protocol::FileFingerprint> mine =
      dit::protocol::modelFileFingerprints({model.string(), worker.string()});
  ASSERT_EQ(mine.size(), 2u);
  ASSERT_EQ(mine[1].path, worker.string());
  auto answerWith = [&](std::size_t changed) {
    std::ofstream o(d.path / "ssh");
    o << "#!/bin/sh\n";
    for (std::size_t i = 0; i < mine.size(); ++i)
      o << "echo 'file " << mine[i].size << " "
        << (i == changed ? std::string(16, '0') : mine[i].digest) << " " << mine[i].path << "'\n";
    o << "echo 'fingerprint 0000000000000000'\nexit 0\n";
    o.close();
    fs::permissions(d.path / "ssh", fs::perms::owner_all);
  };
  const char* oldPath = std::getenv("PATH");
  const std::string saved = oldPath ? oldPath : "";
  ::setenv("PATH", (d.path.string() + ":" + saved).c_str(), 1);
  spec.launch.extra_worker_args.clear();  // the model folder only
  spec.preflight = true;
  std::string workerRefusal, modelRefusal, refusedHost;
  answerWith(1);
  try {
    prepareGroup(spec);
  } catch (const GroupRefused& e) {
    workerRefusal = e.what();
    refusedHost = e.host;
  }
  answerWith(0);
  try {
    prepareGroup(spec);
  } catch (const GroupRefused& e) {
    modelRefusal = e.what();
  }
  ::setenv("PATH", saved.c_str(), 1);
  EXPECT_EQ(refusedHost, "hostb");
  EXPECT_EQ(workerRefusal,
            "pre-flight failed:\nhost hostb runs a different worker binary: " + worker.string() +
                " differs (same size). Fix: install the same DiT Studio build at "
                "the same path on every host");
  EXPECT_EQ(modelRefusal.rfind("pre-flight failed:\nhost hostb holds a different model at " +
                                   model.string() + " (fingerprint 0000000000000000",
                               0),
            0u)
      << modelRefusal;
  EXPECT_NE(modelRefusal.find("transformer/weights.bin differs (same size)"), std::string::npos)
      << modelRefusal;
  EXPECT_EQ(modelRefusal.find("worker binary"), std::string::npos) << modelRefusal;
}
