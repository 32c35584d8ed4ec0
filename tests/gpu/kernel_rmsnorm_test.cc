// rmsnorm_forward against a CPU reference in double, on fresh random inputs (the seed is in
// every failure message), with poisoned outputs. Tolerances are per element, relative:
// 1e-2 when the output is bf16 (one rounding to 8 bits of mantissa), 1e-5 for fp32 (fp32
// accumulation over dim elements). Batch invariance is checked bitwise: each row of a
// 37-row launch equals the same row launched alone. Also built as kernel_rmsnorm_emu_test: the
// same checks on the emulated kernels and CUDA runtime (kernels/emu), without a GPU.
#include <cmath>
#include <string>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/rmsnorm.cuh"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FloatBits;
using ::morserve::testing::FreshSeed;

// A host tensor stored as its kernel dtype (fp32 values or bf16 bits) with fp32 copies of
// exactly the values the device sees.
struct HostTensor {
  DType dtype;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  std::vector<float> values;  // what the kernel reads, as fp32

  HostTensor(DType t, size_t n, std::mt19937_64& rng, float mean, float stddev) : dtype(t) {
    std::normal_distribution<float> dist(mean, stddev);
    values.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const float v = dist(rng);
      if (t == DType::kBF16) {
        bf16.push_back(F32ToBf16(v));
        values[i] = Bf16ToF32(bf16.back());
      } else {
        f32.push_back(v);
        values[i] = v;
      }
    }
  }
  size_t bytes() const { return values.size() * (dtype == DType::kBF16 ? 2 : 4); }
  const void* data() const {
    return dtype == DType::kBF16 ? static_cast<const void*>(bf16.data()) : f32.data();
  }
};

const char* Name(DType t) { return t == DType::kBF16 ? "bf16" : "f32"; }

struct Case {
  DType x, w, out;
  bool residual;
  int dim;
};

class RmsNormTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }

  // Runs one case: checks values against the reference, the residual update bitwise, and
  // batch invariance of every row.
  void Run(const Case& c, int rows) {
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE(std::string("x=") + Name(c.x) + " w=" + Name(c.w) + " out=" + Name(c.out) +
                 " residual=" + (c.residual ? "yes" : "no") + " dim=" + std::to_string(c.dim) +
                 " rows=" + std::to_string(rows) + " seed=" + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const size_t n = static_cast<size_t>(rows) * c.dim;
    const float eps = 1e-5f;
    HostTensor x(c.x, n, rng, 0.0f, 2.0f);
    HostTensor w(c.w, c.dim, rng, 1.0f, 0.5f);
    HostTensor res(DType::kF32, c.residual ? n : 0, rng, 0.5f, 3.0f);

    // Reference in double; the residual sum is fp32 by definition (the residual stream).
    std::vector<float> h(n);
    std::vector<double> ref(n);
    for (size_t i = 0; i < n; ++i) h[i] = c.residual ? x.values[i] + res.values[i] : x.values[i];
    for (int r = 0; r < rows; ++r) {
      const size_t base = static_cast<size_t>(r) * c.dim;
      double ss = 0;
      for (int i = 0; i < c.dim; ++i) ss += static_cast<double>(h[base + i]) * h[base + i];
      const double inv = 1.0 / std::sqrt(ss / c.dim + eps);
      for (int i = 0; i < c.dim; ++i) ref[base + i] = w.values[i] * (h[base + i] * inv);
    }

    DeviceBuffer<uint8_t> dx(x.bytes()), dw(w.bytes()), dout(n * 4);
    DeviceBuffer<float> dres(c.residual ? n : 0);
    ASSERT_TRUE(dx.ok() && dw.ok() && dout.ok() && dres.ok());
    MORSERVE_CUDA_OK(cudaMemcpy(dx.get(), x.data(), x.bytes(), cudaMemcpyHostToDevice));
    MORSERVE_CUDA_OK(cudaMemcpy(dw.get(), w.data(), w.bytes(), cudaMemcpyHostToDevice));
    MORSERVE_CUDA_OK(dout.Poison());
    if (c.residual) MORSERVE_CUDA_OK(dres.Upload(res.f32));

    RmsNormParams p;
    p.x = dx.get();
    p.weight = dw.get();
    p.residual = c.residual ? dres.get() : nullptr;
    p.out = dout.get();
    p.rows = rows;
    p.dim = c.dim;
    p.eps = eps;
    p.x_dtype = c.x;
    p.weight_dtype = c.w;
    p.out_dtype = c.out;
    MORSERVE_CUDA_OK(rmsnorm_forward(p, nullptr));
    MORSERVE_CUDA_OK(cudaDeviceSynchronize());

    std::vector<float> got;
    ASSERT_NO_FATAL_FAILURE(Download(dout, c.out, n, &got));
    const double tol = c.out == DType::kBF16 ? 1e-2 : 1e-5;
    int bad = 0;
    for (size_t i = 0; i < n && bad < 10; ++i) {
      const double err = std::abs(got[i] - ref[i]) / std::max(std::abs(ref[i]), 1e-30);
      if (!(err < tol)) {
        ADD_FAILURE() << "element " << i << ": got " << got[i] << " want " << ref[i] << " rel err "
                      << err;
        ++bad;
      }
    }
    ASSERT_EQ(bad, 0);
    if (c.residual) {
      std::vector<float> res_out;
      MORSERVE_CUDA_OK(dres.Download(&res_out));
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(FloatBits(res_out[i]), FloatBits(h[i])) << "residual element " << i;
      }
    }

    // Batch invariance: every row alone, from the same inputs, gives the same bits.
    const size_t out_size = c.out == DType::kBF16 ? 2 : 4;
    const std::vector<float> batched = got;
    for (int r = 0; r < rows; ++r) {
      const size_t base = static_cast<size_t>(r) * c.dim;
      DeviceBuffer<uint8_t> one(static_cast<size_t>(c.dim) * 4);
      ASSERT_TRUE(one.ok());
      MORSERVE_CUDA_OK(one.Poison());
      if (c.residual) {  // restore the row's residual input (the batched launch updated it)
        MORSERVE_CUDA_OK(cudaMemcpy(dres.get() + base, res.f32.data() + base, c.dim * 4,
                                    cudaMemcpyHostToDevice));
      }
      RmsNormParams q = p;
      q.x = dx.get() + base * (c.x == DType::kBF16 ? 2 : 4);
      q.residual = c.residual ? dres.get() + base : nullptr;
      q.out = one.get();
      q.rows = 1;
      MORSERVE_CUDA_OK(rmsnorm_forward(q, nullptr));
      MORSERVE_CUDA_OK(cudaDeviceSynchronize());
      std::vector<float> single;
      ASSERT_NO_FATAL_FAILURE(Download(one, c.out, c.dim, &single));
      for (int i = 0; i < c.dim; ++i) {
        ASSERT_EQ(FloatBits(single[i]), FloatBits(batched[base + i]))
            << "row " << r << " element " << i << " differs between batch 1 and " << rows
            << " (out element size " << out_size << ")";
      }
    }
  }

  static void Download(const DeviceBuffer<uint8_t>& buf, DType t, size_t n,
                       std::vector<float>* out) {
    out->resize(n);
    if (t == DType::kBF16) {
      std::vector<uint16_t> bits(n);
      MORSERVE_CUDA_OK(cudaMemcpy(bits.data(), buf.get(), n * 2, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < n; ++i) (*out)[i] = Bf16ToF32(bits[i]);
    } else {
      MORSERVE_CUDA_OK(cudaMemcpy(out->data(), buf.get(), n * 4, cudaMemcpyDeviceToHost));
    }
  }
};

