#!/usr/bin/env bash
# CI's sanitizer leg (called from .ci/run): the `sanitize` preset (AddressSanitizer +
# UndefinedBehaviorSanitizer, RelWithDebInfo, no GUI, build-sanitize/) builds only the targets
# that the unit, fuzz and security tests run (their executables, read from ctest's own test list,
# and what those depend on, e.g. ditstudio-cli/-worker for the fuzz suite), then runs those tests
# (testPresets "sanitize": ASAN_OPTIONS / UBSAN_OPTIONS halt on the first report, so any finding
# fails the test). Leak detection is off: OpenMPI and LibTorch keep process-lifetime allocations.
# Prints the time of each phase; DITSTUDIO_SANITIZE_JOBS sets the build parallelism (default 2).
#
#   bash .ci/sanitize.sh [build|test]   (default: both; .ci/run builds in the background first)
set -euo pipefail
cd "$(dirname "$0")/.."
phase=${1:-all}
case "$phase" in
  all|build|test) ;;
  *) echo "sanitize: unknown phase '$phase' (expected build or test)" >&2; exit 2 ;;
esac
if [ "$phase" = test ]; then
  t1=$(date +%s)
  ctest --preset sanitize
  echo "sanitize: tests $(($(date +%s) - t1)) s"
  exit 0
fi
t0=$(date +%s)
cmake --preset sanitize -DCMAKE_CXX_COMPILER_LAUNCHER="${CMAKE_CXX_COMPILER_LAUNCHER:-}" >/dev/null
# Every executable a selected test runs: the arguments of its add_test() in the generated
# CTestTestfile.cmake files that are files of this build tree (a test binary run directly or
# through mpirun), as target names (executables are named after their targets).
mapfile -t names < <(ctest --preset sanitize --show-only=json-v1 | jq -r '.tests[].name')
targets=()
for f in $(find build-sanitize -name CTestTestfile.cmake); do
  while IFS= read -r line; do
    name=${line#add_test([=[}
    name=${name%%]=]*}
    for n in "${names[@]}"; do
      if [ "$n" = "$name" ]; then
        for w in $(grep -o "\"$PWD/build-sanitize/[^\"]*\"" <<<"$line" | tr -d '"'); do
          targets+=("$(basename "$w")")
        done
        break
      fi
    done
  done < <(grep '^add_test(' "$f")
done
mapfile -t targets < <(printf '%s\n' "${targets[@]}" | sort -u)
if [ "${#targets[@]}" -eq 0 ]; then
  echo "sanitize: no test selected (labels unit, fuzz, security)" >&2
  exit 1
fi
echo "sanitize: building ${#targets[@]} targets: ${targets[*]}"
cmake --build build-sanitize -j "${DITSTUDIO_SANITIZE_JOBS:-2}" --target "${targets[@]}"
t1=$(date +%s)
if [ "$phase" = build ]; then
  echo "sanitize: configure + build $((t1 - t0)) s"
  exit 0
fi
ctest --preset sanitize
t2=$(date +%s)
echo "sanitize: configure + build $((t1 - t0)) s, tests $((t2 - t1)) s, total $((t2 - t0)) s"
