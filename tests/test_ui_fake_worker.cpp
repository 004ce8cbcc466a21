// Test helper (not a test): a scripted stand-in for "mpirun ... ditstudio-worker" that speaks
// app/PROTOCOL.md, for the controller and window tests that must not depend on the real worker.
// FAKE_MODE selects the behaviour: ok (default), crash (mpirun reports rank 1 killed by signal 9),
// crash_mid (the same after two denoising steps, the ranks' stages reported first),
// error (fatal error event from rank 1 + MPI_Abort), error_both (the same event on stdout and
// stderr, as abortGroup writes it), error_stderr_only (only the stderr copy: mpirun lost the
// stdout line), badrequest (non-fatal error event), hang (ignores shutdown; only SIGTERM ends it),
// unknown_host (mpirun cannot start its daemon on the first non-local host of --hostfile: ssh
// cannot resolve the name; OpenMPI 4's stderr, no rank starts, exit 1), silent_remote (a
// hostfile group whose rank 1 stops mid-request: one step, then no event for FAKE_STALL seconds
// (default 3), then rank 0's collective timeout naming rank 1 (pid 5001 on fake-host-b) as "on
// another host that did not answer" and MPI_Abort).
// FAKE_DEV (bytes): the ranks report that much device memory (plus 1 MiB a step), as ranks on a
// GPU do; unset they report 0, as CPU ranks do. FAKE_TRUNCATE: before the first step each request
// gets the worker's `log` warning that the prompt was truncated.
// Like the worker it reports the `loading` status and per-rank stages in `ranks` events (with
// FAKE_STATUS set also `status` events encoding, denoising, decoding, idle), keeps its own queue
// and reads `cancel` and `shutdown` between steps (FAKE_STEP_SLEEP seconds per step, default 0),
// reports the seed FAKE_SEED (default 4242; any uint64 text) and, when a request has an
// output_dir, copies FAKE_IMAGE to <output_dir>/<id>-s<seed>.png (a name made from the request id
// alone, so ids that repeat across launches overwrite each other's files).
#include <QBuffer>
#include <QDir>
#include <QFile>
#include <QImage>
#include <QString>

namespace dit::ui::testing {
namespace {

const char kFake[] = R"SH(#!/bin/bash
# Stand-in for "mpirun ... ditstudio-worker ..." (test only).
np=1
args="$*"
hostfile=
while [ $# -gt 0 ]; do
  case "$1" in -np) np=$2; shift 2 ;; --hostfile) hostfile=$2; shift 2 ;; *) shift ;; esac
done
mode=${FAKE_MODE:-ok}
echo "$args" > "$FAKE_DIR/args.txt"
if [ "$mode" = unknown_host ]; then
  # What OpenMPI 4 prints when ssh cannot reach a host of the hostfile (no daemon, no rank).
  bad=$(sed -n 's/^[[:space:]]*\([^#[:space:]][^[:space:]]*\).*/\1/p' "$hostfile" 2>/dev/null \
        | grep -v -x -e localhost -e '127\..*' | head -n 1)
  echo "ssh: Could not resolve hostname ${bad:-nosuchhost}: Name or service not known" >&2
  echo "--------------------------------------------------------------------------" >&2
  echo "ORTE was unable to reliably start one or more daemons." >&2
  echo "This usually is caused by:" >&2
  echo "" >&2
  echo "* not finding the required libraries and/or binaries on" >&2
  echo "  one or more nodes. Please check your PATH and LD_LIBRARY_PATH" >&2
  echo "  settings, or configure OMPI with --enable-orterun-prefix-by-default" >&2
  echo "" >&2
  echo "* lack of authority to execute on one or more specified nodes." >&2
  echo "  Please verify your allocation and authorities." >&2
  echo "--------------------------------------------------------------------------" >&2
  exit 1
