#!/usr/bin/env bash
# lt.sh BUILD OUTDIR MODEL MODE LABEL [extra server flags] -- one server, one decode load test
set -euo pipefail
build=$1 out=$2 model=$3 mode=$4 label=$5; shift 5
log=$out/$label.server.log
${MORSERVE_BIN:-$build/server/morserve} serve --model $model --port 0 --metrics-port 0 --mode $mode --max-batch 32 --threads 2 --kv-cache-mb 1536 "$@" >$log 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  addr=$(sed -n 's/^listening on //p' $log | head -1); metrics=$(sed -n 's/^metrics on //p' $log | head -1)
  [ -n "$addr" ] && [ -n "$metrics" ] && break; sleep 0.1; done
pst=""
$build/loadtest/morserve-loadtest run --grpc $addr --metrics-url http://$metrics/metrics --label $label --out $out/$label.json --no-progress --cpu-pid server=$pid --workload decode --num-requests ${NREQ:-100} --warmup 8 > $out/$label.txt 2>&1

curl -s http://$metrics/metrics | grep -E "^morserve_engine_steps|^morserve_.*step.*(sum|count)|^morserve_engine_step_phase|^morserve_generation_tokens" > $out/$label.metrics || true
kill -TERM $pid; wait $pid || true
