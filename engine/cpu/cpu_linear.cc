// CpuLinear with fixed-shape oneDNN primitives (see cpu_linear.h for the invariants).
//
// Every primitive is created while the calling thread's OpenMP thread count is 1: oneDNN
// sizes its blocking (and any split over K) from the thread count it sees at creation, and we
// want one thread per (tile, slice) with the whole K reduction inside it.
#include "engine/cpu/cpu_linear.h"

#include <cpuid.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "dnnl.hpp"
#include "engine/core/check.h"
#include "engine/model/dtype.h"

namespace morserve {
namespace {

using dnnl::memory;
using Dims = memory::dims;

dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& ThreadStream() {
  thread_local dnnl::stream stream(Engine());
  return stream;
}

// Per-thread user scratchpad, grown on demand.
void* ThreadScratch(size_t bytes) {
  thread_local std::vector<uint8_t> buffer;
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

bool CpuidHasBf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5))) return true;   // AVX512_BF16
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 22))) return true;  // AMX_BF16
  return false;
}

// Column slices of width round_up(ceil(n / ceil(n / kSliceN)), 16): depends on n only.
int SliceWidth(int n) {
  const int count = (n + CpuLinear::kSliceN - 1) / CpuLinear::kSliceN;
  const int width = ((n + count - 1) / count + 15) / 16 * 16;
  return std::min(width, n);
}

void RoundRowsToBf16(const float* x, int64_t elements, uint16_t* out) {
  for (int64_t i = 0; i < elements; ++i) out[i] = F32ToBf16(x[i]);
}

}  // namespace

bool CpuSupportsBf16() {
  static const bool supported = [] {
    const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
    const bool onednn_ok =
        isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
    return onednn_ok && CpuidHasBf16();
  }();
  return supported;
}

struct CpuLinear::Kernel {
  int width = 0;
  memory::desc src_md, wei_md, dst_md;
  dnnl::matmul prim, prim_acc;
  size_t scratch_bytes = 0;
  std::string impl;
};

struct CpuLinear::Slice {
  int n0 = 0;
  const Kernel* kernel = nullptr;
  memory weights;
};

namespace {

memory::data_type ComputeType(CpuCompute c) {
  return c == CpuCompute::kBF16 ? memory::data_type::bf16 : memory::data_type::f32;
}

}  // namespace

CpuLinear::CpuLinear(const float* w, int n, int k, CpuCompute compute, ThreadPool* pool)
    : n_(n), k_(k), compute_(compute), pool_(pool ? pool : DefaultThreadPool()) {
  MORSERVE_CHECK(n > 0 && k > 0, "CpuLinear needs n > 0 and k > 0");
  MORSERVE_CHECK(compute != CpuCompute::kBF16 || CpuSupportsBf16(),
                     "bf16 compute requested on a host without native bf16");
  ScopedOmpThreads single(1);
  const std::span<const int> candidates = compute == CpuCompute::kBF16
                                              ? std::span<const int>(kTileCandidatesBF16)
                                              : std::span<const int>(kTileCandidatesF32);
  for (const int tile : candidates) {
    tile_m_ = tile;
    BuildSlices(w);
    if (tile == 1 || TilePositionInvariant()) break;
    slices_.clear();
    kernels_.clear();
  }
}

