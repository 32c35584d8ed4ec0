// cpu_linear_bench: CpuLinear at the linear shapes of a SmolLM2-360M-sized model (hidden 960,
// 15 heads / 5 KV heads of 64, intermediate 2560, vocab 32000) for every weight format and
// M in {1, 2, 4, 8, 16, 32, 64, 128, 512}: microseconds per call, weight GB/s (bytes of W read
// once per call) and GFLOP/s, beside the machine's limits measured in the same run: the read
// bandwidth of a buffer far larger than the caches (engine/cpu/machine_limits.h) and the fp32
// FMA peak of the thread pool. Each shape cycles through copies of its weight that together
// exceed 256 MiB and twice the L3, so every call reads W from memory as a real model's step does
// (the whole 360M model is far larger than the caches). amx-bf16 runs too where the host has AMX,
// w8a8 where it has AVX-512 VNNI. Prints one JSON object.
// Usage: cpu_linear_bench [--quick] [--formats f32,bf16,int8,amx-bf16,w8a8]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/cpu/cpu_linear.h"
#include "engine/cpu/machine_limits.h"
#include "tests/random_values.h"

namespace morserve {
namespace {

struct Shape {
  const char* name;
  int n, k;
};
constexpr Shape kShapes[] = {{"qkv", 1600, 960},
                             {"o", 960, 960},
                             {"gate_up", 5120, 960},
                             {"down", 960, 2560},
                             {"lm_head", 32000, 960}};

// Bytes of weight copies a shape cycles through: at least 256 MiB and twice the last-level
// cache the host reports (servers with 300-500 MiB of L3 exist), so a call reads from memory.
int64_t RotationBytes() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return std::max<int64_t>(int64_t{256} << 20, l3 > 0 ? 2 * static_cast<int64_t>(l3) : 0);
}

template <typename Fn>
double SecondsPerCall(double budget_s, Fn&& fn) {
  fn();
  int reps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    fn();
    ++reps;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < budget_s);
  return elapsed / reps;
}

int Main(int argc, char** argv) {
  bool quick = false;
  std::string only;  // --formats: a comma-separated list of format names; empty for all
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--formats") == 0 && i + 1 < argc) {
      only = std::string(",") + argv[++i] + ",";
    } else {
      std::fprintf(stderr, "usage: cpu_linear_bench [--quick] [--formats f32,bf16,...]\n");
      return 2;
    }
  }
  ThreadPool* pool = DefaultThreadPool();
  const MachineLimits limits = MeasureMachineLimits(pool, quick ? 256 : 1024);
  std::printf(
      "{\"kernels\": \"%s\", \"threads\": %d, \"read_gbs\": %.2f, \"fma_gflops\": %.1f,\n "
      "\"runs\": [\n",
      std::string(BestLinearKernels().name).c_str(), pool->num_threads(), limits.read_gbs,
      limits.fma_gflops);
  bool first = true;
  std::vector<WeightFormat> formats = {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kQ8};
  // amx-bf16 (bf16 inputs on the AMX tile unit) where the host has it; its fma_fraction is still
  // against the fp32 FMA peak.
  if (AmxLinearKernels() != nullptr) formats.push_back(WeightFormat::kAmxBf16);
  if (W8A8VnniLinearKernels() != nullptr) formats.push_back(WeightFormat::kW8A8);
  for (WeightFormat f : formats) {
    if (!only.empty() &&
        only.find("," + std::string(WeightFormatName(f)) + ",") == std::string::npos)
      continue;
    for (const Shape& s : kShapes) {
      const auto w = testing::UniformRandom(static_cast<size_t>(s.n) * s.k, 1);
      std::vector<std::unique_ptr<CpuLinear>> copies;
      int64_t total = 0;
      do {
        copies.push_back(std::make_unique<CpuLinear>(w.data(), s.n, s.k, f, pool));
        total += copies.back()->weights().bytes();
      } while (total < RotationBytes());
      const CpuLinear& lin = *copies[0];
      size_t next = 0;
      for (int m : {1, 2, 4, 8, 16, 32, 64, 128, 512}) {
        if (quick && m > 32) continue;
        const auto x = testing::UniformRandom(static_cast<size_t>(m) * s.k, 2);
        std::vector<float> y(static_cast<size_t>(m) * s.n);
        const double sec = SecondsPerCall(quick ? 0.05 : 0.3, [&] {
          copies[next]->Forward(x.data(), m, y.data());
          next = (next + 1) % copies.size();
        });
        const double gbs = lin.weights().bytes() / sec / 1e9;
        const double gflops = 2.0 * m * s.n * s.k / sec / 1e9;
        std::printf(
            "%s  {\"format\": \"%s\", \"shape\": \"%s\", \"n\": %d, \"k\": %d, \"m\": %d, "
            "\"us\": %.1f, \"weight_gbs\": %.2f, \"bw_fraction\": %.3f, \"gflops\": %.1f, "
            "\"fma_fraction\": %.3f}",
            first ? "" : ",\n", std::string(WeightFormatName(f)).c_str(), s.name, s.n, s.k, m,
            sec * 1e6, gbs, gbs / limits.read_gbs, gflops, gflops / limits.fma_gflops);
        first = false;
        std::fflush(stdout);
      }
    }
  }
  std::printf("\n]}\n");
  return 0;
}

}  // namespace
}  // namespace morserve

int main(int argc, char** argv) { return morserve::Main(argc, argv); }
