// LtGemm (kernels/gemm.cu's host code, compiled as C++ into this test) on the CPU cuBLASLt
// emulation (kernels/emu/cublaslt_emu.cc, target morserve_cublaslt_emu), with host buffers:
// - the GPU test's problems and check (tests/gpu/gemm_problem.h) for the engine's shapes
//   (o_proj, fused QKV, fused gate/up, down, a vocab-wide lm_head, a tiny k), poisoned outputs;
// - rows bitwise equal alone, inside m = 7 and m = 64, and in the runner's per-loop groups
//   (Gemm on x + begin * k, the LoRA-variant path of CudaModelRunner::Linear);
// - the algorithm cache; validation before the library;
// - the emulation's own contract, called directly: every transpose pair, alpha/beta with C and
//   padded leading dimensions against a double reference; each algorithm's fp32 slice order
//   bit for bit; the heuristic's three no-split-K algorithms and its order by n, which gives a
//   row m-dependent bits unless LtGemm pins the algorithm (and the pin, which does not); and
//   pinning by cublasLtMatmulAlgoCheck when the offers differ with m; and
//   the errors a runner bug would get from
//   cuBLASLt (bad ld, shapes that do not chain, null and misaligned pointers, unsupported types
//   and attributes), as statuses, not crashes;
// - stream order: a matmul on a created stream runs at the stream's synchronisation, after the
//   work queued before it, with the descriptors of the call even if they are gone by then; and
//   in a CUDA graph captured on the stream, on each replay, with the buffers' current contents.
// Needs no device and links no CUDA library (the emulated cudart, kernels/emu).
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "engine/cuda/cublaslt_loader.h"
#include "kernels/emu/cublaslt_emu.h"
#include "kernels/gemm.cuh"
#include "tests/gpu/gemm_problem.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::CheckAlgorithmsAreCachedPerShape;
using ::morserve::testing::ForEachEngineGemmShape;
using ::morserve::testing::GemmProblem;

uint64_t FreshSeed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

// Element bytes of y.
size_t YBytes(DType t) { return t == DType::kBF16 ? 2 : 4; }

class GemmEmuTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_LT_EXPECT_OK(gemm_.Init()); }

  // y = x · w^T for rows [row0, row0 + m) of the problem's x, into poisoned memory (0xFF: NaN
  // in bf16 and fp32); y's bytes in *raw.
  void Compute(const GemmProblem& pr, int row0, int m, DType y_dtype, std::vector<uint8_t>* raw) {
    raw->assign(static_cast<size_t>(m) * pr.n * YBytes(y_dtype), 0xFF);
    const GemmParams p{.x = pr.x.bits.data() + static_cast<size_t>(row0) * pr.k,
                       .w = pr.w.bits.data(),
                       .y = raw->data(),
                       .y_dtype = y_dtype,
                       .m = m,
                       .n = pr.n,
                       .k = pr.k};
    // operator new's alignment (16 on x86-64) and k % 8 == 0 keep these 16-byte aligned.
    ASSERT_EQ(reinterpret_cast<uintptr_t>(p.x) % 16, 0u);
    ASSERT_EQ(reinterpret_cast<uintptr_t>(p.w) % 16, 0u);
    ASSERT_EQ(reinterpret_cast<uintptr_t>(p.y) % 16, 0u);
    MORSERVE_LT_EXPECT_OK(gemm_.Run(p, nullptr));
  }

  void CheckShape(int m, int n, int k) {
    const uint64_t seed = FreshSeed();
    const GemmProblem pr = GemmProblem::Make(seed, m, n, k);
    SCOPED_TRACE(pr.Describe(seed));
    for (DType y_dtype : {DType::kBF16, DType::kF32}) {
      std::vector<uint8_t> raw;
      ASSERT_NO_FATAL_FAILURE(Compute(pr, 0, m, y_dtype, &raw));
      ASSERT_NO_FATAL_FAILURE(pr.Check(y_dtype, raw));
    }
  }

  LtGemm gemm_;
};

TEST_F(GemmEmuTest, MatchesCpuGemm) {
  ASSERT_NO_FATAL_FAILURE(
      ForEachEngineGemmShape([&](int m, int n, int k) { CheckShape(m, n, k); }));
  ASSERT_NO_FATAL_FAILURE(CheckShape(5, 24, 16));  // a tiny model's projections
}

// A row's bits must not depend on how many rows share the GEMM nor where they start (the
// engine's batches change every step; the runner runs per-loop groups of rows on x + begin).
TEST_F(GemmEmuTest, RowsAreBatchInvariantAcrossMAndGroups) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  const int max_m = 64;
  for (auto [n, k] : {std::pair{1600, 960}, std::pair{960, 2560}, std::pair{5120, 960}}) {
    const GemmProblem pr = GemmProblem::Make(seed + n + k, max_m, n, k);
    SCOPED_TRACE(pr.Describe(seed + n + k));
    for (DType y_dtype : {DType::kBF16, DType::kF32}) {
      SCOPED_TRACE(y_dtype == DType::kBF16 ? "y=bf16" : "y=f32");
      const size_t row_bytes = static_cast<size_t>(n) * YBytes(y_dtype);
      std::vector<uint8_t> full, part;
      ASSERT_NO_FATAL_FAILURE(Compute(pr, 0, max_m, y_dtype, &full));
      for (int m : {1, 7}) {
        ASSERT_NO_FATAL_FAILURE(Compute(pr, 0, m, y_dtype, &part));
        ASSERT_EQ(0, std::memcmp(part.data(), full.data(), part.size()))
            << "rows 0.." << m - 1 << " differ between m = " << m << " and m = " << max_m;
      }
      // Loop groups as CudaModelRunner::Linear runs them, and single rows alone.
      for (auto [begin, count] : {std::pair{0, 5}, std::pair{5, 1}, std::pair{6, 31},
                                  std::pair{37, 27}, std::pair{13, 1}, std::pair{63, 1}}) {
        ASSERT_NO_FATAL_FAILURE(Compute(pr, begin, count, y_dtype, &part));
        ASSERT_EQ(0, std::memcmp(part.data(), full.data() + begin * row_bytes, part.size()))
            << "rows " << begin << ".." << begin + count - 1 << " as their own GEMM differ";
      }
    }
  }
}