void CpuLinear::BuildSlices(const float* w) {
  const memory::data_type dt = ComputeType(compute_);
  const int width = SliceWidth(n_);
  for (int n0 = 0; n0 < n_; n0 += width) {
    const int wd = std::min(width, n_ - n0);
    Kernel* kernel = nullptr;
    for (auto& kr : kernels_) {
      if (kr->width == wd) kernel = kr.get();
    }
    if (kernel == nullptr) {
      auto kr = std::make_unique<Kernel>();
      kr->width = wd;
      kr->src_md = memory::desc(Dims{tile_m_, k_}, dt, Dims{k_, 1});
      kr->dst_md = memory::desc(Dims{tile_m_, wd}, memory::data_type::f32, Dims{n_, 1});
      const memory::desc wei_any(Dims{k_, wd}, dt, memory::format_tag::any);
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(kr->src_md, wei_any, kr->dst_md),
                                            attr, Engine());
      kr->wei_md = pd.weights_desc();
      dnnl::post_ops sum;
      sum.append_sum(1.0f);
      dnnl::primitive_attr acc_attr = attr;
      acc_attr.set_post_ops(sum);
      const dnnl::matmul::primitive_desc acc_pd(
          dnnl::matmul::desc(kr->src_md, kr->wei_md, kr->dst_md), acc_attr, Engine());
      kr->prim = dnnl::matmul(pd);
      kr->prim_acc = dnnl::matmul(acc_pd);
      kr->scratch_bytes = std::max(
          {pd.scratchpad_desc().get_size(), acc_pd.scratchpad_desc().get_size(), size_t{64}});
      kr->impl = pd.impl_info_str();
      kernel = kr.get();
      kernels_.push_back(std::move(kr));
    }
    // W [n, k] row-major seen as W^T [k, wd] with strides {1, k}.
    const memory::desc user_md(Dims{k_, wd}, memory::data_type::f32, Dims{1, k_});
    memory user(user_md, Engine(), const_cast<float*>(w) + static_cast<size_t>(n0) * k_);
    Slice slice;
    slice.n0 = n0;
    slice.kernel = kernel;
    slice.weights = memory(kernel->wei_md, Engine());
    dnnl::reorder(user, slice.weights).execute(ThreadStream(), user, slice.weights);
    slices_.push_back(std::move(slice));
  }
  ThreadStream().wait();
}

// Runs tiles of distinct random rows (and, for the accumulating primitive, distinct initial
// output rows) twice, the second time rotated by `shift` positions, and checks that every row
// gives the same bits at both positions. Distinct rows matter: a kernel that sums the last
// rows of a tile in another order gives the same bits as the first rows surprisingly often
// when K is small (a single probe row repeated over the tile let such a tile through for a
// LoRA factor), so small matrices get many rounds; shift 1 first, so positions p and p + 1
// are always compared and any split of the tile into code paths shows.
bool CpuLinear::TilePositionInvariant() const {
  const size_t row_k = static_cast<size_t>(k_), row_n = static_cast<size_t>(n_);
  const int64_t work = static_cast<int64_t>(tile_m_) * k_ * n_;
  const int rounds = static_cast<int>(std::clamp<int64_t>((int64_t{1} << 22) / work, 1, 64));
  uint32_t state = 12345;
  auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / 8388608.0f - 1.0f;
  };
  const size_t tile_k = tile_m_ * row_k, tile_n = tile_m_ * row_n;
  std::vector<float> x(2 * tile_k), init(tile_n), y(2 * tile_n);
  std::vector<uint16_t> x_bf16(2 * tile_k);
  for (int round = 0; round < rounds; ++round) {
    const int shift = 1 + round % (tile_m_ - 1);
    for (size_t i = 0; i < tile_k; ++i) x[i] = next();
    for (float& f : init) f = next();
    for (int r = 0; r < tile_m_; ++r) {
      std::copy_n(&x[r * row_k], row_k, &x[tile_k + ((r + shift) % tile_m_) * row_k]);
    }
    RoundRowsToBf16(x.data(), static_cast<int64_t>(x.size()), x_bf16.data());
    for (const bool accumulate : {false, true}) {
      for (int copy = 0; copy < 2; ++copy) {
        float* out = &y[copy * tile_n];
        for (int r = 0; r < tile_m_; ++r) {
          std::copy_n(&init[r * row_n], row_n, out + ((r + copy * shift) % tile_m_) * row_n);
        }
        void* src = compute_ == CpuCompute::kBF16 ? static_cast<void*>(&x_bf16[copy * tile_k])
                                                  : static_cast<void*>(&x[copy * tile_k]);
        for (const Slice& s : slices_) Execute(s, src, out, accumulate);
      }
      for (int r = 0; r < tile_m_; ++r) {
        if (std::memcmp(&y[r * row_n], &y[tile_n + ((r + shift) % tile_m_) * row_n],
                        row_n * sizeof(float)) != 0) {
          return false;
        }
      }
    }
  }
  return true;
}