fi
dev0=${FAKE_DEV:-0}
echo "library noise: loading kernels"
r=0
while [ $r -lt $np ]; do
  host=fakehost.example.org
  if [ "$mode" = peer_lost ] && [ $r -ge 1 ]; then host=fake-host-b; fi
  echo "@@DIT {\"event\":\"hello\",\"rank\":$r,\"world\":$np,\"pid\":$((5000 + r)),\"host\":\"$host\"}"
  r=$((r + 1))
done
echo "[12:00:00] [rank 1/$np] loading shard" >&2
echo "@@DIT {\"event\":\"status\",\"stage\":\"loading\",\"message\":\"loading the model\"}"
echo "@@DIT {\"event\":\"ready\",\"world\":$np,\"strategy\":{},\"model\":{\"max_sequence_length\":512},\"load_seconds\":0.1}"
pending=()
id_of() { printf '%s' "$1" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p'; }
# A line read while a request runs: cancel of the running one (cancelled=1), of a queued one
# (dropped here), shutdown (after the running request), or a request to queue.
take() {
  echo "$1" >> "$FAKE_DIR/requests.txt"
  case "$1" in
    *'"type":"cancel"'*)
      cid=$(id_of "$1")
      if [ "$cid" = "$id" ]; then cancelled=1; return; fi
      keep=()
      for q in "${pending[@]}"; do
        if [ "$(id_of "$q")" = "$cid" ]; then
          echo "@@DIT {\"event\":\"cancelled\",\"id\":\"$cid\",\"step\":0}"
        else
          keep+=("$q")
        fi
      done
      pending=("${keep[@]}") ;;
    *'"type":"shutdown"'*) pending_shutdown=1 ;;
    *) pending+=("$1") ;;
  esac
}
while :; do
  if [ ${#pending[@]} -gt 0 ]; then
    line=${pending[0]}
    pending=("${pending[@]:1}")
  else
    IFS= read -r line || break
    echo "$line" >> "$FAKE_DIR/requests.txt"
  fi
  case "$line" in
    *'"type":"shutdown"'*)
      if [ "$mode" = hang ]; then continue; fi
      echo '@@DIT {"event":"bye"}'
      exit 0 ;;
    *'"type":"cancel"'*)
      cid=$(id_of "$line")
      echo "@@DIT {\"event\":\"cancelled\",\"id\":\"$cid\",\"step\":1}" ;;
    *'"type":"generate"'*)
      id=$(printf '%s' "$line" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')
      steps=$(printf '%s' "$line" | sed -n 's/.*"steps":\([0-9]*\).*/\1/p')
      outdir=$(printf '%s' "$line" | sed -n 's/.*"output_dir":"\([^"]*\)".*/\1/p')
      echo "@@DIT {\"event\":\"accepted\",\"id\":\"$id\",\"queue_position\":0}"
      if [ "$mode" = crash ]; then
        echo "--------------------------------------------------------------------------" >&2
        echo "Primary job  terminated normally, but 1 process returned" >&2
        echo "a non-zero exit code. Per user-direction, the job has been aborted." >&2
        echo "--------------------------------------------------------------------------" >&2
        echo "mpirun noticed that process rank 1 with PID 5001 on node fakehost exited on signal 9 (Killed)." >&2
        exit 137
      fi
      if [ "$mode" = error_stderr_only ] || [ "$mode" = error_both ]; then
        # abortGroup's copy on stderr (in the middle of another rank's stderr line, as OpenMPI 5
        # forwards it); with error_both the stdout copy arrives as well, with error_stderr_only
        # mpirun lost it.
        if [ "$mode" = error_both ]; then
          echo "@@DIT {\"event\":\"error\",\"id\":null,\"rank\":1,\"message\":\"out of memory in attention\",\"fatal\":true}"
        fi
        printf '[12:00:01] [rank 0/2] da' >&2
        echo "@@DIT {\"event\":\"error\",\"id\":null,\"rank\":1,\"message\":\"out of memory in attention\",\"fatal\":true}" >&2
        echo "[rank 1] fatal: out of memory in attention" >&2
        echo "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD" >&2
        echo "with errorcode 1." >&2
        exit 1
      fi
      if [ "$mode" = error ]; then
        echo "@@DIT {\"event\":\"error\",\"id\":\"$id\",\"rank\":1,\"message\":\"out of memory in attention\",\"fatal\":true}"
        echo "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD" >&2
        echo "with errorcode 1." >&2
        exit 1
      fi
      if [ "$mode" = peer_lost ]; then
        # OpenMPI 5: rank 0's TCP link to rank 1 closed; rank 0 aborted, prterun reports that.
        rule=--------------------------------------------------------------------------
        printf '%s\n' "$rule" "An MPI communication peer process has unexpectedly disconnected.  This" \
          "usually indicates a failure in the peer process (e.g., a crash or" \
          "otherwise exiting without calling MPI_FINALIZE first)." "" \
          "  Local host: fakehost" "  Local PID:  5000" "  Peer host:  fake-host-b" "$rule" >&2
        printf '%s\n' "[fakehost:00000] *** An error occurred in Socket closed" \
          "[fakehost:00000] *** reported by process [3333816321,0]" \
          "[fakehost:00000] *** MPI_ERRORS_ARE_FATAL (processes in this communicator will now abort," >&2
        exit 14
      fi
      if [ "$mode" = silent_remote ]; then
        echo "@@DIT {\"event\":\"progress\",\"id\":\"$id\",\"step\":1,\"steps\":$steps,\"step_ms\":5,\"eta_s\":0.1,\"image_index\":0}"
        sleep "${FAKE_STALL:-3}"
        echo "@@DIT {\"event\":\"error\",\"id\":null,\"rank\":0,\"message\":\"collective timeout after 4 s in allreduce (tp): rank 1 (pid 5001 on fake-host-b) is on another host that did not answer (is the link to it up?)\",\"fatal\":true}"
        echo "MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD" >&2
        echo "with errorcode 1." >&2
        exit 1
      fi
      if [ "$mode" = badrequest ]; then
        echo "@@DIT {\"event\":\"error\",\"id\":\"$id\",\"rank\":0,\"message\":\"width 66 is not a multiple of 4\",\"fatal\":false}"
        continue
      fi
      [ -n "$FAKE_STATUS" ] && echo "@@DIT {\"event\":\"status\",\"stage\":\"encoding\",\"message\":\"encoding $id\"}"
      [ -n "$FAKE_STATUS" ] && echo "@@DIT {\"event\":\"status\",\"stage\":\"denoising\",\"message\":\"denoising $id\"}"
      [ -n "$FAKE_TRUNCATE" ] && echo "@@DIT {\"event\":\"log\",\"rank\":0,\"level\":\"warning\",\"id\":\"$id\",\"message\":\"the prompt was truncated: CLIP can only handle sequences up to 77 tokens; 25 of its 100 tokens were dropped\"}"
      cancelled=0
      s=1
      while [ $s -le $steps ]; do
        if [ -n "$FAKE_STEP_SLEEP" ]; then
          # Requests that arrive during a step are read between steps, as the worker's reader does.
          if IFS= read -r -t "$FAKE_STEP_SLEEP" l; then
            take "$l"
          elif [ $? -le 128 ]; then
            sleep "$FAKE_STEP_SLEEP"  # stdin closed
          fi
        fi
        if [ $cancelled = 1 ]; then
          echo "@@DIT {\"event\":\"cancelled\",\"id\":\"$id\",\"step\":$s}"
          break
        fi
        echo "noise between steps"
        echo "@@DIT {\"event\":\"progress\",\"id\":\"$id\",\"step\":$s,\"steps\":$steps,\"step_ms\":5,\"eta_s\":0.1,\"image_index\":0}"
        dev=0
        [ "$dev0" -gt 0 ] && dev=$((dev0 + s * 1048576))
        echo "@@DIT {\"event\":\"ranks\",\"ranks\":[{\"rank\":0,\"stage\":\"denoising\",\"step\":$s,\"steps\":$steps,\"rss\":$((100000000 + s)),\"rss_peak\":200000000,\"dev\":$dev,\"dev_peak\":$dev,\"bytes_sent\":$((s * 1000)),\"step_ms\":5},{\"rank\":1,\"stage\":\"denoising\",\"step\":$s,\"steps\":$steps,\"rss\":90000000,\"rss_peak\":90000000,\"dev\":$dev,\"dev_peak\":$dev,\"bytes_sent\":$((s * 1000)),\"step_ms\":5}]}"
        echo "@@DIT {\"event\":\"preview\",\"id\":\"$id\",\"step\":$s,\"image_index\":0,\"png\":\"$FAKE_PREVIEW\"}"
        if [ "$mode" = crash_mid ] && [ $s -ge 2 ]; then
          sleep 0.3
          echo "mpirun noticed that process rank 1 with PID 5001 on node fakehost exited on signal 9 (Killed)." >&2
          exit 137
        fi
        s=$((s + 1))
      done
      if [ $cancelled = 0 ]; then
        [ -n "$FAKE_STATUS" ] && echo "@@DIT {\"event\":\"status\",\"stage\":\"decoding\",\"message\":\"decoding $id\"}"
        seed=${FAKE_SEED:-4242}
        path=$FAKE_IMAGE
        if [ -n "$outdir" ]; then
          path="$outdir/$id-s$seed.png"
          cp "$FAKE_IMAGE" "$path"
        fi
        echo "@@DIT {\"event\":\"image\",\"id\":\"$id\",\"image_index\":0,\"path\":\"$path\",\"seed\":$seed,\"params\":{\"prompt\":\"fake\",\"seed\":$seed},\"seconds\":0.2}"
        echo "@@DIT {\"event\":\"done\",\"id\":\"$id\",\"seconds\":0.2}"
      fi
      # Every rank back to idle, as the worker reports it after each request (no step time).
      echo "@@DIT {\"event\":\"ranks\",\"ranks\":[{\"rank\":0,\"stage\":\"idle\",\"step\":0,\"steps\":0,\"rss\":100000000,\"rss_peak\":200000000,\"dev\":$dev0,\"dev_peak\":$dev0,\"bytes_sent\":0,\"step_ms\":0},{\"rank\":1,\"stage\":\"idle\",\"step\":0,\"steps\":0,\"rss\":90000000,\"rss_peak\":90000000,\"dev\":$dev0,\"dev_peak\":$dev0,\"bytes_sent\":0,\"step_ms\":0}]}"
      [ -n "$FAKE_STATUS" ] && echo "@@DIT {\"event\":\"status\",\"stage\":\"idle\",\"message\":\"idle\"}"
      if [ -n "$pending_shutdown" ]; then
        echo '@@DIT {"event":"bye"}'
        exit 0
      fi ;;
  esac
done
# stdin closed
if [ "$mode" = hang ]; then exec sleep 30; fi
exit 0
)SH";

}  // namespace

QString writeFakeMpirun(const QString& dir) {
  const QString script = QDir(dir).filePath("fake-mpirun.sh");
  QFile f(script);
  if (!f.open(QIODevice::WriteOnly)) return {};
  f.write(kFake);
  f.close();
  if (!f.setPermissions(QFile::ReadOwner | QFile::WriteOwner | QFile::ExeOwner)) return {};
  QImage img(4, 4, QImage::Format_RGB32);
  img.fill(Qt::green);
  img.setText("parameters", R"({"prompt":"fake","width":4,"height":4,"steps":1,"seed":4242})");
  const QString out = QDir(dir).filePath("out.png");
  if (!img.save(out)) return {};
  QByteArray png;
  QBuffer b(&png);
  b.open(QIODevice::WriteOnly);
  img.save(&b, "PNG");
  qputenv("FAKE_DIR", dir.toLocal8Bit());
  qputenv("FAKE_IMAGE", out.toLocal8Bit());
  qputenv("FAKE_PREVIEW", png.toBase64());
  return script;
}

}  // namespace dit::ui::testing
