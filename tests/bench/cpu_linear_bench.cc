// cpu_linear_bench: GFLOP/s of CpuLinear at the SmolLM2-135M gate/up shape (W [1536, 576]) for
// M in {1, 8, 32, 128}, F32 and (where the host has it) BF16, next to a plain oneDNN matmul
// created for the exact M with default threading. It also reports whether that plain matmul is
// batch invariant: rows computed with M = 1, 3, 7, 16, 33 compared bitwise with M = 64.
// Prints one JSON object. Usage: cpu_linear_bench [reps]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dnnl.hpp"
#include "engine/cpu/cpu_linear.h"

namespace morserve {
namespace {

constexpr int kN = 1536;
constexpr int kK = 576;

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

template <typename Fn>
double MicrosPerCall(int reps, Fn&& fn) {
  for (int i = 0; i < 5; ++i) fn();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) fn();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / reps;
}

// A plain f32 oneDNN matmul for exactly m rows, weights reordered for that m.
struct PlainMatmul {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{eng};
  dnnl::matmul prim;
  dnnl::memory weights;
  dnnl::memory::desc src_md, dst_md;
  std::string impl;

  PlainMatmul(const std::vector<float>& w, int m) {
    using dnnl::memory;
    src_md = memory::desc({m, kK}, memory::data_type::f32, memory::format_tag::ab);
    dst_md = memory::desc({m, kN}, memory::data_type::f32, memory::format_tag::ab);
    const memory::desc any({kK, kN}, memory::data_type::f32, memory::format_tag::any);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, any, dst_md), eng);
    impl = pd.impl_info_str();
    memory user({{kK, kN}, memory::data_type::f32, memory::format_tag::ba}, eng,
                const_cast<float*>(w.data()));
    weights = memory(pd.weights_desc(), eng);
    dnnl::reorder(user, weights).execute(stream, user, weights);
    prim = dnnl::matmul(pd);
  }
  void Run(const float* x, float* y) {
    dnnl::memory src(src_md, eng, const_cast<float*>(x)), dst(dst_md, eng, y);
    prim.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}});
    stream.wait();
  }
};

// Rows [0, 64) computed with plain matmuls of m rows vs m = 64: how many rows differ in any bit,
// and the largest difference relative to the row's largest magnitude.
std::string PlainInvariance(const std::vector<float>& w, const std::vector<float>& x) {
  std::vector<float> full(64 * kN);
  PlainMatmul(w, 64).Run(x.data(), full.data());
  std::string out;
  for (int m : {1, 3, 7, 16, 33}) {
    PlainMatmul mm(w, m);
    std::vector<float> y(static_cast<size_t>(m) * kN);
    int differ = 0;
    double max_rel = 0;
    for (int r0 = 0; r0 + m <= 64; r0 += m) {
      mm.Run(&x[static_cast<size_t>(r0) * kK], y.data());
      for (int r = 0; r < m; ++r) {
        const float* ref = &full[static_cast<size_t>(r0 + r) * kN];
        double diff = 0, scale = 0;
        for (int j = 0; j < kN; ++j) {
          diff = std::max(diff, std::fabs(static_cast<double>(y[r * kN + j]) - ref[j]));
          scale = std::max(scale, std::fabs(static_cast<double>(ref[j])));
        }
        differ += std::memcmp(&y[static_cast<size_t>(r) * kN], ref, kN * sizeof(float)) != 0;
        max_rel = std::max(max_rel, diff / scale);
      }
    }
    out += (out.empty() ? "" : ", ") + std::string("\"") + std::to_string(m) + "\": {" +
           "\"rows_differing\": " + std::to_string(differ) + ", \"max_rel_diff\": " +
           [&] {
             char b[32];
             std::snprintf(b, sizeof b, "%.2e", max_rel);
             return std::string(b);
           }() +
           ", \"impl\": \"" + mm.impl + "\"}";
  }
  return "{" + out + "}";
}

std::string Timings(CpuCompute compute, const std::vector<float>& w, const std::vector<float>& x,
                    int reps) {
  CpuLinear lin(w.data(), kN, kK, compute);
  std::string out;
  for (int m : {1, 8, 32, 128}) {
    std::vector<float> y(static_cast<size_t>(m) * kN);
    const double us = MicrosPerCall(reps, [&] { lin.Forward(x.data(), m, y.data()); });
    std::string plain = "null";
    if (compute == CpuCompute::kF32) {
      PlainMatmul mm(w, m);
      const double pus = MicrosPerCall(reps, [&] { mm.Run(x.data(), y.data()); });
      char buf[96];
      std::snprintf(buf, sizeof buf, "{\"us\": %.1f, \"gflops\": %.1f}", pus,
                    2.0 * m * kN * kK / pus * 1e-3);
      plain = buf;
    }
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "%s{\"m\": %d, \"us\": %.1f, \"gflops\": %.1f, \"plain_onednn\": %s}",
                  out.empty() ? "" : ", ", m, us, 2.0 * m * kN * kK / us * 1e-3, plain.c_str());
    out += buf;
  }
  return "{\"impl\": \"" + std::string(lin.impl_name()) +
         "\", \"tile_m\": " + std::to_string(lin.tile_m()) + ", \"runs\": [" + out + "]}";
}

}  // namespace
}  // namespace morserve

int main(int argc, char** argv) {
  using namespace morserve;
  const int reps = argc > 1 ? std::atoi(argv[1]) : 200;
  const auto w = Random(static_cast<size_t>(kN) * kK, 1);
  const auto x = Random(static_cast<size_t>(128) * kK, 2);
  std::printf(
      "{\"shape\": \"Mx%dx%d\", \"threads\": %d, "
      "\"slice_n\": %d,\n",
      kN, kK, DefaultThreadPool()->num_threads(), CpuLinear::kSliceN);
  std::printf(" \"f32\": %s,\n", Timings(CpuCompute::kF32, w, x, reps).c_str());
  if (CpuSupportsBf16()) {
    std::printf(" \"bf16\": %s,\n", Timings(CpuCompute::kBF16, w, x, reps).c_str());
  } else {
    std::printf(" \"bf16\": \"skipped: no native bf16 on this host\",\n");
  }
  std::printf(" \"plain_onednn_f32_vs_m64\": %s}\n", PlainInvariance(w, x).c_str());
  return 0;
}
