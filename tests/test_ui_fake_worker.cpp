// Test helper (not a test): a scripted stand-in for "mpirun ... ditstudio-worker" that speaks
// app/PROTOCOL.md, for the controller and window tests that must not depend on the real worker.
// FAKE_MODE selects the behaviour: ok (default), crash (mpirun reports rank 1 killed by signal 9),
// error (fatal error event from rank 1 + MPI_Abort), error_both (the same event on stdout and
// stderr, as abortGroup writes it), error_stderr_only (only the stderr copy: mpirun lost the
// stdout line), badrequest (non-fatal error event), hang
// (ignores shutdown; only SIGTERM ends it).
#include <QBuffer>
#include <QDir>
#include <QFile>
#include <QImage>
#include <QString>

namespace dit::ui::testing {
namespace {

const char kFake[] = R"SH(#!/bin/sh
# Stand-in for "mpirun ... ditstudio-worker ..." (test only).
np=1
args="$*"
while [ $# -gt 0 ]; do
  case "$1" in -np) np=$2; shift 2 ;; *) shift ;; esac
done
mode=${FAKE_MODE:-ok}
echo "$args" > "$FAKE_DIR/args.txt"
echo "library noise: loading kernels"
r=0
while [ $r -lt $np ]; do
  echo "@@DIT {\"event\":\"hello\",\"rank\":$r,\"world\":$np,\"pid\":$((5000 + r))}"
  r=$((r + 1))
done
echo "[12:00:00] [rank 1/$np] loading shard" >&2
echo "@@DIT {\"event\":\"ready\",\"world\":$np,\"strategy\":{},\"model\":{\"max_sequence_length\":512},\"load_seconds\":0.1}"
while IFS= read -r line; do
  echo "$line" >> "$FAKE_DIR/requests.txt"
  case "$line" in
    *'"type":"shutdown"'*)
      if [ "$mode" = hang ]; then continue; fi
      echo '@@DIT {"event":"bye"}'
      exit 0 ;;
    *'"type":"cancel"'*)
      id=$(printf '%s' "$line" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')
      echo "@@DIT {\"event\":\"cancelled\",\"id\":\"$id\",\"step\":1}" ;;
    *'"type":"generate"'*)
      id=$(printf '%s' "$line" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')
      steps=$(printf '%s' "$line" | sed -n 's/.*"steps":\([0-9]*\).*/\1/p')
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
      if [ "$mode" = badrequest ]; then
        echo "@@DIT {\"event\":\"error\",\"id\":\"$id\",\"rank\":0,\"message\":\"width 66 is not a multiple of 4\",\"fatal\":false}"
        continue
      fi
      s=1
      while [ $s -le $steps ]; do
        echo "noise between steps"
        echo "@@DIT {\"event\":\"progress\",\"id\":\"$id\",\"step\":$s,\"steps\":$steps,\"step_ms\":5,\"eta_s\":0.1,\"image_index\":0}"
        echo "@@DIT {\"event\":\"ranks\",\"ranks\":[{\"rank\":0,\"stage\":\"denoising\",\"step\":$s,\"steps\":$steps,\"rss\":$((100000000 + s)),\"rss_peak\":200000000,\"dev\":0,\"dev_peak\":0,\"bytes_sent\":$((s * 1000)),\"step_ms\":5},{\"rank\":1,\"stage\":\"denoising\",\"step\":$s,\"steps\":$steps,\"rss\":90000000,\"rss_peak\":90000000,\"dev\":0,\"dev_peak\":0,\"bytes_sent\":$((s * 1000)),\"step_ms\":5}]}"
        echo "@@DIT {\"event\":\"preview\",\"id\":\"$id\",\"step\":$s,\"image_index\":0,\"png\":\"$FAKE_PREVIEW\"}"
        s=$((s + 1))
      done
      echo "@@DIT {\"event\":\"image\",\"id\":\"$id\",\"image_index\":0,\"path\":\"$FAKE_IMAGE\",\"seed\":4242,\"params\":{\"prompt\":\"fake\",\"seed\":4242},\"seconds\":0.2}"
      echo "@@DIT {\"event\":\"done\",\"id\":\"$id\",\"seconds\":0.2}" ;;
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