TEST_F(GemmEmuTest, AlgorithmsAreCachedPerShape) { CheckAlgorithmsAreCachedPerShape(gemm_); }

TEST_F(GemmEmuTest, RunRejectsBadParams) {
  alignas(16) uint16_t buf[64] = {};
  const GemmParams p{.x = buf, .w = buf, .y = buf, .m = 1, .n = 8, .k = 8};
  MORSERVE_LT_EXPECT_OK(gemm_.Run(p, nullptr));
  GemmParams bad = p;
  bad.n = 12;  // not a multiple of 8
  EXPECT_EQ(gemm_.Run(bad, nullptr), CUBLAS_STATUS_INVALID_VALUE);
  bad = p;
  bad.y = buf + 1;  // not 16-byte aligned
  EXPECT_EQ(gemm_.Run(bad, nullptr), CUBLAS_STATUS_INVALID_VALUE);
  bad = p;
  bad.w = nullptr;
  EXPECT_EQ(gemm_.Run(bad, nullptr), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm_.num_cached_shapes(), 1u);
}

// ---- The emulation's contract, through the cublasLt* API directly ----

// The objects of one D = alpha op(A) op(B) + beta C, destroyed with it.
struct LtProblem {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtProblem() {
    for (cublasLtMatrixLayout_t l : {a, b, c, d}) {
      if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
    }
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    if (handle != nullptr) cublasLtDestroy(handle);
  }
};

void SetOps(cublasLtMatmulDesc_t desc, cublasOperation_t ta, cublasOperation_t tb) {
  MORSERVE_LT_EXPECT_OK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  MORSERVE_LT_EXPECT_OK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
}

// A column-major rows x cols matrix of dtype t with leading dimension ld: fp32 values (bf16:
// rounded) for the reference and the bytes the library reads.
struct Matrix {
  int rows = 0, cols = 0, ld = 0;
  cudaDataType_t type = CUDA_R_32F;
  std::vector<float> values;  // [cols * ld], column-major
  std::vector<uint8_t> bytes;

  static Matrix Random(int rows, int cols, int ld, cudaDataType_t t, std::mt19937_64& rng) {
    Matrix mtx;
    mtx.rows = rows;
    mtx.cols = cols;
    mtx.ld = ld;
    mtx.type = t;
    std::normal_distribution<float> dist(0.0f, 1.0f);
    const size_t count = static_cast<size_t>(cols) * ld;
    mtx.values.resize(count);
    mtx.bytes.resize(count * (t == CUDA_R_16BF ? 2 : 4));
    for (size_t i = 0; i < count; ++i) {
      if (t == CUDA_R_16BF) {
        const uint16_t h = F32ToBf16(dist(rng));
        mtx.values[i] = Bf16ToF32(h);
        std::memcpy(mtx.bytes.data() + 2 * i, &h, 2);
      } else {
        mtx.values[i] = dist(rng);
        std::memcpy(mtx.bytes.data() + 4 * i, &mtx.values[i], 4);
      }
    }
    return mtx;
  }
  float At(int r, int c) const { return values[static_cast<size_t>(c) * ld + r]; }
  // Element (r, c) of `bytes`, widened to fp32.
  float Read(int r, int c) const {
    return ::morserve::testing::ReadKernelOutput(type == CUDA_R_16BF ? DType::kBF16 : DType::kF32,
                                                 bytes, static_cast<size_t>(c) * ld + r);
  }
};

