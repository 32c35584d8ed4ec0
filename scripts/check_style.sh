#!/usr/bin/env bash
# Style gate of CI (.ci/run, after test.sh): checks the C++/CUDA sources (*.h *.cc *.cu *.cuh)
# added or modified between BASE and HEAD that are still in the tree, so every file touched
# since .ci/style-base must be clean and the checked set grows with each change.
#
#   scripts/check_style.sh [BASE [BUILD_DIR]]
#
# BASE: a commit (default: the one recorded in .ci/style-base). BUILD_DIR (argument or env,
# default build, relative to the repository root): a configured CMake tree whose
# compile_commands.json clang-tidy reads; after test.sh it is also built, so generated headers
# (proto/gen) exist. JOBS (default nproc) files are checked at once. CLANG_FORMAT and CLANG_TIDY
# name the tools (default clang-format / clang-tidy, else the -14 ones of Debian bookworm).
#
# Each file gets:
# - clang-format --dry-run -Werror (.clang-format): any line clang-format would change fails.
# - clang-tidy (.clang-tidy, every enabled check is an error) for .cc and .h only. A .cc is
#   checked with its own command from compile_commands.json; one that is not in it (not built
#   in this configuration, e.g. CUDA host code when MORSERVE_CUDA is off) is reported and
#   skipped. A header has no compile command: clang-tidy checks it on its own, as the main file,
#   with the flags of a sibling .cc (clang's compilation-database fallback for files without an
#   entry takes the closest entry by path and name, and compiles the header as a C++ header);
#   a header is skipped (and says so) when neither a .cc of its directory nor a .cc that
#   includes it is in the database (a header of code not built in this configuration).
#   Diagnostics count only in the file checked (--header-filter matches nothing), so a failure
#   always names a changed file; the config's HeaderFilterRegex is for clang-tidy by hand.
# - .cu and .cuh: clang-format only. clang-tidy 14 cannot parse them with this toolchain: the
#   database holds nvcc's flags (-forward-unknown-to-host-compiler, --generate-code=...), which
#   clang rejects, and clang 14's CUDA wrapper headers do not compile against CUDA 13's
#   (texture_fetch_functions.h is gone); CI's bookworm machine has no CUDA at all.
#
# Every failure prints the file and what is wrong (clang-format's diff, clang-tidy's
# diagnostics); the script then exits 1. With nothing changed it says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd -P)

base=${1:-}
if [ -z "$base" ]; then
  if [ ! -s .ci/style-base ]; then
    echo "check_style: no BASE given and .ci/style-base is missing" >&2
    exit 2
  fi
  base=$(tr -d '[:space:]' <.ci/style-base)
fi
BUILD_DIR=${2:-${BUILD_DIR:-build}}
JOBS=${JOBS:-$(nproc)}
if ! git rev-parse -q --verify "${base}^{commit}" >/dev/null; then
  if [ "$(git rev-parse --is-shallow-repository)" = true ]; then
    # A shallow clone cannot tell which files changed since BASE: say so loudly, fail nothing.
    echo "check_style: SKIPPED: BASE $base is not in this shallow clone's history; run it in" \
      "a full clone (or after git fetch --unshallow)" >&2
    exit 0
  fi
  echo "check_style: BASE $base is not a commit of this repository" >&2
  exit 2
fi
base_short=$(git rev-parse --short "${base}^{commit}")

files=()
while IFS= read -r -d '' f; do
  [ -f "$f" ] && files+=("$f")
done < <(git diff -z --name-only --no-renames --diff-filter=AM "$base" HEAD -- \
  '*.h' '*.cc' '*.cu' '*.cuh')
