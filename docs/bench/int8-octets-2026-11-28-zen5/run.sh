#!/usr/bin/env bash
# The prefill-lanes script (prefill, batch 1, batch 8; configs LABEL=MORSERVE_BINARY:WEIGHTS,
# alternating, ROUNDS times), run here with this folder's configs: see docs/benchmarks.md.
#   run.sh OUT "1 2" base=/tmp/bin/base-morserve:int8 new=build-cpu/server/morserve:int8
exec bash "$(dirname "$0")/../prefill-lanes-2026-11-28-zen5/run.sh" "$@"