TEST(CublasLtEmuTest, EveryTransposeWithScalesAndPaddedLdMatchesDouble) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int m = 13, n = 7, k = 24;
  const float alpha = 0.5f, beta = -2.0f;
  struct Types {
    cudaDataType_t ab, cd;
  };
  for (Types types : {Types{CUDA_R_16BF, CUDA_R_16BF}, Types{CUDA_R_16BF, CUDA_R_32F},
                      Types{CUDA_R_32F, CUDA_R_32F}}) {
    for (cublasOperation_t ta : {CUBLAS_OP_N, CUBLAS_OP_T}) {
      for (cublasOperation_t tb : {CUBLAS_OP_N, CUBLAS_OP_T}) {
        SCOPED_TRACE("ab=" + std::to_string(types.ab) + " cd=" + std::to_string(types.cd) +
                     " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
        const int a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
        const int b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
        const Matrix A = Matrix::Random(a_rows, a_cols, a_rows + 3, types.ab, rng);
        const Matrix B = Matrix::Random(b_rows, b_cols, b_rows + 1, types.ab, rng);
        const Matrix C = Matrix::Random(m, n, m + 2, types.cd, rng);
        Matrix D = C;
        std::fill(D.bytes.begin(), D.bytes.end(), 0xFF);  // padding must stay poisoned
        LtProblem lt;
        MORSERVE_LT_EXPECT_OK(cublasLtCreate(&lt.handle));
        MORSERVE_LT_EXPECT_OK(cublasLtMatmulDescCreate(&lt.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        ASSERT_NO_FATAL_FAILURE(SetOps(lt.desc, ta, tb));
        MORSERVE_LT_EXPECT_OK(cublasLtMatrixLayoutCreate(&lt.a, A.type, A.rows, A.cols, A.ld));
        MORSERVE_LT_EXPECT_OK(cublasLtMatrixLayoutCreate(&lt.b, B.type, B.rows, B.cols, B.ld));
        MORSERVE_LT_EXPECT_OK(cublasLtMatrixLayoutCreate(&lt.c, C.type, C.rows, C.cols, C.ld));
        MORSERVE_LT_EXPECT_OK(cublasLtMatmul(lt.handle, lt.desc, &alpha, A.bytes.data(), lt.a,
                                             B.bytes.data(), lt.b, &beta, C.bytes.data(), lt.c,
                                             D.bytes.data(), lt.c, nullptr, nullptr, 0, nullptr));
        for (int j = 0; j < n; ++j) {
          for (int i = 0; i < D.ld; ++i) {
            const float got = D.Read(i, j);
            if (i >= m) {
              ASSERT_TRUE(std::isnan(got)) << "D padding (" << i << ", " << j << ") written";
              continue;
            }
            double ref = 0, mag = 0;
            for (int p = 0; p < k; ++p) {
              const double av = ta == CUBLAS_OP_N ? A.At(i, p) : A.At(p, i);
              const double bv = tb == CUBLAS_OP_N ? B.At(p, j) : B.At(j, p);
              ref += av * bv;
              mag += std::abs(av * bv);
            }
            const double cv = C.At(i, j);
            ref = alpha * ref + beta * cv;
            mag = std::abs(alpha) * mag + std::abs(beta * cv);
            const double tol = types.cd == CUDA_R_16BF ? 1e-2 : 1e-5;
            ASSERT_LE(std::abs(got - ref), tol * mag)
                << "D(" << i << ", " << j << ") = " << got << ", want " << ref;
          }
        }
      }
    }
  }
}

// The heuristic's algorithms for D = op_T(A) op(B) with the given layouts, in its order, for
// operands aligned to 4 bytes.
std::vector<cublasLtMatmulAlgo_t> HeuristicAlgorithms(const LtProblem& lt) {
  cublasLtMatmulPreference_t pref = nullptr;
  EXPECT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  const uint32_t align = 4;
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)),
              CUBLAS_STATUS_SUCCESS);
  }
  cublasLtMatmulHeuristicResult_t results[8] = {};
  int found = 0;
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt.handle, lt.desc, lt.a, lt.b, lt.c, lt.c, pref, 8,
                                           results, &found),
            CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreferenceDestroy(pref);
  std::vector<cublasLtMatmulAlgo_t> out;
  for (int i = 0; i < found; ++i) out.push_back(results[i].algo);
  return out;
}

// The bit patterns of fp32 values.
std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
  return out;
}

// Runs rows 0..full_m-1 of the problem through `gemm` (fp32 y), then each m of `ms` alone, and
// expects rows 0..m-1 bitwise equal to the full run's.
void ExpectRowsEqualAcrossM(LtGemm& gemm, const GemmProblem& pr, int full_m,
                            std::initializer_list<int> ms) {
  std::vector<float> full(static_cast<size_t>(full_m) * pr.n), part;
  const GemmParams p{.x = pr.x.bits.data(),
                     .w = pr.w.bits.data(),
                     .y = full.data(),
                     .y_dtype = DType::kF32,
                     .m = full_m,
                     .n = pr.n,
                     .k = pr.k};
  MORSERVE_LT_EXPECT_OK(gemm.Run(p, nullptr));
  for (int m : ms) {
    part.assign(static_cast<size_t>(m) * pr.n, -1.0f);
    GemmParams q = p;
    q.y = part.data();
    q.m = m;
    MORSERVE_LT_EXPECT_OK(gemm.Run(q, nullptr));
    ASSERT_EQ(Bits(part), Bits({full.begin(), full.begin() + static_cast<ptrdiff_t>(part.size())}))
        << "rows 0.." << m - 1 << " differ between m = " << m << " and m = " << full_m;
  }
}

int AlgorithmId(const cublasLtMatmulAlgo_t& algo) {
  int32_t id = -1;
  size_t written = 0;
  EXPECT_EQ(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id),
                                                 &written),
            CUBLAS_STATUS_SUCCESS);
  return id;
}