TEST_F(RmsNormTest, MatchesReferenceAndIsBatchInvariant) {
  const DType kTypes[] = {DType::kF32, DType::kBF16};
  for (DType x : kTypes) {
    for (DType w : kTypes) {
      for (DType out : kTypes) {
        for (bool residual : {false, true}) {
          for (int dim : {64, 1000, 4096}) {
            ASSERT_NO_FATAL_FAILURE(Run({x, w, out, residual, dim}, 37));
          }
        }
      }
    }
  }
}

TEST_F(RmsNormTest, LargeDimAndSingleRow) {
  ASSERT_NO_FATAL_FAILURE(Run({DType::kBF16, DType::kBF16, DType::kBF16, true, 8192}, 37));
  ASSERT_NO_FATAL_FAILURE(Run({DType::kF32, DType::kF32, DType::kF32, false, 8192}, 1));
  ASSERT_NO_FATAL_FAILURE(Run({DType::kF32, DType::kF32, DType::kF32, false, 1}, 37));
}

TEST_F(RmsNormTest, InPlaceEqualsOutOfPlace) {
  const int rows = 5, dim = 640;
  std::mt19937_64 rng(FreshSeed());
  HostTensor x(DType::kBF16, static_cast<size_t>(rows) * dim, rng, 0.0f, 1.0f);
  HostTensor w(DType::kBF16, dim, rng, 1.0f, 0.2f);
  DeviceBuffer<uint16_t> dx(x.bf16.size()), dw(dim), dout(x.bf16.size());
  ASSERT_TRUE(dx.ok() && dw.ok() && dout.ok());
  MORSERVE_CUDA_OK(dx.Upload(x.bf16));
  MORSERVE_CUDA_OK(dw.Upload(w.bf16));
  MORSERVE_CUDA_OK(dout.Poison());
  RmsNormParams p;
  p.x = dx.get();
  p.weight = dw.get();
  p.out = dout.get();
  p.rows = rows;
  p.dim = dim;
  p.x_dtype = p.weight_dtype = p.out_dtype = DType::kBF16;
  MORSERVE_CUDA_OK(rmsnorm_forward(p, nullptr));
  p.out = dx.get();
  MORSERVE_CUDA_OK(rmsnorm_forward(p, nullptr));
  std::vector<uint16_t> a, b;
  MORSERVE_CUDA_OK(dout.Download(&a));
  MORSERVE_CUDA_OK(dx.Download(&b));
  EXPECT_EQ(a, b);
}

// Validation happens on the host before any launch, so it runs without a device too.
TEST(RmsNormParamsTest, RejectsBadParamsAndAcceptsZeroRows) {
  RmsNormParams p;
  p.rows = 0;
  p.dim = 64;
  EXPECT_EQ(rmsnorm_forward(p, nullptr), cudaSuccess);
  p.x_dtype = DType::kF16;
  EXPECT_EQ(rmsnorm_forward(p, nullptr), cudaErrorInvalidValue);
  p.x_dtype = DType::kF32;
  p.rows = 3;  // null pointers
  EXPECT_EQ(rmsnorm_forward(p, nullptr), cudaErrorInvalidValue);
  p.dim = 0;
  EXPECT_EQ(rmsnorm_forward(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace morserve::kernels
