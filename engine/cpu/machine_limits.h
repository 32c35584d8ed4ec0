// The physical limits a CPU kernel is judged against, measured on the spot with the engine's
// thread pool: the read bandwidth of memory (mem_bandwidth.h: a streaming read of a buffer far
// larger than the caches, best of several passes), the fp32 FMA peak (independent FMA
// chains on every thread, 16 lanes wide on AVX-512 hosts, 8 on AVX2) and, where the host has
// AVX-512 BF16, the bf16 dot-product peak (VDPBF16PS chains: the roof of amx-bf16 weights on
// hosts without AMX). Benchmarks report their
// kernels as fractions of these figures, measured in the same run, because the machines they run on
// are shared and differ from session to session.
#pragma once

#include <cstdint>

#include "engine/cpu/thread_pool.h"

namespace morserve {

struct MachineLimits {
  double read_gbs = 0;    // bytes read per second / 1e9, all threads
  double fma_gflops = 0;  // fp32 multiply-adds x 2 per second / 1e9, all threads (0: no FMA unit)
  double bf16_dot_gflops = 0;  // bf16 products and their fp32 adds per second / 1e9 (0: none)
  int64_t buffer_bytes = 0;
  int threads = 0;
};

// Best of `tries` timed runs of FMA chains on every thread, at the widest width the host has
// (AVX-512F: 16 lanes, AVX2+FMA: 8; 0 without FMA).
double MeasureFmaPeak(ThreadPool* pool, int tries = 5);

// Best of `tries` timed runs of VDPBF16PS chains on every thread (0 without AVX-512 BF16).
double MeasureBf16DotPeak(ThreadPool* pool, int tries = 5);

// buffer_mb: MiB of the read-bandwidth buffer (>= 1).
MachineLimits MeasureMachineLimits(ThreadPool* pool, int64_t buffer_mb);

}  // namespace morserve