// The documented arithmetic, bit for bit, for each of the three algorithms: algorithm i deals
// 16-wide k tiles round-robin to 2^i slices; each output is, per slice, ((0 + p_a) + p_b) + ...
// in fp32 over its k in order with p = a * b rounded to fp32 (this file is built with
// -ffp-contract=off), the slices added in order, then rounded to nearest even for bf16 output.
// fp32 inputs show the order; bf16 output shows the rounding.
TEST(CublasLtEmuTest, SumIsFp32InTheAlgorithmsSliceOrderThenRoundedToNearestEven) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int m = 70, n = 3, k = 257;  // m over one 64-row panel; k ends in a partial tile
  struct Types {
    cudaDataType_t ab, cd;
  };
  for (Types types : {Types{CUDA_R_32F, CUDA_R_32F}, Types{CUDA_R_16BF, CUDA_R_16BF},
                      Types{CUDA_R_16BF, CUDA_R_32F}}) {
    SCOPED_TRACE("ab=" + std::to_string(types.ab) + " cd=" + std::to_string(types.cd));
    const Matrix A = Matrix::Random(k, m, k, types.ab, rng);  // op T: A^T is m x k
    const Matrix B = Matrix::Random(k, n, k, types.ab, rng);
    Matrix D = Matrix::Random(m, n, m, types.cd, rng);
    LtProblem lt;
    MORSERVE_LT_EXPECT_OK(cublasLtCreate(&lt.handle));
    MORSERVE_LT_EXPECT_OK(cublasLtMatmulDescCreate(&lt.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    ASSERT_NO_FATAL_FAILURE(SetOps(lt.desc, CUBLAS_OP_T, CUBLAS_OP_N));
    MORSERVE_LT_EXPECT_OK(cublasLtMatrixLayoutCreate(&lt.a, types.ab, k, m, k));
    MORSERVE_LT_EXPECT_OK(cublasLtMatrixLayoutCreate(&lt.b, types.ab, k, n, k));
    MORSERVE_LT_EXPECT_OK(cublasLtMatrixLayoutCreate(&lt.c, types.cd, m, n, m));
    const std::vector<cublasLtMatmulAlgo_t> algos = HeuristicAlgorithms(lt);
    ASSERT_EQ(algos.size(), 3u);
    const float alpha = 1.0f, beta = 0.0f;
    // nullptr: the heuristic's first choice (here algorithm 2, n = 3 being narrow).
    for (const cublasLtMatmulAlgo_t* algo :
         {&algos[0], &algos[1], &algos[2], static_cast<const cublasLtMatmulAlgo_t*>(nullptr)}) {
      const int id = algo != nullptr ? AlgorithmId(*algo) : AlgorithmId(algos[0]);
      SCOPED_TRACE("algorithm " + std::to_string(id) + (algo == nullptr ? " (null)" : ""));
      MORSERVE_LT_EXPECT_OK(cublasLtMatmul(lt.handle, lt.desc, &alpha, A.bytes.data(), lt.a,
                                           B.bytes.data(), lt.b, &beta, nullptr, lt.c,
                                           D.bytes.data(), lt.c, algo, nullptr, 0, nullptr));
      const int slices = 1 << id;
      for (int j = 0; j < n; ++j) {
        for (int i = 0; i < m; ++i) {
          float part[4] = {};
          for (int p = 0; p < k; ++p) {
            const float prod = A.At(p, i) * B.At(p, j);
            part[(p / 16) % slices] = part[(p / 16) % slices] + prod;
          }
          float acc = part[0];
          for (int q = 1; q < slices; ++q) acc = acc + part[q];
          const float want = types.cd == CUDA_R_16BF ? Bf16ToF32(F32ToBf16(acc)) : acc;
          const float got = D.Read(i, j);
          uint32_t want_bits, got_bits;
          std::memcpy(&want_bits, &want, 4);
          std::memcpy(&got_bits, &got, 4);
          ASSERT_EQ(got_bits, want_bits) << "D(" << i << ", " << j << ") = " << got << ", want "
                                         << want << " (fp32 sum " << acc << ")";
        }
      }
    }
  }
}

// The trap the pin exists for: taking the heuristic's first choice for each m (as gemm.cu did
// before pinning) gives a row different bits at m = 1, 32 and 256, as cuBLASLt's kernels would;
// LtGemm's pinned algorithm gives it the same bits at every m.
TEST(CublasLtEmuTest, PerMHeuristicChoiceChangesARowsBitsAndThePinDoesNot) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  const int n = 960, k = 960;
  const GemmProblem pr = GemmProblem::Make(seed, 256, n, k);
  std::vector<std::vector<float>> row0;  // row 0 of y at each m, per-m heuristic choice
  std::vector<int> ids;
  for (int m : {1, 32, 256}) {
    LtProblem lt;
    MORSERVE_LT_EXPECT_OK(cublasLtCreate(&lt.handle));
    MORSERVE_LT_EXPECT_OK(cublasLtMatmulDescCreate(&lt.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    ASSERT_NO_FATAL_FAILURE(SetOps(lt.desc, CUBLAS_OP_T, CUBLAS_OP_N));
    MORSERVE_LT_EXPECT_OK(cublasLtMatrixLayoutCreate(&lt.a, CUDA_R_16BF, k, n, k));
    MORSERVE_LT_EXPECT_OK(cublasLtMatrixLayoutCreate(&lt.b, CUDA_R_16BF, k, m, k));
    MORSERVE_LT_EXPECT_OK(cublasLtMatrixLayoutCreate(&lt.c, CUDA_R_32F, n, m, n));
    const std::vector<cublasLtMatmulAlgo_t> algos = HeuristicAlgorithms(lt);
    ASSERT_FALSE(algos.empty());
    ids.push_back(AlgorithmId(algos[0]));
    std::vector<float> y(static_cast<size_t>(m) * n);
    const float alpha = 1.0f, beta = 0.0f;
    MORSERVE_LT_EXPECT_OK(cublasLtMatmul(lt.handle, lt.desc, &alpha, pr.w.bits.data(), lt.a,
                                         pr.x.bits.data(), lt.b, &beta, nullptr, lt.c, y.data(),
                                         lt.c, &algos[0], nullptr, 0, nullptr));
    row0.emplace_back(y.begin(), y.begin() + n);
  }
  EXPECT_EQ(ids, (std::vector<int>{2, 1, 0}));
  EXPECT_NE(Bits(row0[0]), Bits(row0[2]))
      << "the heuristic's choices at m = 1 and m = 256 gave row 0 the same bits";
  EXPECT_NE(Bits(row0[1]), Bits(row0[2]))
      << "the heuristic's choices at m = 32 and m = 256 gave row 0 the same bits";

  LtGemm gemm;
  MORSERVE_LT_EXPECT_OK(gemm.Init());
  MORSERVE_LT_EXPECT_OK(gemm.Pin(n, k, DType::kF32));
  // Ranks over the 14 buckets 1..8192 (4 narrow, 3 mid, 7 wide): id 2 has 0 x 4 + 2 x 3 +
  // 2 x 7 = 20; id 1 has 1 x 4 + 0 x 3 + 1 x 7 = 11; id 0 has 2 x 4 + 1 x 3 + 0 x 7 = 11: a
  // tie that m = 1's order breaks (id 1 before id 0).
  EXPECT_EQ(gemm.pinned_algorithm_id(n, k, DType::kF32), 1);
  ExpectRowsEqualAcrossM(gemm, pr, 256, {1, 2, 8, 9, 32, 64, 65, 200});
  EXPECT_EQ(gemm.num_pinned(), 1u);
}

// A Run over the pinned buckets (m > LtGemm::kPinMaxM) checks the pinned algorithm at the new
// buckets and keeps it.
TEST(CublasLtEmuTest, RunOverThePinnedBucketsKeepsTheAlgorithm) {
  LtGemm gemm;
  MORSERVE_LT_EXPECT_OK(gemm.Init());
  MORSERVE_LT_EXPECT_OK(gemm.Pin(8, 8, DType::kF32));
  const int id = gemm.pinned_algorithm_id(8, 8, DType::kF32);
  ASSERT_GE(id, 0);
  const int m = LtGemm::kPinMaxM + 3;
  std::vector<uint16_t> x(static_cast<size_t>(m) * 8, 0x3f80), w(64, 0x3f80);  // bf16 1.0
  std::vector<float> y(static_cast<size_t>(m) * 8, 0.0f);
  const GemmParams p{
      .x = x.data(), .w = w.data(), .y = y.data(), .y_dtype = DType::kF32, .m = m, .n = 8, .k = 8};
  MORSERVE_LT_EXPECT_OK(gemm.Run(p, nullptr));
  EXPECT_EQ(y.back(), 8.0f);
  EXPECT_EQ(gemm.pinned_algorithm_id(8, 8, DType::kF32), id);
  EXPECT_EQ(gemm.num_pinned(), 1u);
}

// The heuristic's lists share no algorithm across m (an H200 with CUDA 13 offers none at both
// m = 1 and m = 8192 for any projection of SmolLM-360M): Pin pins the best-scored algorithm
// that cublasLtMatmulAlgoCheck accepts at the buckets that do not offer it, and a row's bits
// are the same at every m. Where the check refuses too, Pin and Run fail, naming no algorithm.
TEST(CublasLtEmuTest, OffersThatDifferWithMPinByTheCheck) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  const int n = 960, k = 960;
  struct Reset {
    ~Reset() { cublaslt_emu::SetNoCommonAlgorithmRows(0, true); }
  } reset;
  cublaslt_emu::SetNoCommonAlgorithmRows(n, /*others_run=*/true);
  LtGemm gemm;
  MORSERVE_LT_EXPECT_OK(gemm.Init());
  MORSERVE_LT_EXPECT_OK(gemm.Pin(n, k, DType::kF32));
  // Offered: id 2 alone at the 4 buckets m <= 8, id 0 alone at the 10 wider ones. Scores (an
  // absent bucket counts 64): id 0 has 4 x 64 = 256, id 2 has 10 x 64 = 640.
  EXPECT_EQ(gemm.pinned_algorithm_id(n, k, DType::kF32), 0);
  EXPECT_THAT(gemm.Describe(n, k, DType::kF32),
              ::testing::AllOf(::testing::HasSubstr("1: 1/1"), ::testing::HasSubstr("8192: 1/1"),
                               ::testing::HasSubstr("pinned: id=0")));
  const GemmProblem pr = GemmProblem::Make(seed, 64, n, k);
  ExpectRowsEqualAcrossM(gemm, pr, 64, {1, 7, 8, 9, 33});

  cublaslt_emu::SetNoCommonAlgorithmRows(n, /*others_run=*/false);
  LtGemm refused;
  MORSERVE_LT_EXPECT_OK(refused.Init());
  EXPECT_EQ(refused.Pin(n, k, DType::kF32), CUBLAS_STATUS_NOT_SUPPORTED);
  std::vector<float> y(static_cast<size_t>(n));
  const GemmParams one{.x = pr.x.bits.data(),
                       .w = pr.w.bits.data(),
                       .y = y.data(),
                       .y_dtype = DType::kF32,
                       .m = 1,
                       .n = n,
                       .k = k};
  EXPECT_EQ(refused.Run(one, nullptr), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(refused.pinned_algorithm_id(n, k, DType::kF32), -1);
  EXPECT_THAT(refused.Describe(n, k, DType::kF32), ::testing::HasSubstr("pinned: none"));
}

// gemm.cu's heuristic request: three algorithms in the narrow problem's order (ids 2, 1, 0),
// none with split-K or a workspace, and their config reads.
TEST(CublasLtEmuTest, HeuristicGivesThreeNoSplitKAlgorithms) {
  LtProblem lt;
  MORSERVE_LT_EXPECT_OK(cublasLtCreate(&lt.handle));
  MORSERVE_LT_EXPECT_OK(cublasLtMatmulDescCreate(&lt.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  ASSERT_NO_FATAL_FAILURE(SetOps(lt.desc, CUBLAS_OP_T, CUBLAS_OP_N));
  MORSERVE_LT_EXPECT_OK(cublasLtMatrixLayoutCreate(&lt.a, CUDA_R_16BF, 64, 32, 64));
  MORSERVE_LT_EXPECT_OK(cublasLtMatrixLayoutCreate(&lt.b, CUDA_R_16BF, 64, 5, 64));
  MORSERVE_LT_EXPECT_OK(cublasLtMatrixLayoutCreate(&lt.c, CUDA_R_16BF, 32, 5, 32));
  MORSERVE_LT_EXPECT_OK(cublasLtMatmulPreferenceCreate(&lt.pref));
  const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE, align = 16;
  MORSERVE_LT_EXPECT_OK(cublasLtMatmulPreferenceSetAttribute(
      lt.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof(mask)));
  MORSERVE_LT_EXPECT_OK(cublasLtMatmulPreferenceSetAttribute(
      lt.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align, sizeof(align)));
  cublasLtMatmulHeuristicResult_t results[4] = {};
  int found = -1;
  MORSERVE_LT_EXPECT_OK(cublasLtMatmulAlgoGetHeuristic(lt.handle, lt.desc, lt.a, lt.b, lt.c, lt.c,
                                                       lt.pref, 4, results, &found));
  ASSERT_EQ(found, 3);
  for (int i = 0; i < found; ++i) {
    EXPECT_EQ(results[i].state, CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(results[i].workspaceSize, 0u);
    EXPECT_EQ(AlgorithmId(results[i].algo), 2 - i);
  }
  int32_t splits = 0;
  uint32_t scheme = 99;
  size_t written = 0;
  MORSERVE_LT_EXPECT_OK(cublasLtMatmulAlgoConfigGetAttribute(
      &results[0].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, nullptr, 0, &written));
  EXPECT_EQ(written, sizeof(splits));
  MORSERVE_LT_EXPECT_OK(cublasLtMatmulAlgoConfigGetAttribute(
      &results[0].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof(splits), &written));
  MORSERVE_LT_EXPECT_OK(cublasLtMatmulAlgoConfigGetAttribute(
      &results[0].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme), &written));
  EXPECT_EQ(splits, 1);
  EXPECT_EQ(scheme, static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_NONE));
  EXPECT_EQ(cublasLtMatmulAlgoConfigGetAttribute(&results[0].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                                 &splits, 8, &written),
            CUBLAS_STATUS_INVALID_VALUE);  // wrong size
  const cublasLtMatmulAlgo_t zero{};
  EXPECT_EQ(cublasLtMatmulAlgoConfigGetAttribute(&zero, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                                 sizeof(splits), &written),
            CUBLAS_STATUS_INVALID_VALUE);  // not an algorithm from the heuristic

  // The algorithm needs what the preference promised: B 16-byte aligned, A/C/D 256 (default).
  alignas(256) static uint16_t a[64 * 32], b[64 * 5 + 8], c[32 * 5];
  const float alpha = 1.0f, beta = 0.0f;
  MORSERVE_LT_EXPECT_OK(cublasLtMatmul(lt.handle, lt.desc, &alpha, a, lt.a, b + 8, lt.b, &beta, c,
                                       lt.c, c, lt.c, &results[0].algo, nullptr, 0, nullptr));
  EXPECT_EQ(cublasLtMatmul(lt.handle, lt.desc, &alpha, a, lt.a, b + 4, lt.b, &beta, c, lt.c, c,
                           lt.c, &results[0].algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);  // B 8-byte aligned
  EXPECT_EQ(cublasLtMatmul(lt.handle, lt.desc, &alpha, a + 8, lt.a, b, lt.b, &beta, c, lt.c, c,
                           lt.c, &results[0].algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);  // A 16-byte aligned, the algorithm assumed 256
}

// What a runner bug would hand cuBLASLt gets cuBLASLt's status, not a crash or a silent result.
TEST(CublasLtEmuTest, BadArgumentsGetErrorStatuses) {
  LtProblem lt;
  MORSERVE_LT_EXPECT_OK(cublasLtCreate(&lt.handle));
  MORSERVE_LT_EXPECT_OK(cublasLtMatmulDescCreate(&lt.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  ASSERT_NO_FATAL_FAILURE(SetOps(lt.desc, CUBLAS_OP_T, CUBLAS_OP_N));
  MORSERVE_LT_EXPECT_OK(cublasLtMatmulPreferenceCreate(&lt.pref));
  alignas(256) static uint16_t a[16 * 8], b[16 * 4], d[8 * 4];
  const float alpha = 1.0f, beta = 0.0f;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  // op_T(A) 8 x 16, B 16 x 4, D 8 x 4: `ok` is the good layout of each, `bad` a wrong one.
  auto expect = [&](cublasStatus_t want, uint64_t a_rows, uint64_t a_cols, int64_t lda,
                    uint64_t b_rows, uint64_t b_cols, int64_t ldb, uint64_t d_rows, uint64_t d_cols,
                    int64_t ldd, const char* what) {
    SCOPED_TRACE(what);
    cublasLtMatrixLayout_t la, lb, ld;
    MORSERVE_LT_EXPECT_OK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, a_rows, a_cols, lda));
    MORSERVE_LT_EXPECT_OK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, b_rows, b_cols, ldb));
    MORSERVE_LT_EXPECT_OK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, d_rows, d_cols, ldd));
    EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt.handle, lt.desc, la, lb, ld, ld, lt.pref, 1,
                                             &result, &found),
              want);
    EXPECT_EQ(cublasLtMatmul(lt.handle, lt.desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, nullptr,
                             nullptr, 0, nullptr),
              want);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
  };
  expect(CUBLAS_STATUS_SUCCESS, 16, 8, 16, 16, 4, 16, 8, 4, 8, "good");
  expect(CUBLAS_STATUS_INVALID_VALUE, 16, 8, 15, 16, 4, 16, 8, 4, 8, "lda < rows");
  expect(CUBLAS_STATUS_INVALID_VALUE, 16, 8, 16, 16, 4, 8, 8, 4, 8, "ldb < rows");
  expect(CUBLAS_STATUS_INVALID_VALUE, 16, 8, 16, 16, 4, 16, 8, 4, 7, "ldd < rows");
  expect(CUBLAS_STATUS_INVALID_VALUE, 16, 8, 16, 8, 4, 16, 8, 4, 8, "k of A and B differ");
  expect(CUBLAS_STATUS_INVALID_VALUE, 16, 8, 16, 16, 4, 16, 4, 4, 8, "D rows != op(A) rows");
  expect(CUBLAS_STATUS_INVALID_VALUE, 16, 8, 16, 16, 4, 16, 8, 2, 8, "D cols != B cols");

  cublasLtMatrixLayout_t la, lb, ld, lh;
  MORSERVE_LT_EXPECT_OK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, 16, 8, 16));
  MORSERVE_LT_EXPECT_OK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, 16, 4, 16));
  MORSERVE_LT_EXPECT_OK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, 8, 4, 8));
  MORSERVE_LT_EXPECT_OK(cublasLtMatrixLayoutCreate(&lh, CUDA_R_32F, 16, 4, 16));
  auto matmul = [&](cublasLtHandle_t h, const void* al, const void* pa, const void* pb, void* pd,
                    cublasLtMatrixLayout_t lbb) {
    return cublasLtMatmul(h, lt.desc, al, pa, la, pb, lbb, &beta, pd, ld, pd, ld, nullptr, nullptr,
                          0, nullptr);
  };
  EXPECT_EQ(matmul(nullptr, &alpha, a, b, d, lb), CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(matmul(lt.handle, nullptr, a, b, d, lb), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(matmul(lt.handle, &alpha, nullptr, b, d, lb), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(matmul(lt.handle, &alpha, a, b, nullptr, lb), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(matmul(lt.handle, &alpha, a, b, d, nullptr), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(matmul(lt.handle, &alpha, a, b, d, lh), CUBLAS_STATUS_NOT_SUPPORTED);  // bf16 x f32
  const float one = 1.0f;  // beta 1 with no C
  EXPECT_EQ(cublasLtMatmul(lt.handle, lt.desc, &alpha, a, la, b, lb, &one, nullptr, ld, d, ld,
                           nullptr, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmul(lt.handle, lt.desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, nullptr,
                           nullptr, 64, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);  // a workspace size with no workspace
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt.handle, lt.desc, la, lb, ld, ld, lt.pref, 0, &result,
                                           &found),
            CUBLAS_STATUS_INVALID_VALUE);  // zero algorithms requested
  for (cublasLtMatrixLayout_t l : {la, lb, ld, lh}) cublasLtMatrixLayoutDestroy(l);

  // Unsupported parts say so.
  cublasLtMatrixLayout_t half;
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&half, CUDA_R_16F, 8, 8, 8), CUBLAS_STATUS_NOT_SUPPORTED);
  cublasLtMatmulDesc_t other;
  EXPECT_EQ(cublasLtMatmulDescCreate(&other, CUBLAS_COMPUTE_16F, CUDA_R_16F),
            CUBLAS_STATUS_NOT_SUPPORTED);
  const uint32_t epilogue = CUBLASLT_EPILOGUE_RELU;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                           sizeof(epilogue)),
            CUBLAS_STATUS_NOT_SUPPORTED);
  const cublasOperation_t conj = CUBLAS_OP_C;
  EXPECT_EQ(
      cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_TRANSA, &conj, sizeof(conj)),
      CUBLAS_STATUS_NOT_SUPPORTED);
  const uint64_t wide = 0;
  EXPECT_EQ(
      cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof(wide)),
      CUBLAS_STATUS_INVALID_VALUE);  // the attribute is an int32_t
  const uint32_t waves = 1;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT,
                                                 &waves, sizeof(waves)),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasLtCreate(nullptr), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtDestroy(nullptr), CUBLAS_STATUS_NOT_INITIALIZED);
}