CpuLinear::~CpuLinear() = default;

const char* CpuLinear::impl_name() const { return kernels_.front()->impl.c_str(); }

void CpuLinear::Forward(const float* x, int m, float* y) const { Run(x, m, y, false); }

void CpuLinear::ForwardAccumulate(const float* x, int m, float* y) const { Run(x, m, y, true); }

void CpuLinear::Execute(const Slice& s, void* src, float* dst, bool accumulate) const {
  const Kernel& kr = *s.kernel;
  memory src_mem(kr.src_md, Engine(), src);
  memory dst_mem(kr.dst_md, Engine(), dst + s.n0);
  memory scratch(memory::desc(Dims{static_cast<int64_t>(kr.scratch_bytes)}, memory::data_type::u8,
                              memory::format_tag::a),
                 Engine(), ThreadScratch(kr.scratch_bytes));
  const dnnl::matmul& prim = accumulate ? kr.prim_acc : kr.prim;
  prim.execute(ThreadStream(), {{DNNL_ARG_SRC, src_mem},
                                {DNNL_ARG_WEIGHTS, s.weights},
                                {DNNL_ARG_DST, dst_mem},
                                {DNNL_ARG_SCRATCHPAD, scratch}});
  ThreadStream().wait();
}

void CpuLinear::Run(const float* x, int m, float* y, bool accumulate) const {
  if (m <= 0) return;
  const int tiles = (m + tile_m_ - 1) / tile_m_;
  const int tail = m - (tiles - 1) * tile_m_;  // rows in the last tile, 1..tile_m_
  const bool padded = tail != tile_m_;
  const size_t row_k = static_cast<size_t>(k_);
  const size_t row_n = static_cast<size_t>(n_);

  // The source: bf16 copy of all tiles, or the caller's rows plus a padded copy of the tail.
  std::vector<uint16_t> x_bf16;
  std::vector<float> x_tail;
  if (compute_ == CpuCompute::kBF16) {
    x_bf16.assign(static_cast<size_t>(tiles) * tile_m_ * row_k, 0);
    pool_->ParallelFor(tiles, [&](int64_t b, int64_t e) {
      const int64_t rows = std::min<int64_t>(e * tile_m_, m) - b * tile_m_;
      RoundRowsToBf16(x + b * tile_m_ * row_k, rows * row_k, x_bf16.data() + b * tile_m_ * row_k);
    });
  } else if (padded) {
    x_tail.assign(tile_m_ * row_k, 0.0f);
    std::memcpy(x_tail.data(), x + (tiles - 1) * tile_m_ * row_k, tail * row_k * sizeof(float));
  }
  // The destination of the last tile when padded (all n columns, same row stride as y).
  std::vector<float> y_tail;
  if (padded) {
    y_tail.assign(tile_m_ * row_n, 0.0f);
    if (accumulate) {
      std::memcpy(y_tail.data(), y + (tiles - 1) * tile_m_ * row_n, tail * row_n * sizeof(float));
    }
  }

  const int64_t slices = static_cast<int64_t>(slices_.size());
  pool_->ParallelFor(slices * tiles, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const Slice& s = slices_[task / tiles];  // slice-major: a thread keeps its weights hot
      const int tile = static_cast<int>(task % tiles);
      const bool last = tile == tiles - 1;
      void* src;
      if (compute_ == CpuCompute::kBF16) {
        src = x_bf16.data() + tile * tile_m_ * row_k;
      } else {
        src = (last && padded) ? x_tail.data() : const_cast<float*>(x) + tile * tile_m_ * row_k;
      }
      float* dst = (last && padded) ? y_tail.data() : y + tile * tile_m_ * row_n;
      Execute(s, src, dst, accumulate);
    }
  });
  if (padded) {
    std::memcpy(y + (tiles - 1) * tile_m_ * row_n, y_tail.data(), tail * row_n * sizeof(float));
  }
}

}  // namespace morserve
