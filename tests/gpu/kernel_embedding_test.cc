// embedding_forward against the exact CPU gather (bf16 -> fp32 widening is exact, bf16 ->
// bf16 is a copy), on fresh random tables and ids, with poisoned outputs; both the vector and
// the scalar path; an out-of-range id yields a NaN row. Also built as kernel_embedding_emu_test:
// the same checks on the emulated kernels and CUDA runtime (kernels/emu), without a GPU.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/embedding.cuh"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FloatBits;
using ::morserve::testing::FreshSeed;

class EmbeddingTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

TEST_F(EmbeddingTest, GathersExactly) {
  // fp32, bf16, and fp32 scaled by Huginn-0125's sqrt(H) (not exact in fp32).
  for (auto [out_dtype, scale] : {std::pair{DType::kF32, 1.0}, std::pair{DType::kBF16, 1.0},
                                  std::pair{DType::kF32, std::sqrt(5280.0)}}) {
    for (int dim : {64, 100, 4096}) {  // 100: not a multiple of 8, scalar path
      const uint64_t seed = FreshSeed();
      SCOPED_TRACE("out=" + std::string(out_dtype == DType::kBF16 ? "bf16" : "f32") +
                   " scale=" + std::to_string(scale) + " dim=" + std::to_string(dim) +
                   " seed=" + std::to_string(seed));
      std::mt19937_64 rng(seed);
      const int vocab = 301, rows = 37;
      std::normal_distribution<float> dist(0.0f, 1.0f);
      std::vector<uint16_t> table(static_cast<size_t>(vocab) * dim);
      for (uint16_t& v : table) v = F32ToBf16(dist(rng));
      std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
      std::vector<int32_t> ids(rows);
      for (int32_t& id : ids) id = pick(rng);
      ids[5] = ids[6];  // a repeated id
      ids[7] = vocab - 1;

      DeviceBuffer<uint16_t> dtable(table.size());
      DeviceBuffer<int32_t> dids(rows);
      DeviceBuffer<uint8_t> dout(static_cast<size_t>(rows) * dim * 4);
      ASSERT_TRUE(dtable.ok() && dids.ok() && dout.ok());
      MORSERVE_CUDA_OK(dtable.Upload(table));
      MORSERVE_CUDA_OK(dids.Upload(ids));
      MORSERVE_CUDA_OK(dout.Poison());
      EmbeddingParams p;
      p.table = dtable.get();
      p.ids = dids.get();
      p.out = dout.get();
      p.rows = rows;
      p.dim = dim;
      p.vocab = vocab;
      p.out_dtype = out_dtype;
      p.scale = scale;
      MORSERVE_CUDA_OK(embedding_forward(p, nullptr));
      MORSERVE_CUDA_OK(cudaDeviceSynchronize());

      const size_t n = static_cast<size_t>(rows) * dim;
      std::vector<uint8_t> raw;
      MORSERVE_CUDA_OK(dout.Download(&raw));
      for (size_t i = 0; i < n; ++i) {
        const uint16_t want = table[static_cast<size_t>(ids[i / dim]) * dim + i % dim];
        if (out_dtype == DType::kBF16) {
          uint16_t got;
          std::memcpy(&got, raw.data() + 2 * i, 2);
          ASSERT_EQ(got, want) << "element " << i;
        } else {
          float got;
          std::memcpy(&got, raw.data() + 4 * i, 4);
          // ScaleEmbedding's rounding (engine/model/huginn_state.cc): one fp64 product.
          const float host = static_cast<float>(Bf16ToF32(want) * scale);
          ASSERT_EQ(FloatBits(got), FloatBits(host)) << "element " << i;
        }
      }
    }
  }
}

TEST_F(EmbeddingTest, OutOfRangeIdGivesNanRow) {
  for (int dim : {64, 100}) {
    const int vocab = 4;
    std::vector<uint16_t> table(static_cast<size_t>(vocab) * dim, F32ToBf16(1.0f));
    std::vector<int32_t> ids = {1, 4, -1, 2};
    DeviceBuffer<uint16_t> dtable(table.size()), dout(ids.size() * dim);
    DeviceBuffer<int32_t> dids(ids.size());
    ASSERT_TRUE(dtable.ok() && dids.ok() && dout.ok());
    MORSERVE_CUDA_OK(dtable.Upload(table));
    MORSERVE_CUDA_OK(dids.Upload(ids));
    MORSERVE_CUDA_OK(cudaMemset(dout.get(), 0, ids.size() * dim * 2));
    EmbeddingParams p;
    p.table = dtable.get();
    p.ids = dids.get();
    p.out = dout.get();
    p.rows = static_cast<int>(ids.size());
    p.dim = dim;
    p.vocab = vocab;
    p.out_dtype = DType::kBF16;
    MORSERVE_CUDA_OK(embedding_forward(p, nullptr));
    std::vector<uint16_t> got;
    MORSERVE_CUDA_OK(dout.Download(&got));
    for (int r = 0; r < 4; ++r) {
      for (int i = 0; i < dim; ++i) {
        const float v = Bf16ToF32(got[static_cast<size_t>(r) * dim + i]);
        if (r == 1 || r == 2) {
          ASSERT_TRUE(std::isnan(v)) << "row " << r << " element " << i;
        } else {
          ASSERT_EQ(v, 1.0f) << "row " << r << " element " << i;
        }
      }
    }
  }
}

// Validation happens on the host before any launch, so it runs without a device too.
TEST(EmbeddingParamsTest, RejectsBadParams) {
  EmbeddingParams p;
  p.dim = 8;
  p.vocab = 4;
  EXPECT_EQ(embedding_forward(p, nullptr), cudaSuccess);  // rows 0
  p.out_dtype = DType::kF16;
  EXPECT_EQ(embedding_forward(p, nullptr), cudaErrorInvalidValue);
  p.out_dtype = DType::kBF16;
  p.scale = 2.0;  // a scale needs fp32 output
  EXPECT_EQ(embedding_forward(p, nullptr), cudaErrorInvalidValue);
  p.scale = 1.0;
  p.out_dtype = DType::kF32;
  p.rows = 2;  // null pointers
  EXPECT_EQ(embedding_forward(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace morserve::kernels