// D = A B (fp32, column-major, N and N) on `stream` with descriptors made for the call and
// destroyed on return, as cuBLASLt allows: the matmul copies what it needs.
cublasStatus_t MatmulOnStream(cublasLtHandle_t handle, int m, int n, int k, const float* a,
                              const float* b, float* d, cudaStream_t stream) {
  LtProblem lt;
  cublasStatus_t st = cublasLtMatmulDescCreate(&lt.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&lt.a, CUDA_R_32F, m, k, m);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&lt.b, CUDA_R_32F, k, n, k);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&lt.d, CUDA_R_32F, m, n, m);
  const float alpha = 1.0f, beta = 0.0f;
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  return cublasLtMatmul(handle, lt.desc, &alpha, a, lt.a, b, lt.b, &beta, nullptr, lt.d, d, lt.d,
                        nullptr, nullptr, 0, stream);
}

// A (m x k) B (k x n), column-major, in double (small integers: exact in fp32 too).
std::vector<float> Product(int m, int n, int k, const std::vector<float>& a,
                           const std::vector<float>& b) {
  std::vector<float> d(static_cast<size_t>(m) * n);
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      double sum = 0;
      for (int p = 0; p < k; ++p) sum += double{a[i + p * m]} * b[p + j * k];
      d[i + j * m] = static_cast<float>(sum);
    }
  }
  return d;
}

