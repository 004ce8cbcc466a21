#!/usr/bin/env bash
# The tree is formatted with .clang-format by clang-format 14 (Debian 12's); other major versions
# format some constructs differently, so the check insists on 14.
# Usage: bash packaging/format-check.sh          check: lists unformatted files, exit 1 if any
#        bash packaging/format-check.sh --fix    reformat them in place
# Environment: CLANG_FORMAT (default: clang-format-14, else clang-format if it is version 14).
set -euo pipefail
cd "$(dirname "$0")/.."
CF=${CLANG_FORMAT:-}
if [ -z "$CF" ]; then
  if command -v clang-format-14 >/dev/null; then CF=clang-format-14
  elif command -v clang-format >/dev/null; then CF=clang-format; fi
fi
if [ -z "$CF" ] || ! "$CF" --version | grep -q "version 14\."; then
  echo "format-check: needs clang-format 14 (Debian 12: apt-get install clang-format-14); found: ${CF:-none} $( [ -n "$CF" ] && "$CF" --version)" >&2
  exit 2
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.hpp' | grep -v '^tests/data/')
else  # a source tarball: every C++ file of the project's folders
  mapfile -t files < <(find app backend parallel ui tests \( -name '*.cpp' -o -name '*.h' -o -name '*.hpp' \) | grep -v '^tests/data/' | sort)
fi
if [ "${1:-}" = "--fix" ]; then
  "$CF" -i --style=file "${files[@]}"
  echo "format-check: formatted ${#files[@]} files"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  if ! "$CF" --style=file --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "format-check: ${#bad[@]} of ${#files[@]} files differ from .clang-format (fix: bash packaging/format-check.sh --fix):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "format-check: ${#files[@]} files match .clang-format"
