// cpu_linear_bench: CpuLinear at the linear shapes of a SmolLM2-360M-sized model (hidden 960,
// 15 heads / 5 KV heads of 64, intermediate 2560, vocab 32000) for every weight format and
// M in {1, 2, 4, 8, 16, 32, 64, 128, 512}: microseconds per call, weight GB/s (bytes of W read
// once per call) and GFLOP/s, beside the machine's limits measured in the same run: the read
// bandwidth of a buffer far larger than the caches (engine/cpu/machine_limits.h) and the fp32
// FMA peak of the thread pool. Each shape cycles through copies of its weight that together
// exceed 256 MiB and twice the L3, so every call reads W from memory as a real model's step does
// (the whole 360M model is far larger than the caches). amx-bf16 runs too where the host has AMX
// or AVX-512 BF16, w8a8 where it has AVX-512 VNNI, int8-octets where it has AVX-512. Prints one
// JSON object.
// Usage: cpu_linear_bench [--quick] [--formats f32,bf16,bf16-quads,int8,int8-octets,amx-bf16,w8a8]
//        cpu_linear_bench --side-by-side --formats bf16,bf16-quads [--m 1,8]: the formats' calls
//        alternate one by one; medians per call and each format's speed-up over the first.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
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

// The rotation of copies of one shape's weight in one format (see RotationBytes).
struct Rotation {
  std::vector<std::unique_ptr<CpuLinear>> copies;
  size_t next = 0;
  const CpuLinear& Next() {
    const CpuLinear& lin = *copies[next];
    next = (next + 1) % copies.size();
    return lin;
  }
};

Rotation MakeRotation(const std::vector<float>& w, const Shape& s, WeightFormat f,
                      ThreadPool* pool) {
  Rotation r;
  int64_t total = 0;
  do {
    r.copies.push_back(std::make_unique<CpuLinear>(w.data(), s.n, s.k, f, pool));
    total += r.copies.back()->weights().bytes();
  } while (total < RotationBytes());
  return r;
}

// --side-by-side: the formats' calls alternate one by one (kCalls each per shape and m), so a
// neighbour's load on a shared machine falls on every format alike; reports the median and
// 10th-percentile time per call and each format's median against the first one's.
void SideBySide(const std::vector<WeightFormat>& formats, const std::vector<int>& ms,
                ThreadPool* pool, const MachineLimits& limits) {
  constexpr int kCalls = 300;
  bool first = true;
  for (const Shape& s : kShapes) {
    const auto w = testing::UniformRandom(static_cast<size_t>(s.n) * s.k, 1);
    // Copies made in turn (one of each format, then the next), so that every format's copies lie
    // in the same stretches of memory: on a VM, memory allocated at different times can differ
    // in speed by 2x (measured here), which would otherwise land on one format.
    std::vector<Rotation> rot(formats.size());
    for (int64_t total = 0; total < RotationBytes();) {
      for (size_t f = 0; f < formats.size(); ++f) {
        rot[f].copies.push_back(std::make_unique<CpuLinear>(w.data(), s.n, s.k, formats[f], pool));
        if (f == 0) total += rot[f].copies.back()->weights().bytes();
      }
    }
    for (int m : ms) {
      const auto x = testing::UniformRandom(static_cast<size_t>(m) * s.k, 2);
      std::vector<float> y(static_cast<size_t>(m) * s.n);
      std::vector<std::vector<double>> us(formats.size());
      for (int call = -1; call < kCalls; ++call) {  // call -1 warms up
        for (size_t f = 0; f < formats.size(); ++f) {
          const CpuLinear& lin = rot[f].Next();
          const auto t0 = std::chrono::steady_clock::now();
          lin.Forward(x.data(), m, y.data());
          const auto t1 = std::chrono::steady_clock::now();
          if (call >= 0)
            us[f].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        }
      }
      double base = 0;
      for (size_t f = 0; f < formats.size(); ++f) {
        std::sort(us[f].begin(), us[f].end());
        const double med = us[f][us[f].size() / 2], p10 = us[f][us[f].size() / 10];
        if (f == 0) base = med;
        const double gbs = rot[f].copies[0]->weights().bytes() / med / 1e3;
        std::printf(
            "%s  {\"format\": \"%s\", \"shape\": \"%s\", \"n\": %d, \"k\": %d, \"m\": %d, "
            "\"median_us\": %.1f, \"p10_us\": %.1f, \"weight_gbs\": %.2f, \"bw_fraction\": %.3f, "
            "\"speedup_vs_first\": %.3f}",
            first ? "" : ",\n", std::string(WeightFormatName(formats[f])).c_str(), s.name, s.n, s.k,
            m, med, p10, gbs, gbs / limits.read_gbs, base / med);
        first = false;
      }
      std::fflush(stdout);
    }
  }
}

