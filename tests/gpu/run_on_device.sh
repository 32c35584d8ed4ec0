#!/usr/bin/env bash
# Runs the carried GPU binaries on a GPU machine, inside one 10-minute device call (a shared
# deadline caps every step's time limit): the kernel tests, engine_gpu_test (the whole engine
# on the GPU against the reference), the engine benchmark at the SmolLM-360M shape of issue 4
# (`morserve bench --device cuda`, models made there by `morserve mkmodel`; JSON to $OUT), and
# the kernel micro-benchmark (kernel_bench, JSON to $OUT); then, as a separate part,
# compute-sanitizer (memcheck on every kernel test, racecheck and synccheck on the
# shared-memory kernels) on subsets. Logs go to $OUT (or ./gpu-test-out): one combined log,
# the gtest XML files in one archive, the benchmark JSON files in another (bench-json.tar.gz;
# they stay loose in a call cut short), and the benchmark tables and a summary printed last.
#   usage: bash .gpu-bin/run_on_device.sh [BIN_DIR] [tests|engine|sanitize|lora|recurrent|looped|huginn|ab|all]
#   BIN_DIR defaults to the script's folder; "tests" runs the tests and the benchmarks,
#   "engine" only engine_gpu_test and the engine benchmark, "sanitize" the compute-sanitizer
#   runs, "lora" only per-loop LoRA (kernel test, Relaxed engine families, LoRA benchmark),
#   "looped" the looped checkpoints (engine_gpu_test, memcheck on Ouro/Nanbeige, an
#   Ouro-1.4B-shaped bench of adaptive vs full depth: see the part below),
#   "ab-looped" an A/B of .gpu-bin/morserve-base against morserve on adaptive Ouro,
#   "huginn" Huginn-0125 (kernel tests, engine_gpu_test, memcheck on Huginn, a Huginn-shaped
#   bench of adaptive vs full depth: see the part below),
#   "ab" an A/B engine bench of .gpu-bin/morserve-base (copied there by hand) against morserve,
#   "all" (the default) everything; split them over two device calls when one
#   10-minute call is too short. "recurrent" (issue 11, its own call: about 3-5 minutes) runs
#   kernel_recurrent_attention_test (and under memcheck), engine_gpu_recurrent_test, and the
#   recurrent prefill benchmark (tiled vs naive on the GPU, prompt lengths 128..8192, a
#   4-layer SmolLM-360M-shaped recurrent model; JSON to $OUT/recurrent-prefill-gpu.json).
# Engine benchmark size (docs/design.md's protocol is 1000 requests, N(256, 64) tokens; the
# default here is cut to fit the call): BENCH_REQUESTS (256), BENCH_MEAN (128), BENCH_STD (32),
# BENCH_MAX_BATCH (256).
set -uo pipefail
bin=${1:-$(cd "$(dirname "$0")" && pwd)}
part=${2:-all}
# The binaries were linked here against CUDA 13's libcudart / libcublasLt; find them there.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The engine's Debian libraries, packed by build_for_device.sh (engine_gpu_test, morserve).
if [ -f "$bin/libs.tgz" ]; then
  mkdir -p /tmp/morserve-libs && tar xzf "$bin/libs.tgz" -C /tmp/morserve-libs
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/tmp/morserve-libs/lib
fi
deadline=$((SECONDS + ${DEADLINE_S:-570}))  # one device call is 600 s
out=${OUT:-./gpu-test-out}
mkdir -p "$out/xml"
log="$out/gpu-tests.log"
: >"$log"
nvidia-smi -L 2>&1 | tee -a "$log"
ldd "$bin/kernel_gemm_test" 2>&1 | grep -E 'not found|cuda|cublas' | tee -a "$log"
summary=()
run() {  # limit_s, name, command...   (rc 124: stopped at the limit; capped by the deadline)
  local limit=$1 name=$2
  shift 2
  local left=$((deadline - SECONDS))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 10 ]; then
    summary+=("$(printf '%-60s not run: the call'"'"'s time budget is spent' "$name")")
    return
  fi
  echo "=== $name: $*" >>"$log"
  local start=$SECONDS
  timeout "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  summary+=("$(printf '%-60s rc=%-3s %4ss' "$name" "$rc" $((SECONDS - start)))")
}
# The gtest XML files in one archive, and the benchmark JSON files in another (at the end of
# every part): a device call returns at most 8 files, and the tests part writes 6 JSON files.
pack_xml() {
  (cd "$out" && tar czf gtest-xml.tar.gz xml && rm -rf xml)
  (cd "$out" && ls ./*.json >/dev/null 2>&1 && tar czf bench-json.tar.gz ./*.json && rm -f ./*.json)
}
# The gtest tally, the summary (also to $out/summary.txt) and the failures, printed last.
report_summary() {
  summary+=("gtest lines: $(grep -c '^\[       OK \]' "$log") OK, $(grep -c '^\[  SKIPPED \] .*(' "$log") skipped, $(grep -c '^\[  FAILED  \] .*(' "$log") failed (sanitizer reruns counted again)")
  printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
  grep -h -E '^\[  FAILED  \]|ERROR SUMMARY: [1-9]' "$log" | sort -u | head -40
}
# The Ouro-1.4B-shaped random bf16 model of the looped and ab-looped parts in $models:
# ouro-full, and ouro-adaptive (the same files hard-linked, plus looped.json).
models=/tmp/morserve-models
make_ouro_models() {
  run 120 "mkmodel ouro-1.4b" "$bin/morserve" mkmodel --family ouro --hidden 2048 --layers 96 --recursions 4 \
    --heads 16 --kv-heads 16 --intermediate 5632 --vocab 49152 --max-pos 4096 \
    --exit-threshold "${OURO_Q:-0.7}" --router-bias "${OURO_B:-0.4}" --out $models/ouro-full
  mkdir -p $models/ouro-adaptive && ln -f $models/ouro-full/* $models/ouro-adaptive/ &&
    echo '{"mode": "adaptive"}' >$models/ouro-adaptive/looped.json
}
if [ "$part" = ab ]; then
  # A/B of the engine: $bin/morserve-base (carried by hand: the binary before a change) and
  # $bin/morserve on the same models in one call, base first then new, at batch 128 and 32
  # (vanilla and MoR-3, both modes), with engine_gpu_test and the sampling kernel test of the
  # new build first; JSON per run to $OUT.
  run 60 kernel_sampling_test "$bin/kernel_sampling_test" --gtest_output="xml:$out/xml/kernel_sampling_test.xml"
  run 120 engine_gpu_test "$bin/engine_gpu_test" --gtest_output="xml:$out/xml/engine_gpu_test.xml"
  models=/tmp/morserve-models
  shape="--hidden 960 --heads 15 --kv-heads 5 --intermediate 2560 --vocab 49152 --layers 32 --max-pos 1024"
  run 60 "mkmodel vanilla32" "$bin/morserve" mkmodel --family vanilla $shape --out $models/vanilla32
  run 60 "mkmodel mor3" "$bin/morserve" mkmodel --family mor-ec --recursions 3 --capacity 1,0.67,0.33 $shape --out $models/mor3
  for b in ${AB_BATCHES:-128 32}; do
    for which in base new; do
      exe="$bin/morserve"; [ "$which" = base ] && exe="$bin/morserve-base"
      run 90 "engine bench $which batch $b" "$exe" bench --device cuda --models $models/mor3,$models/vanilla32 \
        --requests "${BENCH_REQUESTS:-128}" --mean-tokens "${BENCH_MEAN:-96}" --std-tokens "${BENCH_STD:-24}" \
        --kv-cache-mb 16384 --membw-mb 0 --batches "$b" --out "$out/ab-$which-b$b.json"
    done
  done
  pack_xml
  grep -E '^(=== engine bench|/tmp/morserve-models)' "$log" | sed 's/: .*bench --device/: bench --device/' | head -40
  report_summary
  exit 0
fi
if [ "$part" = ab-looped ]; then
  # A/B of adaptive Ouro: $bin/morserve-base (carried by hand) and $bin/morserve on the
  # Ouro-1.4B-shaped model of the looped part (full and adaptive), batch 32, both modes, base
  # first then new, after kernel_kv_copy_test and engine_gpu_test's Ouro families; JSON per
  # binary to $OUT/ab-looped-{base,new}.json.
  run 60 kernel_kv_copy_test "$bin/kernel_kv_copy_test" --gtest_output="xml:$out/xml/kernel_kv_copy_test.xml"
  run 90 "engine_gpu_test ouro" "$bin/engine_gpu_test" --gtest_filter='*ouro*' \
    --gtest_output="xml:$out/xml/engine_gpu_test.xml"
  make_ouro_models
  for which in base new; do
    exe="$bin/morserve"; [ "$which" = base ] && exe="$bin/morserve-base"
    run 120 "ouro bench $which batch 32" "$exe" bench --device cuda \
      --models $models/ouro-full,$models/ouro-adaptive --prompt-len 16 --temperature 0.8 \
      --kv-cache-mb 40960 --membw-mb 0 --modes depth,sequence --batches 32 \
      --requests "${OURO_REQUESTS:-64}" --mean-tokens 64 --std-tokens 16 --warmup 4 \
      --out "$out/ab-looped-$which.json"
  done
  pack_xml
  sed -n '/^=== ouro bench/,/^===/p' "$log" | grep -v '^\[' | head -40
  report_summary
  exit 0
fi
if [ "$part" = looped ]; then
  # Looped checkpoints (issue 18): engine_gpu_test whole (every family, Nanbeige and Ouro
  # full/adaptive among them, against the reference; invariance and prefix cache with
  # adaptive Ouro), memcheck on the Ouro and Nanbeige families, then an Ouro-1.4B-shaped
  # random bf16 model (hidden 2048, 24 sandwich layers x total_ut_steps 4, 16 heads of 128,
  # MHA, intermediate 5632, vocab 49152) served in full and adaptive mode (the same files,
  # hard-linked, plus looped.json), depth-wise and sequence-wise: batch 1 (4 requests, prompt
  # 16) and batches 32 and 128 (OURO_REQUESTS, N(64, 16) tokens, temperature 0.8 as the CPU
  # run of docs/bench/ouro-adaptive-2026-11-26). JSON to $OUT/ouro-b1.json, ouro-batch.json.
  run 150 engine_gpu_test "$bin/engine_gpu_test" --gtest_output="xml:$out/xml/engine_gpu_test.xml"
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  [ -x "$san" ] && run 120 "memcheck engine_gpu_test looped" "$san" --tool memcheck --error-exitcode 1 \
    "$bin/engine_gpu_test" --gtest_filter='Families/EngineGpuTest.*/ouro_*:Families/EngineGpuTest.*/nanbeige'
  make_ouro_models
  ouro=("$bin/morserve" bench --device cuda --models $models/ouro-full,$models/ouro-adaptive
    --prompt-len 16 --temperature 0.8 --kv-cache-mb 40960 --membw-mb 1024 --modes depth,sequence)
  run 90 "ouro bench batch 1" "${ouro[@]}" --batches 1 --requests 4 --mean-tokens 64 --std-tokens 0 \
    --warmup 1 --out "$out/ouro-b1.json"
  run 240 "ouro bench batch 32,128" "${ouro[@]}" --batches 32,128 --requests "${OURO_REQUESTS:-128}" \
    --mean-tokens 64 --std-tokens 16 --warmup 4 --out "$out/ouro-batch.json"
  pack_xml
  sed -n '/^=== ouro bench/,/^===/p' "$log" | grep -v '^===' | grep -v '^\[' | head -60
  grep -E '^[a-z0-9_-]+ (depth|sequence): [0-9]+ of [0-9]+ steps compared' "$log" | head -60
  report_summary
  exit 0
fi
if [ "$part" = huginn ]; then
  # Huginn-0125 on the GPU (issue 18): the kernel tests, engine_gpu_test whole (every family,
  # huginn-full and huginn-adaptive among them, invariance and prefix cache on adaptive Huginn),
  # memcheck on the Huginn families, then a Huginn-shaped random bf16 model (hidden 2048, 16
  # heads of 128, MHA, intermediate 5632, vocab 65536, prelude 2 / core 4 / coda 2 SandwichBlocks,
  # 8 recurrences, KL threshold HUGINN_Q (10: exits after 2-8 recurrences, mean about 5 on the CPU
  # calibration) served full and adaptive (the same files hard-linked, looped.json differing),
  # depth-wise and sequence-wise at batch 1 (4 requests) and 8, 32 (HUGINN_REQUESTS, N(64, 16)),
  # temperature 0.8. JSON to $OUT/huginn-b1.json, huginn-batch.json.
  for t in "$bin"/kernel_*_test; do
    run 60 "$(basename "$t")" "$t" --gtest_output="xml:$out/xml/$(basename "$t").xml"
  done
  run 150 engine_gpu_test "$bin/engine_gpu_test" --gtest_output="xml:$out/xml/engine_gpu_test.xml"
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  [ -x "$san" ] && run 120 "memcheck engine_gpu_test huginn" "$san" --tool memcheck --error-exitcode 1 \
    "$bin/engine_gpu_test" --gtest_filter='Families/EngineGpuTest.*/huginn_*'
  run 90 "mkmodel huginn" "$bin/morserve" mkmodel --family huginn --hidden 2048 --heads 16 --kv-heads 16 \
    --intermediate 5632 --vocab 65536 --max-pos 2048 --prelude 2 --coda 2 --recursions 8 --layers 36 \
    --exit-threshold "${HUGINN_Q:-10}" --loop-mode full --out $models/huginn-full
  mkdir -p $models/huginn-adaptive && ln -f $models/huginn-full/* $models/huginn-adaptive/ &&
    rm -f $models/huginn-adaptive/looped.json &&
    echo "{\"mode\": \"adaptive\", \"exit_threshold\": ${HUGINN_Q:-10}}" >$models/huginn-adaptive/looped.json
  huginn=("$bin/morserve" bench --device cuda --models $models/huginn-full,$models/huginn-adaptive
    --prompt-len 16 --temperature 0.8 --kv-cache-mb 32768 --membw-mb 1024 --modes depth,sequence)
  run 90 "huginn bench batch 1" "${huginn[@]}" --batches 1 --requests 4 --mean-tokens 64 --std-tokens 0 \
    --warmup 1 --out "$out/huginn-b1.json"
  run 240 "huginn bench batch 8,32" "${huginn[@]}" --batches 8,32 --requests "${HUGINN_REQUESTS:-64}" \
    --mean-tokens 64 --std-tokens 16 --warmup 4 --out "$out/huginn-batch.json"
  pack_xml
  sed -n '/^=== huginn bench/,/^===/p' "$log" | grep -v '^===' | grep -v '^\[' | head -60
  grep -E '^[a-z0-9_-]+ (depth|sequence): [0-9]+ of [0-9]+ steps compared' "$log" | head -60
  report_summary
  exit 0
fi
if [ "$part" = lora ]; then
  # Per-loop LoRA alone, a short call: its kernel test, the engine's Relaxed families and
  # batch invariance on the GPU, kernel_bench's LoRA section (segmented kernels vs the
  # per-group cuBLASLt loop), compute-sanitizer on the LoRA test and one Relaxed engine
  # family; then the summary, and nothing else.
  run 120 kernel_lora_test "$bin/kernel_lora_test" --gtest_output="xml:$out/xml/kernel_lora_test.xml"
  run 300 "engine_gpu_test relaxed" "$bin/engine_gpu_test" --gtest_filter='*relaxed*' \
    --gtest_output="xml:$out/xml/engine_gpu_test.xml"
  run 120 "kernel_bench lora" "$bin/kernel_bench" "$out/kernel-bench-lora.json" lora
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [ -x "$san" ]; then
    run 120 "memcheck kernel_lora_test" "$san" --tool memcheck --error-exitcode 1 "$bin/kernel_lora_test"
    run 60 "racecheck lora" "$san" --tool racecheck --error-exitcode 1 \
      "$bin/kernel_lora_test" --gtest_filter='LoraTest.MixedSegmentsEveryRank'
    run 150 "memcheck engine_gpu_test relaxed" "$san" --tool memcheck --error-exitcode 1 \
      "$bin/engine_gpu_test" --gtest_filter='Families/EngineGpuTest.*/relaxed_lora_r13_every_projection'
  fi
  pack_xml
  sed -n '/^=== kernel_bench/,/^===/p' "$log" | grep -v '^==='
  report_summary
  exit 0
fi
for t in "$bin"/kernel_*_test; do
  [ "$part" = sanitize ] || [ "$part" = engine ] || [ "$part" = recurrent ] && break
  name=$(basename "$t")
  run 120 "$name" "$t" --gtest_output="xml:$out/xml/$name.xml"
done
# The kernel table right after the kernel tests, before the engine runs that may use the rest
# of the call.
[ "$part" != sanitize ] && [ "$part" != engine ] && [ "$part" != recurrent ] && run 120 "kernel_bench" "$bin/kernel_bench" "$out/kernel-bench.json"
if [ "$part" = recurrent ]; then  # issue 11: the tiled recurrent prefill on the GPU
  run 120 "kernel_recurrent_attention_test" "$bin/kernel_recurrent_attention_test" \
    --gtest_output="xml:$out/xml/kernel_recurrent_attention_test.xml"
  run 240 "engine_gpu_recurrent_test" "$bin/engine_gpu_recurrent_test" \
    --gtest_output="xml:$out/xml/engine_gpu_recurrent_test.xml"
  rmodel=/tmp/morserve-models/recurrent4
  run 60 "mkmodel recurrent4" "$bin/morserve" mkmodel --family recurrent --hidden 960 --heads 15 \
    --kv-heads 5 --intermediate 2560 --vocab 49152 --layers 4 --max-pos 8448 --out $rmodel
  # Writes JSON lengths as they finish, so a cut run still leaves the shorter ones.
  run 200 "recurrent prefill bench" sh -c "'$bin/recurrent_prefill_bench' $rmodel ${RPREFILL_MAX_LEN:-8192} 1 0 cuda >'$out/recurrent-prefill-gpu.json'"
  cat "$out/recurrent-prefill-gpu.json" >>"$log" 2>/dev/null
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  [ -x "$san" ] && run 90 "memcheck kernel_recurrent_attention_test" "$san" --tool memcheck \
    --error-exitcode 1 "$bin/kernel_recurrent_attention_test" \
    --gtest_filter='RecurrentAttentionTest.OffTileChunksGroup1Block5:RecurrentAttentionTest.LargestGroup'
fi
if [ "$part" != sanitize ] && [ "$part" != recurrent ] && [ -x "$bin/engine_gpu_test" ]; then
  run 200 "engine_gpu_test" "$bin/engine_gpu_test" --gtest_output="xml:$out/xml/engine_gpu_test.xml"
fi
if [ "$part" != sanitize ] && [ "$part" != recurrent ] && [ -x "$bin/morserve" ]; then
  # SmolLM-360M-shaped random bf16 models (issue 4): vanilla, Recursive-3 middle_cycle,
  # MoR-3 (middle_cycle) and MoR-4 (cycle: 4 divides 32), all 32 unrolled layers.
  models=/tmp/morserve-models
  shape="--hidden 960 --heads 15 --kv-heads 5 --intermediate 2560 --vocab 49152 --layers 32 --max-pos 1024"
  run 60 "mkmodel vanilla32" "$bin/morserve" mkmodel --family vanilla $shape --out $models/vanilla32
  run 60 "mkmodel rec3" "$bin/morserve" mkmodel --family recursive-middle-cycle --recursions 3 $shape --out $models/rec3
  run 60 "mkmodel mor3" "$bin/morserve" mkmodel --family mor-ec --recursions 3 --capacity 1,0.67,0.33 $shape --out $models/mor3
  run 60 "mkmodel mor4" "$bin/morserve" mkmodel --family mor-ec --sharing cycle --recursions 4 \
    --capacity 1,0.75,0.5,0.25 $shape --out $models/mor4
  bench=("$bin/morserve" bench --device cuda --models $models/mor3,$models/mor4,$models/rec3,$models/vanilla32
    --requests "${BENCH_REQUESTS:-256}" --mean-tokens "${BENCH_MEAN:-128}" --std-tokens "${BENCH_STD:-32}"
    --kv-cache-mb 16384)
  # Batch-1 decode after a long prompt: ms/token, and the weight bytes per second over the
  # device copy bandwidth the bench measures first (--membw-mb: MBU, the "bw frac" column); its
  # own JSON, written before the larger runs start.
  run 90 "engine bench batch 1" "$bin/morserve" bench --device cuda --models $models/vanilla32,$models/mor3 \
    --batches 1 --requests 4 --mean-tokens 64 --std-tokens 0 --prompt-len "${BENCH_B1_PROMPT:-512}" \
    --warmup 1 --modes depth --kv-cache-mb 4096 --membw-mb 1024 --out "$out/engine-bench-b1.json"
  # The same on the fixed-order GEMM (--cuda-gemm fixed) against pinned cuBLASLt (the default).
  run 90 "engine bench batch 1 fixed gemm" "$bin/morserve" bench --device cuda \
    --models $models/vanilla32,$models/mor3 --batches 1 --requests 4 --mean-tokens 64 --std-tokens 0 \
    --prompt-len "${BENCH_B1_PROMPT:-512}" --warmup 1 --modes depth --kv-cache-mb 4096 --membw-mb 1024 \
    --cuda-gemm fixed --out "$out/engine-bench-b1-fixed.json"
  # The same with per-warp keys in attention (--cuda-attention-fold warp) against the CTA fold.
  run 90 "engine bench batch 1 warp fold" "$bin/morserve" bench --device cuda \
    --models $models/vanilla32,$models/mor3 --batches 1 --requests 4 --mean-tokens 64 --std-tokens 0 \
    --prompt-len "${BENCH_B1_PROMPT:-512}" --warmup 1 --modes depth --kv-cache-mb 4096 --membw-mb 1024 \
    --cuda-attention-fold warp --out "$out/engine-bench-b1-warp.json"
  # The same with every kernel launched from the host (--cuda-graphs off): what the graphs save.
  run 90 "engine bench batch 1 graphs off" "$bin/morserve" bench --device cuda \
    --models $models/vanilla32,$models/mor3 --batches 1 --requests 4 --mean-tokens 64 --std-tokens 0 \
    --prompt-len "${BENCH_B1_PROMPT:-512}" --warmup 1 --modes depth --kv-cache-mb 4096 --membw-mb 1024 \
    --cuda-graphs off --out "$out/engine-bench-b1-eager.json"
  run 150 "engine bench batch 32" "${bench[@]}" --batches 32 --out "$out/engine-bench-b32.json"
  run 150 "engine bench max batch" "${bench[@]}" --batches "${BENCH_MAX_BATCH:-256}" --out "$out/engine-bench-bmax.json"
fi
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ "$part" = tests ] || [ "$part" = engine ] || [ "$part" = recurrent ]; then
  summary+=("sanitizer runs not requested (part=$part)")
elif [ -x "$san" ]; then
  # The quick attention cases (all code paths: chunks, combine, extra pair, faults, zeros).
  attn='PagedAttentionTest.KvLenZeroRowsGetZeros:PagedAttentionTest.ExtraPairOfRecurrentLayers:PagedAttentionTest.FaultyRowsBecomeNan'
  for t in "$bin"/kernel_*_test; do
    name=$(basename "$t")
    filter='*'
    [ "$name" = kernel_paged_attention_test ] && filter=$attn
    [ "$name" = kernel_gemm_test ] && filter='GemmTest.AlgorithmsAreCachedPerShape'
    run 60 "memcheck $name" "$san" --tool memcheck --error-exitcode 1 "$t" --gtest_filter="$filter"
  done
  if [ -x "$bin/engine_gpu_test" ]; then  # the runner's index arithmetic: LoRA, untied, recurrent
    run 150 "memcheck engine_gpu_test" "$san" --tool memcheck --error-exitcode 1 "$bin/engine_gpu_test" \
      --gtest_filter='Families/EngineGpuTest.*/relaxed_lora:Families/EngineGpuTest.*/recursive_untied_attn:Families/EngineGpuTest.*/recurrent'
  fi
  run 60 "racecheck attention" "$san" --tool racecheck --error-exitcode 1 \
    "$bin/kernel_paged_attention_test" --gtest_filter="$attn"
  run 60 "racecheck sampling" "$san" --tool racecheck --error-exitcode 1 \
    "$bin/kernel_sampling_test" --gtest_filter='SamplingTest.MatchesCpuSamplerOnTiedLogits'
  run 60 "racecheck lora" "$san" --tool racecheck --error-exitcode 1 \
    "$bin/kernel_lora_test" --gtest_filter='LoraTest.MixedSegmentsEveryRank'
  run 60 "synccheck attention" "$san" --tool synccheck --error-exitcode 1 \
    "$bin/kernel_paged_attention_test" --gtest_filter="$attn"
else
  summary+=("compute-sanitizer not found: sanitizer runs skipped")
fi
sed -n '/^=== kernel_bench/,/^===/p' "$log" | grep -v '^==='
sed -n '/^=== engine bench/,/^===/p' "$log" | grep -v '^===' | grep -v '^\[' | head -60
grep -E '^[a-z0-9_-]+ (depth|sequence): [0-9]+ of [0-9]+ steps compared' "$log" | head -60
if [ "$part" = recurrent ]; then
  grep -E '^recurrent[a-z0-9_-]* (tiled|naive|step)' "$log" | head -40
  cat "$out/recurrent-prefill-gpu.json" 2>/dev/null
fi
pack_xml
report_summary
