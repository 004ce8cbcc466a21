# Shared by the worker check scripts (sourced, not run): start a 2-rank worker group on the
# request lines given on stdin, then check its log. Expects MPIRUN, WORKER, MODEL and OUT (a
# temporary folder the caller removes) to be set; the group's stdout and stderr go to $OUT/log.

# run_group SECONDS: the group under `timeout SECONDS`, ring degree 2; fails unless it exits 0.
# At the end of a pipeline it runs in a subshell: write `... | run_group N || exit 1`.
run_group() {
  timeout "$1" $MPIRUN --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 \
    "$WORKER" --model "$MODEL" --ring-degree 2 > "$OUT/log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || fail "worker group exited with $rc"
}

# fail MESSAGE: print it and the group's log, exit 1.
fail() {
  echo "FAIL: $1"
  cat "$OUT/log"
  exit 1
}

# expect_log FIXED-STRING MESSAGE: the log contains the string, else fail MESSAGE.
expect_log() {
  grep -qF -- "$1" "$OUT/log" || fail "$2"
}

# expect_nonfatal_errors N: exactly N non-fatal error events in the log.
expect_nonfatal_errors() {
  local n
  n=$(grep -c '"event":"error","fatal":false' "$OUT/log")
  [ "$n" -eq "$1" ] || fail "expected $1 non-fatal error events, got $n"
}

# expect_bye: the group said goodbye (clean shutdown).
expect_bye() {
  expect_log '"event":"bye"' "no clean shutdown"
}
