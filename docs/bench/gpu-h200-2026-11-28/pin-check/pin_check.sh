#!/usr/bin/env bash
# One short device call: the cuBLASLt pin by check on hardware (kernel_gemm_test), the kernel
# table (fixed vs pinned cuBLASLt), engine_gpu_test, and batch-1 decode default vs fixed GEMM.
b=.gpu-bin; o=${OUT:-/tmp/out}; mkdir -p "$o"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p /tmp/l && tar xzf $b/libs.tgz -C /tmp/l && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/tmp/l/lib
t0=$SECONDS
timeout 20 $b/kernel_gemm_test >"$o/gemm-test.log" 2>&1; echo "kernel_gemm_test rc=$? $((SECONDS-t0))s"
timeout 55 $b/kernel_bench "$o/kernel-bench.json" >"$o/kernel-bench.log" 2>&1; echo "kernel_bench rc=$? $((SECONDS-t0))s"
timeout 45 $b/engine_gpu_test >"$o/engine.log" 2>&1; echo "engine_gpu_test rc=$? $((SECONDS-t0))s"
m=/tmp/m; sh="--hidden 960 --heads 15 --kv-heads 5 --intermediate 2560 --vocab 49152 --layers 32 --max-pos 1024"
timeout 20 $b/morserve mkmodel --family vanilla $sh --out $m/vanilla32 >"$o/bench.log" 2>&1
for g in auto fixed; do
  timeout 20 $b/morserve bench --device cuda --models $m/vanilla32 --batches 1 --requests 4 --mean-tokens 64 \
    --std-tokens 0 --prompt-len 512 --warmup 1 --modes depth --kv-cache-mb 4096 --membw-mb 0 \
    --cuda-gemm $g --out "$o/b1-$g.json" >>"$o/bench.log" 2>&1; echo "bench $g rc=$? $((SECONDS-t0))s"
done
grep -E '^\[  FAILED  \]|^\[  PASSED' "$o/gemm-test.log" "$o/engine.log" | sort -u | head -20
grep -E 'offers|^(gemm|fixed-gemm)' "$o/kernel-bench.log" | head -60
grep -E 'vanilla|fixed-order' "$o/bench.log" | head -8
