#!/usr/bin/env bash
# Every link and image in README.md, ARCHITECTURE.md and docs/*.md resolves:
#   - a relative target (a repository file or folder) exists, relative to the Markdown file's folder
#     (a leading / is the repository root) and inside the repository;
#   - an #anchor (same file, or FILE.md#anchor) matches a heading of the target, slugged as GitHub
#     does (lowercase, spaces to '-', punctuation other than '-' and '_' removed, repeats -1, -2),
#     or an <a id/name="..."> in it;
#   - web links (http, https, mailto, any other scheme) are listed, never fetched.
# Links inside fenced code blocks and inline code spans are ignored. README.md must stay at most
# 12288 bytes (the details belong in docs/).
# Usage: bash tests/docs_links.sh REPO_ROOT
# Prints each broken link as FILE:LINE: target (cause) and exits 1 if there is any, else prints a
# count and exits 0. Needs only bash, coreutils and a POSIX awk (Debian's mawk).
set -uo pipefail
root=${1:?usage: bash tests/docs_links.sh REPO_ROOT}
cd "$root" || { echo "docs_links: cannot enter $root" >&2; exit 2; }
export LC_ALL=C
readme_limit=12288

# The Markdown files checked.
shopt -s nullglob
files=()
for f in README.md ARCHITECTURE.md docs/*.md; do [ -f "$f" ] && files+=("$f"); done
shopt -u nullglob

# Prints "LINE<TAB>TARGET" for every inline link / image ([text](target), ![alt](target)) and
# reference definition ([label]: target) of a Markdown file, outside code.
read -r -d '' links_awk <<'AWK'
function strip_code(s,   n, i, parts, out) {
  n = split(s, parts, "`"); out = ""
  for (i = 1; i <= n; i++) {
    if (!incode) out = out parts[i]
    if (i < n) incode = !incode
  }
  return out
}
{
  line = $0
  if (match(line, /^[ \t]*(```+|~~~+)/)) {
    m = substr(line, RSTART, RLENGTH); gsub(/[ \t]/, "", m)
    if (fence == "") { fence = m; next }
    if (substr(m, 1, 1) == substr(fence, 1, 1) && length(m) >= length(fence)) { fence = ""; next }
  }
  if (fence != "") next
  if (line ~ /^[ \t]*$/) { incode = 0; next }   # a code span never crosses a blank line
  line = strip_code(line)
  if (match(line, /^ ? ? ?\[[^]]+\]:[ \t]+[^ \t]+/)) {
    t = substr(line, RSTART, RLENGTH); sub(/^[^]]*\]:[ \t]+/, "", t)
    print NR "\t" t
    next
  }
  while (match(line, /\]\([^)]*\)/)) {
    t = substr(line, RSTART + 2, RLENGTH - 3)
    line = substr(line, RSTART + RLENGTH)
    sub(/^[ \t]+/, "", t)
    if (t ~ /^</) { sub(/^</, "", t); sub(/>.*$/, "", t) } else sub(/[ \t].*$/, "", t)
    print NR "\t" t
  }
}
AWK

# Prints the anchors of a Markdown file: its ATX headings slugged as GitHub does, and the id / name
# attributes of HTML anchors.
read -r -d '' headings_awk <<'AWK'
function slug(h,   s) {
  s = tolower(h)
  gsub(/\]\([^)]*\)/, "", s)
  gsub(/\342\200\224|\342\200\223|\302\267|\342\200\246|\342\200\230|\342\200\231|\342\200\234|\342\200\235|\303\227/, "", s)
  gsub(/[][!"#$%&'()*+,.\/:;<=>?@\\^`{|}~]/, "", s)
  gsub(/[ \t]/, "-", s)
  return s
}
{
  line = $0
  if (match(line, /^[ \t]*(```+|~~~+)/)) {
    m = substr(line, RSTART, RLENGTH); gsub(/[ \t]/, "", m)
    if (fence == "") { fence = m; next }
    if (substr(m, 1, 1) == substr(fence, 1, 1) && length(m) >= length(fence)) { fence = ""; next }
  }
  if (fence != "") next
  rest = line
  while (match(rest, /<a[ \t][^>]*(id|name)="[^"]*"/)) {
    a = substr(rest, RSTART, RLENGTH); sub(/^.*(id|name)="/, "", a); sub(/"$/, "", a)
    print a
    rest = substr(rest, RSTART + RLENGTH)
  }
  if (!match(line, /^ ? ? ?#+[ \t]/)) next
  h = line; sub(/^ *#+[ \t]+/, "", h)
  if (match(line, /#+/) && RLENGTH > 6) next
  sub(/[ \t]+#+[ \t]*$/, "", h); sub(/[ \t]+$/, "", h)
  s = slug(h)
  if (s in seen) { seen[s]++; print s "-" seen[s] } else { seen[s] = 0; print s }
}
AWK

declare -A anchor_cache
has_anchor() {  # has_anchor FILE ANCHOR: FILE (Markdown) has that anchor; anchors cached per file
  local f=$1
  if [ -z "${anchor_cache[$f]+set}" ]; then
    anchor_cache[$f]=$(awk "$headings_awk" "$f")
  fi
  grep -qxF -- "$2" <<< "${anchor_cache[$f]}"
}

broken=0 checked=0 web=0
fail() { echo "$1:$2: $3 ($4)"; broken=$((broken + 1)); }

size=$(wc -c < README.md 2>/dev/null || echo 0)
if [ ! -f README.md ]; then
  echo "README.md: missing"; broken=$((broken + 1))
elif [ "$size" -gt "$readme_limit" ]; then
  echo "README.md: $size bytes, over the limit of $readme_limit (12 KB): move detail into docs/"
  broken=$((broken + 1))
fi

web_list=()
for f in "${files[@]}"; do
  dir=$(dirname "$f")
  while IFS=$'\t' read -r ln target; do
    checked=$((checked + 1))
    if [ -z "$target" ]; then fail "$f" "$ln" "(empty)" "empty link target"; continue; fi
    if [[ $target =~ ^[A-Za-z][A-Za-z0-9+.-]*: ]]; then
      web=$((web + 1)); web_list+=("$f:$ln: $target"); continue
    fi
    path=${target%%#*}
    anchor=""
    [[ $target == *"#"* ]] && anchor=${target#*#}
    path=${path%%\?*}
    path=${path//%20/ }
    if [ -z "$path" ]; then
      tfile=$f
    elif [[ $path == /* ]]; then
      tfile=${path#/}
    else
      tfile=$dir/$path
    fi
    rel=$(realpath -m --relative-to=. -- "$tfile")
    if [[ $rel == ".." || $rel == ../* ]]; then
      fail "$f" "$ln" "$target" "outside the repository"; continue
    fi
    if [ ! -e "$rel" ]; then
      fail "$f" "$ln" "$target" "no such file: $rel"; continue
    fi
    if [ -n "$anchor" ]; then
      case $rel in
        *.md|*.MD|*.markdown)
          if ! has_anchor "$rel" "$anchor"; then
            fail "$f" "$ln" "$target" "no heading '#$anchor' in $rel"
          fi ;;
      esac
    fi
  done < <(awk "$links_awk" "$f")
done

if [ ${#web_list[@]} -gt 0 ]; then
  echo "docs_links: web links (listed, not fetched):"
  printf '  %s\n' "${web_list[@]}"
fi
if [ "$checked" -eq 0 ]; then
  echo "docs_links: no links found in ${files[*]} (the parser is broken?)"
  exit 1
fi
if [ "$broken" -gt 0 ]; then
  echo "docs_links: $broken problem(s) among $checked links in ${#files[@]} files"
  exit 1
fi
echo "docs_links: $checked links in ${#files[@]} files resolve ($web web links not fetched); README.md $size bytes (limit $readme_limit)"
