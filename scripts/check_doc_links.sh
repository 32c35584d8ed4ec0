#!/usr/bin/env bash
# Checks the repository's references to its own documents (not run by test.sh or CI):
#   1. every `docs/NAME.md[#anchor]` cited anywhere in the tree, and every
#      `(NAME.md[#anchor])` or `(#anchor)` link inside docs/, names an existing file and a
#      heading of it (GitHub-style anchors: lowercase, punctuation dropped, spaces to '-');
#   2. no source, script or document cites the design and spec notes that live outside the
#      repository (DESIGN.md, spec/*.md, STYLE.md, research/*.md, ../shared/).
# Prints each problem and exits 1 if there is any.
#
#   scripts/check_doc_links.sh
set -euo pipefail
cd "$(dirname "$0")/.."

status=0
files=$(git ls-files -co --exclude-standard | grep -v '^docs/bench/' |
          grep -E '\.(cc|h|cu|cuh|sh|md|txt|proto|py|js|mjs|yml|yaml|json)$|^\.clang-|^loadtest/compare$|^loadtest/gateway_vs_grpc$|^\.ci/' || true)

anchors_of() {  # the GitHub anchors of a markdown file's headings
  grep -E '^#{1,6} ' "$1" | sed -E 's/^#+ +//' | tr 'A-Z' 'a-z' |
    sed -E 's/[^a-z0-9 _-]//g; s/ /-/g'
}

check() {  # check FILE_OF_CITATION DOC ANCHOR
  local where=$1 doc=$2 anchor=$3
  if [ ! -f "$doc" ]; then
    echo "$where: $doc#$anchor: no such file"; status=1; return
  fi
  [ -z "$anchor" ] && return
  if ! anchors_of "$doc" | grep -qxF -- "$anchor"; then
    echo "$where: $doc#$anchor: no such heading"; status=1
  fi
}

# 1a. docs/NAME.md and docs/NAME.md#anchor anywhere.
while IFS= read -r hit; do
  file=${hit%%:*}
  ref=${hit#*:}
  case $ref in
    *#*) check "$file" "${ref%%#*}" "${ref#*#}" ;;
    *) check "$file" "$ref" "" ;;
  esac
done < <(for f in $files; do grep -oE 'docs/[a-z_-]+\.md(#[a-z0-9_-]+)?' "$f" | sed "s|^|$f:|" || true; done)

# 1b. relative links inside docs/: (NAME.md) and (NAME.md#anchor).
while IFS= read -r hit; do
  file=${hit%%:*}
  ref=${hit#*:}
  ref=${ref#(}
  ref=${ref%)}
  case $ref in
    *#*) check "$file" "docs/${ref%%#*}" "${ref#*#}" ;;
    *) check "$file" "docs/$ref" "" ;;
  esac
done < <(for f in docs/*.md; do grep -oE '\([a-z_-]+\.md(#[a-z0-9_-]+)?\)' "$f" | sed "s|^|$f:|" || true; done)

# 1c. in-page links inside docs/: (#anchor).
while IFS= read -r hit; do
  file=${hit%%:*}
  ref=${hit#*:}
  ref=${ref#(#}
  check "$file" "$file" "${ref%)}"
done < <(for f in docs/*.md; do grep -oE '\(#[a-z0-9_-]+\)' "$f" | sed "s|^|$f:|" || true; done)

# 2. Documents outside the repository.
outside='\.\./shared|/work/shared|DESIGN\.md|STYLE\.md|spec/(models|checkpoints|looped-families)\.md|research/[a-z-]+\.md|style-review|cuda-review'
for f in $files; do
  [ "$f" = scripts/check_doc_links.sh ] && continue
  if grep -nE "$outside" "$f" | sed "s|^|$f:|" | grep .; then
    status=1
  fi
done

[ "$status" = 0 ] && echo "check_doc_links: OK"
exit "$status"