// Device buffers of the emulated cudart for the stream tests.
struct DeviceFloats {
  explicit DeviceFloats(size_t n) : count(n) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&ptr), n * sizeof(float)), cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(ptr); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  std::vector<float> Read() const {  // synchronous; waits for no non-blocking stream
    std::vector<float> h(count);
    EXPECT_EQ(cudaMemcpy(h.data(), ptr, count * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return h;
  }
  float* ptr = nullptr;
  size_t count;
};

class CublasLtStreamEmuTest : public ::testing::Test {
 protected:
  static constexpr int kM = 8, kN = 4, kK = 16;
  void SetUp() override {
    MORSERVE_LT_EXPECT_OK(cublasLtCreate(&handle_));
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    for (size_t i = 0; i < a_.size(); ++i) a_[i] = static_cast<float>(static_cast<int>(i % 7) - 3);
    for (size_t i = 0; i < b_.size(); ++i) b_[i] = static_cast<float>(static_cast<int>(i % 5) - 2);
    ASSERT_EQ(cudaMemcpy(b_dev_.ptr, b_.data(), b_.size() * 4, cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  void TearDown() override {
    EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
    cublasLtDestroy(handle_);
  }
  // The matmul on the stream, after A's upload queued on it.
  cublasStatus_t UploadAndMatmul() {
    EXPECT_EQ(
        cudaMemcpyAsync(a_dev_.ptr, a_.data(), a_.size() * 4, cudaMemcpyHostToDevice, stream_),
        cudaSuccess);
    return MatmulOnStream(handle_, kM, kN, kK, a_dev_.ptr, b_dev_.ptr, d_dev_.ptr, stream_);
  }

  cublasLtHandle_t handle_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::vector<float> a_ = std::vector<float>(kM * kK), b_ = std::vector<float>(kK * kN);
  DeviceFloats a_dev_{kM * kK}, b_dev_{kK * kN}, d_dev_{kM * kN};
};

// D is written at the synchronisation, from the A uploaded before the matmul (queued first).
TEST_F(CublasLtStreamEmuTest, MatmulRunsInStreamOrder) {
  MORSERVE_LT_EXPECT_OK(UploadAndMatmul());
  for (float v : d_dev_.Read()) ASSERT_TRUE(std::isnan(v)) << "D written before the sync";
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(d_dev_.Read(), Product(kM, kN, kK, a_, b_));
}

// Captured with its upload, not run; each replay computes from A's current host contents.
TEST_F(CublasLtStreamEmuTest, MatmulCapturedInAGraph) {
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const cublasStatus_t st = UploadAndMatmul();
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  MORSERVE_LT_EXPECT_OK(st);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  for (float v : d_dev_.Read()) ASSERT_TRUE(std::isnan(v)) << "the captured matmul ran";
  for (int replay = 0; replay < 2; ++replay) {
    for (float& v : a_) v += 1.0f;
    ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_EQ(d_dev_.Read(), Product(kM, kN, kK, a_, b_)) << "replay " << replay;
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

TEST(CublasLtEmuTest, VersionStatusStringsAndLoader) {
  EXPECT_EQ(cublasLtGetVersion() / 10000, static_cast<size_t>(CUBLAS_VER_MAJOR));
  EXPECT_STREQ(GemmStatusString(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
  EXPECT_STREQ(GemmStatusString(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_EQ(cuda::LoadCublasLt(), "");
  EXPECT_TRUE(cuda::CublasLtLoaded());
  EXPECT_NE(std::string(cuda::CublasLtSoname()).find("emu"), std::string::npos);
}

}  // namespace
}  // namespace morserve::kernels
