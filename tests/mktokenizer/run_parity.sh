#!/usr/bin/env bash
# Parity of a `morserve mktokenizer` tokenizer with @lenml/tokenizers (transformers.js port):
# trains the demo tokenizer, encodes the corpus files and 200 random Unicode strings with both
# (morserve through `morserve tokenize --json`), and compares ids and decoded text.
# usage: run_parity.sh MORSERVE_BINARY [NODE_MODULES_DIR]
# NODE_MODULES_DIR defaults to tests/tokenizer/node_modules, installed there by npm (the
# tokenizer parity test's package.json) when missing. Exit 3: node/npm missing (a skip).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$1
modules=${2:-$here/../tokenizer/node_modules}
if ! command -v node >/dev/null; then echo "run_parity.sh: node is required" >&2; exit 3; fi
if [ $# -lt 2 ] && [ ! -f "$modules/@lenml/tokenizers/package.json" ] && command -v npm >/dev/null; then
  (cd "$here/../tokenizer" && npm install --no-audit --no-fund --loglevel=error >&2)
fi
if [ ! -f "$modules/@lenml/tokenizers/package.json" ]; then
  echo "run_parity.sh: @lenml/tokenizers not found in $modules (tests/tokenizer/run_parity.sh installs it)" >&2
  exit 3
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ln -s "$(cd "$modules" && pwd)" "$work/node_modules"
cp "$here/parity.mjs" "$work/"
files=(/usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 "$here/../../README.md")
"$bin" mktokenizer --corpus /usr/share/common-licenses,"$here/../../README.md" --vocab-size 4096 \
  --out "$work/tok" >/dev/null
node "$work/parity.mjs" "$work/tok" "${files[@]}" >"$work/expected.jsonl"
python3 - "$bin" "$work/tok" "$work/expected.jsonl" <<'PY'
import json, subprocess, sys
binary, tok, expected = sys.argv[1:]
ok = bad = 0
for line in open(expected, encoding="utf-8"):
    e = json.loads(line)
    text = e["text"] if "text" in e else open(e["name"], encoding="utf-8").read()
    out = subprocess.run([binary, "tokenize", "--model", tok, "--json", "-"], input=text.encode(),
                         capture_output=True, check=True).stdout
    ids = json.loads(out)["ids"]
    dec = subprocess.run([binary, "tokenize", "--model", tok, "--decode",
                          ",".join(map(str, e["ids"]))], capture_output=True, check=True).stdout
    dec = dec.decode()[:-1]  # the trailing newline of the CLI
    if ids == e["ids"] and dec == e["decoded"] == "<|begin_of_text|>" + text:
        ok += 1
    else:
        bad += 1
        print(f"MISMATCH {e['name']}: ids equal {ids == e['ids']}, decode equal {dec == e['decoded']}, "
              f"round trip {e['decoded'] == '<|begin_of_text|>' + text}", file=sys.stderr)
print(f"mktokenizer parity: {ok}/{ok + bad} inputs equal (ids with BOS, decode, round trip)")
sys.exit(1 if bad else 0)
PY