if [ ${#files[@]} -eq 0 ]; then
  echo "check_style: no C++/CUDA sources added or modified since $base_short: nothing to check"
  exit 0
fi

pick() {  # the first of the named tools that exists
  for t in "$@"; do
    if command -v "$t" >/dev/null 2>&1; then
      echo "$t"
      return 0
    fi
  done
  return 1
}
CLANG_FORMAT=${CLANG_FORMAT:-$(pick clang-format clang-format-14 || true)}
CLANG_TIDY=${CLANG_TIDY:-$(pick clang-tidy clang-tidy-14 || true)}
if [ -z "$CLANG_FORMAT" ] || [ -z "$CLANG_TIDY" ]; then
  echo "check_style: clang-format or clang-tidy not found (scripts/install_deps.sh installs" \
    "them)" >&2
  exit 2
fi
db=$BUILD_DIR/compile_commands.json
if [ ! -f "$db" ]; then
  echo "check_style: $db not found: configure $BUILD_DIR first (test.sh does; the top-level" \
    "CMakeLists.txt exports compile commands)" >&2
  exit 2
fi

# Is there an entry "file": "PREFIX" (a file) or "PREFIX<name>.cc" (a directory) in the database?
in_db() {  # in_db PREFIX: PREFIX is an absolute file path or a directory ending in /
  awk -v p="\"file\": \"$1" '
    { i = index($0, p) }
    i { rest = substr($0, i + length(p)); if (rest ~ /^([^\/]*\.cc)?"/) { found = 1; exit } }
    END { exit !found }' "$db"
}

# Is a .cc that includes header $1 in the database (a header-only directory like engine/core)?
includer_in_db() {
  local cc
  while IFS= read -r cc; do
    if in_db "$root/$cc"; then return 0; fi
  done < <(git grep -l -F "#include \"$1\"" -- '*.cc' || true)
  return 1
}

# check_one FILE OUT: writes the report for FILE to OUT; its first line is "ok", "FAIL" or
# "note", then the details.
check_one() {
  local f=$1 out=$2 fail=0 body="" log start
  start=$(date +%s.%N)
  log=$(mktemp)
  if ! "$CLANG_FORMAT" --dry-run -Werror "$f" >"$log" 2>&1; then
    fail=1
    body+="  clang-format: $(grep -c 'clang-format-violations' "$log" || true) place(s) not"
    body+=" formatted as .clang-format says (fix: $CLANG_FORMAT -i $f); the change it wants:"$'\n'
    body+=$("$CLANG_FORMAT" "$f" | diff -u "$f" - | tail -n +3 | head -n 40 | sed 's/^/    /' ||
      true)
    body+=$'\n'
  fi
  local tidy=1
  case $f in
    *.cu | *.cuh) tidy=0 ;;
    *.cc)
      if ! in_db "$root/$f"; then
        tidy=0
        body+="  clang-tidy: skipped, not in $db (not built in this configuration)"$'\n'
      fi
      ;;
    *.h)
      if ! in_db "$root/$(dirname "$f")/" && ! includer_in_db "$f"; then
        tidy=0
        body+="  clang-tidy: skipped, no .cc of $(dirname "$f")/ nor one that includes it is"
        body+=" in $db (not built in this configuration)"$'\n'
      fi
      ;;
  esac
  if [ $tidy = 1 ]; then
    local rc=0
    # Boost 1.74's Asio turns co_await support on for clang only through the Coroutines TS
    # (__cpp_coroutines), which clang 14 in C++20 mode does not define, so without the define
    # the gateway's coroutine code (boost::asio::awaitable) does not parse; gcc, which
    # compiles the tree, gets it on its own.
    "$CLANG_TIDY" -p "$BUILD_DIR" --quiet --header-filter='^$' \
      --extra-arg=-DBOOST_ASIO_HAS_CO_AWAIT "$f" >"$log" 2>&1 || rc=$?
    # Drop clang's counts of suppressed diagnostics (those in headers and system headers).
    sed -i -E '/^[0-9]+ (warning|error)s? (generated|treated as errors)\.?$/d;
      /^Suppressed [0-9]+ warnings/d; /^Use -header-filter=/d' "$log"
    if [ $rc -ne 0 ] || grep -qE ':[0-9]+:[0-9]+: (warning|error):' "$log"; then
      fail=1
      if grep -q 'clang-diagnostic-error' "$log"; then
        body+="  clang-tidy: the file does not compile with the flags of $db:"$'\n'
      else
        body+="  clang-tidy: $(grep -cE ':[0-9]+:[0-9]+: (warning|error):' "$log" || true)"
        body+=" finding(s) (.clang-tidy):"$'\n'
      fi
      body+=$(head -n 60 "$log" | sed "s|$root/||; s/^/    /")
      body+=$'\n'
    fi
  fi
  rm -f "$log"
  local secs
  secs=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
  if [ $fail = 1 ]; then
    printf 'FAIL %s (%ss)\n%s' "$f" "$secs" "$body" >"$out.part"
  elif [ -n "$body" ]; then
    printf 'note %s (%ss)\n%s' "$f" "$secs" "$body" >"$out.part"
  else
    printf 'ok   %s (%ss)\n' "$f" "$secs" >"$out.part"
  fi
  mv "$out.part" "$out"
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "check_style: ${#files[@]} file(s) added or modified since $base_short; $CLANG_FORMAT," \
  "$CLANG_TIDY -p $BUILD_DIR, $JOBS at a time"
# JOBS checks run at once; the reports come out in the order of the list as they complete.
failed=()
next=0
flush() {
  while [ "$next" -lt ${#files[@]} ] && [ -f "$tmp/$next" ]; do
    cat "$tmp/$next"
    if head -n 1 "$tmp/$next" | grep -q '^FAIL'; then
      failed+=("${files[$next]}")
    fi
    next=$((next + 1))
  done
}
for i in "${!files[@]}"; do
  check_one "${files[$i]}" "$tmp/$i" &
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do
    wait -n || true
    flush
  done
done
wait
flush
# A check that died without a report (an unexpected error in check_one) is a failure too.
while [ "$next" -lt ${#files[@]} ]; do
  echo "FAIL ${files[$next]}: the check itself did not finish (see the errors above)"
  failed+=("${files[$next]}")
  next=$((next + 1))
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "check_style: ${#failed[@]} of ${#files[@]} file(s) failed in $(( $(date +%s) - start ))s:"
  printf '  %s\n' "${failed[@]}"
  exit 1
fi
echo "check_style: ${#files[@]} file(s) clean in $(( $(date +%s) - start ))s"
