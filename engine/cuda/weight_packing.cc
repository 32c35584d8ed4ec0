// Weight packing for the CUDA backend (see weight_packing.h).
#include "engine/cuda/weight_packing.h"

#include "engine/core/check.h"

namespace morserve {

std::vector<uint16_t> ToBf16Bits(const TensorView& t) {
  std::vector<uint16_t> out(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::kBF16) {
    const auto* src = static_cast<const uint16_t*>(t.data);
    out.assign(src, src + out.size());
    return out;
  }
  const std::vector<float> f = t.ToF32Vector();
  for (size_t i = 0; i < f.size(); ++i) out[i] = F32ToBf16(f[i]);
  return out;
}

PackedLinear PackFusedLinear(const LayerWeights& lw, std::initializer_list<Proj> parts, int loops) {
  bool untied = false, has_lora = false;
  for (Proj p : parts) {
    untied |= lw.P(p).untied();
    has_lora |= !lw.P(p).lora.empty();
  }
  PackedLinear out;
  for (int r = 0; r < (untied ? loops : 1); ++r) {
    std::vector<uint16_t> fused;
    int rows = 0;
    for (Proj p : parts) {
      const TensorView& v = lw.P(p).At(r);
      const std::vector<uint16_t> w = ToBf16Bits(v);
      rows += static_cast<int>(v.shape[0]);
      out.in = static_cast<int>(v.shape[1]);
      fused.insert(fused.end(), w.begin(), w.end());
    }
    out.out = rows;
    out.variants.push_back(std::move(fused));
  }
  if (!has_lora) return out;
  // The concatenated rank, the same for every loop (a part's rank does not change per loop).
  int total_rank = 0;
  for (Proj p : parts) {
    if (!lw.P(p).lora.empty()) total_rank += static_cast<int>(lw.P(p).lora[0].a.shape[0]);
  }
  out.lora_rank = total_rank;
  out.lora_loops = loops;
  const size_t in = static_cast<size_t>(out.in), rank = static_cast<size_t>(total_rank),
               rows = static_cast<size_t>(out.out);
  out.lora_a.assign(loops * rank * in, 0);
  out.lora_b.assign(loops * rows * rank, 0);
  for (int r = 0; r < loops; ++r) {
    uint16_t* a = &out.lora_a[r * rank * in];
    uint16_t* b = &out.lora_b[r * rows * rank];
    int row_offset = 0, rank_offset = 0;
    for (Proj p : parts) {
      const LoopTensor& t = lw.P(p);
      const int width = static_cast<int>(t.At(r).shape[0]);
      if (!t.lora.empty()) {
        const LoraDelta& d = t.lora[r];
        const int part_rank = static_cast<int>(d.a.shape[0]);
        MORSERVE_CHECK(d.a.shape[1] == out.in && d.b.shape[0] == width && d.b.shape[1] == part_rank,
                       "LoRA shapes do not match their projection");
        const std::vector<float> da = d.a.ToF32Vector(), db = d.b.ToF32Vector();
        for (int i = 0; i < part_rank; ++i) {
          for (size_t c = 0; c < in; ++c) {
            a[(rank_offset + i) * in + c] = F32ToBf16(da[static_cast<size_t>(i) * in + c]);
          }
        }
        for (int j = 0; j < width; ++j) {
          for (int i = 0; i < part_rank; ++i) {
            b[static_cast<size_t>(row_offset + j) * rank + rank_offset + i] =
                F32ToBf16(d.scale * db[static_cast<size_t>(j) * part_rank + i]);
          }
        }
        rank_offset += part_rank;
      }
      row_offset += width;
    }
  }
  return out;
}

std::vector<float> StackLinearRouters(const std::vector<LoopRouter>& routers, int hidden) {
  std::vector<float> out;
  out.reserve(routers.size() * static_cast<size_t>(hidden));
  for (const LoopRouter& r : routers) {
    MORSERVE_CHECK(r.w2.empty() && r.w1.numel() == hidden, "not a linear router [1, hidden]");
    const std::vector<float> w = r.w1.ToF32Vector();
    out.insert(out.end(), w.begin(), w.end());
  }
  return out;
}

std::vector<double> PackedLinearForwardHost(const PackedLinear& p, int loop,
                                            const std::vector<float>& x, int rows) {
  const size_t in = static_cast<size_t>(p.in), out = static_cast<size_t>(p.out);
  std::vector<double> y(static_cast<size_t>(rows) * out, 0.0);
  const std::vector<uint16_t>& w = p.At(loop);
  for (int r = 0; r < rows; ++r) {
    const float* xr = &x[r * in];
    for (size_t j = 0; j < out; ++j) {
      double s = 0;
      for (size_t c = 0; c < in; ++c) s += static_cast<double>(xr[c]) * Bf16ToF32(w[j * in + c]);
      y[r * out + j] = s;
    }
    if (p.lora_rank == 0) continue;
    const size_t rank = static_cast<size_t>(p.lora_rank);
    const uint16_t* a = &p.lora_a[loop * rank * in];
    const uint16_t* b = &p.lora_b[loop * out * rank];
    std::vector<double> t(rank, 0.0);
    for (size_t i = 0; i < rank; ++i) {
      for (size_t c = 0; c < in; ++c) t[i] += static_cast<double>(xr[c]) * Bf16ToF32(a[i * in + c]);
    }
    for (size_t j = 0; j < out; ++j) {
      for (size_t i = 0; i < rank; ++i) y[r * out + j] += t[i] * Bf16ToF32(b[j * rank + i]);
    }
  }
  return y;
}

}  // namespace morserve