std::optional<WeightFormat> ParseWeightFormat(const std::string& name) {
  for (WeightFormat f : {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kF16,
                         WeightFormat::kQ8, WeightFormat::kAmxBf16, WeightFormat::kW8A8,
                         WeightFormat::kBF16Quads, WeightFormat::kQ8Octets}) {
    if (WeightFormatName(f) == name) return f;
  }
  return std::nullopt;
}

std::vector<std::string> SplitCommas(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t end = std::min(s.find(',', at), s.size());
    if (end > at) out.push_back(s.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

int Usage() {
  std::fprintf(stderr,
               "usage: cpu_linear_bench [--quick] [--formats f32,bf16,...]\n"
               "       cpu_linear_bench --side-by-side --formats A,B[,...] [--m 1,8,...]\n");
  return 2;
}

int Main(int argc, char** argv) {
  bool quick = false, side_by_side = false;
  std::string only;  // --formats: a comma-separated list of format names; empty for all
  std::string m_list = "1,8";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--side-by-side") == 0) {
      side_by_side = true;
    } else if (std::strcmp(argv[i], "--formats") == 0 && i + 1 < argc) {
      only = std::string(",") + argv[++i] + ",";
    } else if (std::strcmp(argv[i], "--m") == 0 && i + 1 < argc) {
      m_list = argv[++i];
    } else {
      return Usage();
    }
  }
  ThreadPool* pool = DefaultThreadPool();
  if (side_by_side) {
    std::vector<WeightFormat> formats;
    for (const std::string& name : SplitCommas(only)) {
      const auto f = ParseWeightFormat(name);
      if (!f) {
        std::fprintf(stderr, "cpu_linear_bench: unknown format '%s'\n", name.c_str());
        return 2;
      }
      formats.push_back(*f);
    }
    std::vector<int> ms;
    for (const std::string& m : SplitCommas(m_list)) ms.push_back(std::atoi(m.c_str()));
    if (formats.size() < 2 || ms.empty()) return Usage();
    const MachineLimits limits = MeasureMachineLimits(pool, 1024);
    std::printf("{\"kernels\": \"%s\", \"threads\": %d, \"read_gbs\": %.2f, \"runs\": [\n",
                std::string(BestLinearKernels().name).c_str(), pool->num_threads(),
                limits.read_gbs);
    SideBySide(formats, ms, pool, limits);
    const MachineLimits after = MeasureMachineLimits(pool, 1024);
    std::printf("\n], \"read_gbs_after\": %.2f}\n", after.read_gbs);
    return 0;
  }
  const MachineLimits limits = MeasureMachineLimits(pool, quick ? 256 : 1024);
  std::printf(
      "{\"kernels\": \"%s\", \"threads\": %d, \"read_gbs\": %.2f, \"fma_gflops\": %.1f,\n "
      "\"bf16_dot_gflops\": %.1f, "
      "\"runs\": [\n",
      std::string(BestLinearKernels().name).c_str(), pool->num_threads(), limits.read_gbs,
      limits.fma_gflops, limits.bf16_dot_gflops);
  bool first = true;
  // bf16-quads and int8-octets: the engine's bf16 and int8 formats on AVX-512 hosts.
  std::vector<WeightFormat> formats = {WeightFormat::kF32, WeightFormat::kBF16,
                                       WeightFormat::kBF16Quads, WeightFormat::kQ8};
  if (Avx512LinearKernels() != nullptr) formats.push_back(WeightFormat::kQ8Octets);
  // amx-bf16 (bf16 inputs on the AMX tile unit, or VDPBF16PS without AMX) where the host has
  // either; its fma_fraction is still against the fp32 FMA peak.
  if (AmxBf16BestLinearKernels() != nullptr) formats.push_back(WeightFormat::kAmxBf16);
  if (W8A8VnniLinearKernels() != nullptr) formats.push_back(WeightFormat::kW8A8);
  for (WeightFormat f : formats) {
    if (!only.empty() &&
        only.find("," + std::string(WeightFormatName(f)) + ",") == std::string::npos)
      continue;
    for (const Shape& s : kShapes) {
      const auto w = testing::UniformRandom(static_cast<size_t>(s.n) * s.k, 1);
      Rotation rot = MakeRotation(w, s, f, pool);
      const CpuLinear& lin = *rot.copies[0];
      for (int m : {1, 2, 4, 8, 16, 32, 64, 128, 512}) {
        if (quick && m > 32) continue;
        const auto x = testing::UniformRandom(static_cast<size_t>(m) * s.k, 2);
        std::vector<float> y(static_cast<size_t>(m) * s.n);
        const double sec =
            SecondsPerCall(quick ? 0.05 : 0.3, [&] { rot.Next().Forward(x.data(), m, y.data()); });
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
