#!/usr/bin/env bash
# Fault-injection test driver.
#   parallel_expect_failure.sh LIMIT_S [--expect REGEX]... -- COMMAND [ARGS...]
# Runs COMMAND (stdout+stderr merged) under a LIMIT_S wall-clock limit and passes (exit 0) when
#   - it exits with a non-zero status before the limit (a failing rank took the group down), and
#   - its output matches every extended REGEX (grep -E), e.g. the failing rank and the cause.
# Prints the output, the exit status and the elapsed time.
set -u
limit="$1"; shift
expects=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case "$1" in
    --expect) expects+=("$2"); shift 2 ;;
    *) echo "parallel_expect_failure.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || { echo "parallel_expect_failure.sh: no command" >&2; exit 2; }

out="$(mktemp "${TMPDIR:-/tmp}/dit_fault_out.XXXXXX")"
trap 'rm -f "$out"' EXIT
start=$(date +%s.%N)
timeout --kill-after=5 "$limit" "$@" >"$out" 2>&1
rc=$?
end=$(date +%s.%N)
elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
cat "$out"
echo "---- exit status $rc after ${elapsed} s (limit ${limit} s)"
fail=0
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "FAIL: the group did not go down within ${limit} s"
  fail=1
elif [ "$rc" -eq 0 ]; then
  echo "FAIL: the command exited 0, expected a non-zero exit status"
  fail=1
fi
for re in "${expects[@]}"; do
  if grep -Eq -- "$re" "$out"; then
    echo "ok: output matches: $re"
  else
    echo "FAIL: output does not match: $re"
    fail=1
  fi
done
[ "$fail" -eq 0 ] && echo "PASS (${elapsed} s)"
exit "$fail"
