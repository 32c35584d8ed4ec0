// The QKV epilogue kernel (kernels/qkv_rope_kernels.cuh, the GPU build's source) on the CPU
// emulator (tests/gpu/cuda_emu.h) against a double RoPE reference: q out, k/v in the paged
// cache at the write slots, the optional k/v outputs, slot -1 and faulty rows. Needs no device.
#include "tests/gpu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernel header uses.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/qkv_rope_kernels.cuh"

namespace morserve::kernels {
namespace {

constexpr uint16_t kPoison = 0xFFFF;

TEST(QkvRopeEmuTest, MatchesReference) {
  for (int hd : {64, 10}) {
    std::random_device rd;
    const uint64_t seed = rd();
    SCOPED_TRACE("head_dim=" + std::to_string(hd) + " seed=" + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int rows = 6, nh = 3, nkv = 1, q_dim = nh * hd, kv_dim = nkv * hd;
    const int width = q_dim + 2 * kv_dim, num_slots = 9;
    const float theta = 10000.0f;
    std::normal_distribution<float> dist(0.0f, 2.0f);
    std::vector<float> in(static_cast<size_t>(rows) * width);
    for (float& v : in) v = dist(rng);
    const std::vector<int32_t> positions = {0, 5, 31000, 7, -2, 12};
    const std::vector<int32_t> slots = {3, -1, 0,
                                        8, 1,  20};  // row 4: bad position, row 5: bad slot
    std::vector<uint16_t> q(static_cast<size_t>(rows) * q_dim, kPoison),
        kc(num_slots * kv_dim, kPoison), vc(num_slots * kv_dim, kPoison),
        ko(static_cast<size_t>(rows) * kv_dim, kPoison),
        vo(static_cast<size_t>(rows) * kv_dim, kPoison);
    QkvRopeParams p;
    p.qkv = in.data();
    p.qkv_dtype = DType::kF32;
    p.positions = positions.data();
    p.write_slot = slots.data();
    p.q_out = q.data();
    p.k_cache = kc.data();
    p.v_cache = vc.data();
    p.num_slots = num_slots;
    p.k_out = ko.data();
    p.v_out = vo.data();
    p.rows = rows;
    p.n_heads = nh;
    p.n_kv_heads = nkv;
    p.head_dim = hd;
    p.theta = theta;
    cuda_emu::Run({static_cast<unsigned>(rows), 1, 1}, kThreads, [&] { QkvRopeKernel<float>(p); });

    auto rotate = [&](const float* x, int heads, int pos, int h, int i) {
      const int half = hd / 2, j = i % half;
      const double inv = std::pow(static_cast<double>(theta), -2.0 * j / hd);
      const double c = std::cos(pos * inv), s = std::sin(pos * inv);
      const double a = x[h * hd + j], b = x[h * hd + j + half];
      (void)heads;
      return i < half ? a * c - b * s : b * c + a * s;
    };
    auto close = [](uint16_t got, double want) {
      return std::abs(Bf16ToF32(got) - want) <= 1e-2 * std::abs(want) + 1e-5;
    };
    for (int r = 0; r < rows; ++r) {
      const float* x = &in[static_cast<size_t>(r) * width];
      const bool bad = r >= 4;
      for (int e = 0; e < q_dim; ++e) {
        const uint16_t got = q[static_cast<size_t>(r) * q_dim + e];
        if (bad) {
          ASSERT_TRUE(std::isnan(Bf16ToF32(got))) << "row " << r;
        } else {
          ASSERT_TRUE(close(got, rotate(x, nh, positions[r], e / hd, e % hd)))
              << "row " << r << " q " << e;
        }
      }
      for (int e = 0; e < kv_dim; ++e) {
        const size_t o = static_cast<size_t>(r) * kv_dim + e;
        if (bad) {
          ASSERT_TRUE(std::isnan(Bf16ToF32(ko[o])) && std::isnan(Bf16ToF32(vo[o]))) << "row " << r;
          continue;
        }
        ASSERT_TRUE(close(ko[o], rotate(x + q_dim, nkv, positions[r], e / hd, e % hd)))
            << "row " << r;
        ASSERT_EQ(vo[o], F32ToBf16(x[q_dim + kv_dim + e])) << "row " << r;
        if (slots[r] >= 0) {
          ASSERT_EQ(kc[static_cast<size_t>(slots[r]) * kv_dim + e], ko[o]) << "row " << r;
          ASSERT_EQ(vc[static_cast<size_t>(slots[r]) * kv_dim + e], vo[o]) << "row " << r;
        }
      }
    }
    for (int sl : {2, 4, 5, 6, 7, 1}) {  // slots nobody (validly) wrote
      for (int e = 0; e < kv_dim; ++e) ASSERT_EQ(kc[sl * kv_dim + e], kPoison) << "slot " << sl;
    }
  }
}

}  // namespace
}  // namespace morserve::kernels
