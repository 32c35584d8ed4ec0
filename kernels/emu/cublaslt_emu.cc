// A CPU stand-in for the cuBLASLt subset kernels/gemm.cu calls, for builds that run the CUDA
// code on the CPU emulator (no GPU): the same 16 cublasLt* entry points that
// engine/cuda/cublaslt_loader.cc forwards, with cublasLt.h's signatures, plus the loader's
// morserve::cuda functions (nothing to load: LoadCublasLt() returns ""). Link it instead of
// morserve_cublaslt. Pointers are host memory (the emulated cudart maps device memory to host).
//
// What is modelled, and nothing more (anything else is CUBLAS_STATUS_NOT_SUPPORTED, never a
// silent guess):
// - compute type CUBLAS_COMPUTE_32F with scale type CUDA_R_32F, alpha/beta in host memory;
// - TRANSA/TRANSB N or T; column-major layouts of CUDA_R_16BF or CUDA_R_32F (A and B alike;
//   C and D alike; fp32 A/B only with fp32 C/D), no batch;
// - preferences: max workspace, minimum alignments of A/B/C/D, reduction-scheme mask;
// - three algorithms (CUBLASLT_ALGO_CONFIG_ID 0, 1, 2), none with split-K (SPLITK_NUM 1,
//   REDUCTION_SCHEME NONE), no workspace, needing the alignments the preference promised
//   (default 256 bytes, as cuBLASLt assumes). They differ as real kernels do: algorithm i
//   slices k across 2^i warps (16-wide k tiles dealt round-robin, each slice summed in k order,
//   the slices added in order at the end), so an element's bits depend on the algorithm. The
//   heuristic ranks them by the problem's n (D's columns, the engine's token count) as
//   cuBLASLt favours sliced kernels for narrow problems: n <= 8: 2, 1, 0; n <= 64: 1, 0, 2;
//   wider: 0, 1, 2. A caller that takes the heuristic's first choice per m therefore gets
//   m-dependent bits, and only a pinned algorithm gives batch-invariant rows. A test may make
//   the heuristic offer no algorithm common to every m for one shape (cublaslt_emu.h), as a
//   real cuBLASLt may: cublasLtMatmulAlgoCheck then accepts every algorithm at every m (as
//   on an H200, where the lists at m = 1 and m = 8192 are disjoint but the kernels run at
//   both) or, when the test says so, only the one offered at that m.
// Validation as cuBLASLt does it: a null or foreign handle is CUBLAS_STATUS_NOT_INITIALIZED;
// null arguments, ld < rows, shapes that do not chain (op(A) m x k, op(B) k x n, C and D
// m x n), an in-place C == D with another layout, pointers less aligned than the algorithm
// needs, a null workspace with a size, are CUBLAS_STATUS_INVALID_VALUE.
//
// Arithmetic: D(i, j) = alpha * sum_k op(A)(i, k) op(B)(k, j) + beta * C(i, j) with operands
// widened to fp32 and each slice's sum one fp32 sequence in k order (multiply, then add: the
// file is built with -ffp-contract=off), so for one algorithm an element's bits depend only on
// its own row and column, never on m, n or the blocking. A null algorithm runs the heuristic's
// first choice, as cuBLASLt does.
// beta == 0 reads no C (as cuBLAS). bf16 output rounds to nearest even (NaN -> 0x7FFF, as
// __float2bfloat16_rn). The GPU's kernels sum in another order, so results agree with a GPU to
// rounding, not bitwise.
//
// Stream order as cuBLASLt's kernels: cublasLtMatmul validates at once (the statuses above)
// and then submits the product to its stream (kernels/emu/stream_emu.h): on a created stream
// it runs at the stream's next synchronisation, after the work queued before it, or is
// recorded in the stream's graph capture; on the legacy stream it runs at once. The problem's
// layouts, transposes, algorithm and alpha/beta are copied at the call, so the descriptors may
// be destroyed or changed before the product runs. A call into an invalidated capture is
// CUBLAS_STATUS_EXECUTION_FAILED.
#include "kernels/emu/cublaslt_emu.h"

#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/cuda/cublaslt_loader.h"
#include "kernels/emu/stream_emu.h"

// The handle type cublasLt.h leaves incomplete.
struct cublasLtContext {
  uint32_t magic;
};

namespace morserve::cublaslt_emu {
namespace {

constexpr uint32_t kHandleMagic = 0x4c74480a, kDescMagic = 0x4c74440a, kLayoutMagic = 0x4c744c0a,
                   kPrefMagic = 0x4c74500a;
constexpr uint64_t kAlgoMagic = 0x6d6f72456d75416cull;  // the one algorithm's tag in algo.data
constexpr uint32_t kDefaultAlignment = 256;             // cuBLASLt's preference default

struct Desc {
  uint32_t magic = kDescMagic;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
};

struct Layout {
  uint32_t magic = kLayoutMagic;
  cudaDataType_t type = CUDA_R_32F;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
};

// Minimum alignments of A, B, C, D in bytes.
struct Alignments {
  uint32_t bytes[4] = {kDefaultAlignment, kDefaultAlignment, kDefaultAlignment, kDefaultAlignment};
};

struct Pref {
  uint32_t magic = kPrefMagic;
  uint64_t max_workspace = 0;
  Alignments align;
  uint32_t scheme_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
};

constexpr int kAlgorithms = 3;      // ids 0..2: k sliced across 1, 2, 4 warps
constexpr int64_t kSliceTile = 16;  // the k width dealt to one slice at a time

// The algorithm's record inside cublasLtMatmulAlgo_t::data (the caller copies it around).
struct AlgoRecord {
  uint64_t magic = kAlgoMagic;
  Alignments align;
  int32_t id = 0;
};

// The heuristic's order of the algorithm ids for a problem with n columns.
const int* HeuristicOrder(int64_t n) {
  static constexpr int kNarrow[kAlgorithms] = {2, 1, 0}, kMid[kAlgorithms] = {1, 0, 2},
                       kWide[kAlgorithms] = {0, 1, 2};
  return n <= 8 ? kNarrow : n <= 64 ? kMid : kWide;
}
static_assert(sizeof(AlgoRecord) <= sizeof(cublasLtMatmulAlgo_t::data));

// SetNoCommonAlgorithmRows: op(A)'s row count whose problems get one algorithm per m (0: none),
// and whether cublasLtMatmulAlgoCheck still accepts the others there.
int64_t& NoCommonAlgorithmRows() {
  static int64_t rows = 0;
  return rows;
}
bool& OthersRunThere() {
  static bool run = true;
  return run;
}

// The object behind an opaque pointer, or nullptr when it is null or not ours.
template <typename T, typename P>
T* Get(P p, uint32_t magic) {
  T* t = reinterpret_cast<T*>(p);
  return t != nullptr && t->magic == magic ? t : nullptr;
}

// Destroys the object behind an opaque pointer (its magic cleared first, so a second destroy
// or a later use is refused); `invalid` when it is null or not ours.
template <typename T, typename P>
cublasStatus_t Destroy(P p, uint32_t magic, cublasStatus_t invalid) {
  T* t = Get<T>(p, magic);
  if (t == nullptr) return invalid;
  t->magic = 0;
  delete t;
  return CUBLAS_STATUS_SUCCESS;
}

bool DecodeAlgo(const cublasLtMatmulAlgo_t* algo, AlgoRecord* rec) {
  std::memcpy(rec, algo->data, sizeof(*rec));
  return rec->magic == kAlgoMagic;
}

// Reads a fixed-size attribute value: sizeInBytes must be exactly sizeof(T).
template <typename T>
bool ReadAttr(const void* buf, size_t size, T* out) {
  if (buf == nullptr || size != sizeof(T)) return false;
  std::memcpy(out, buf, sizeof(T));
  return true;
}

// A product's dimensions once the four layouts are checked against each other (copies of the
// layouts: the product may run after their descriptors are gone).
struct Problem {
  Layout a, b, c, d;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  int64_t m = 0, n = 0, k = 0;
};

// The one algorithm the heuristic offers for a problem under SetNoCommonAlgorithmRows, or -1
// when the control does not apply to it.
int OnlyAlgorithm(const Problem& pr) {
  if (NoCommonAlgorithmRows() == 0 || pr.m != NoCommonAlgorithmRows()) return -1;
  return pr.n <= 8 ? 2 : 0;
}

bool Supported(cudaDataType_t t) { return t == CUDA_R_16BF || t == CUDA_R_32F; }
size_t ElementBytes(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : 4; }

cublasStatus_t MakeProblem(cublasLtMatmulDesc_t desc_p, cublasLtMatrixLayout_t a_p,
                           cublasLtMatrixLayout_t b_p, cublasLtMatrixLayout_t c_p,
                           cublasLtMatrixLayout_t d_p, Problem* pr) {
  const Desc* desc = Get<Desc>(desc_p, kDescMagic);
  const Layout* layouts[4] = {Get<Layout>(a_p, kLayoutMagic), Get<Layout>(b_p, kLayoutMagic),
                              Get<Layout>(c_p, kLayoutMagic), Get<Layout>(d_p, kLayoutMagic)};
  if (desc == nullptr || std::count(layouts, layouts + 4, nullptr) > 0) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  pr->a = *layouts[0];
  pr->b = *layouts[1];
  pr->c = *layouts[2];
  pr->d = *layouts[3];
  if (pr->a.type != pr->b.type || pr->c.type != pr->d.type ||
      (pr->a.type == CUDA_R_32F && pr->d.type != CUDA_R_32F)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  for (const Layout* l : layouts) {
    if (l->ld < 1 || static_cast<uint64_t>(l->ld) < l->rows) return CUBLAS_STATUS_INVALID_VALUE;
  }
  pr->trans_a = desc->trans_a;
  pr->trans_b = desc->trans_b;
  pr->m = static_cast<int64_t>(pr->d.rows);
  pr->n = static_cast<int64_t>(pr->d.cols);
  const bool ta = pr->trans_a == CUBLAS_OP_T, tb = pr->trans_b == CUBLAS_OP_T;
  const uint64_t a_m = ta ? pr->a.cols : pr->a.rows, a_k = ta ? pr->a.rows : pr->a.cols;
  const uint64_t b_k = tb ? pr->b.cols : pr->b.rows, b_n = tb ? pr->b.rows : pr->b.cols;
  pr->k = static_cast<int64_t>(a_k);
  if (pr->c.rows != pr->d.rows || pr->c.cols != pr->d.cols || a_m != pr->d.rows ||
      b_n != pr->d.cols || b_k != a_k) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_SUCCESS;
}

float LoadF32(cudaDataType_t t, const void* base, int64_t index) {
  if (t == CUDA_R_16BF) {
    uint16_t h;
    std::memcpy(&h, static_cast<const uint8_t*>(base) + 2 * index, 2);
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  float f;
  std::memcpy(&f, static_cast<const uint8_t*>(base) + 4 * index, 4);
  return f;
}

// Round to nearest even; NaN becomes the canonical 0x7FFF (__float2bfloat16_rn's host code).
uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

void StoreF32(cudaDataType_t t, void* base, int64_t index, float v) {
  if (t == CUDA_R_16BF) {
    const uint16_t h = ToBf16(v);
    std::memcpy(static_cast<uint8_t*>(base) + 2 * index, &h, 2);
  } else {
    std::memcpy(static_cast<uint8_t*>(base) + 4 * index, &v, 4);
  }
}

// Element (row, col) of op(X) for a column-major X with leading dimension ld.
int64_t OpIndex(cublasOperation_t op, int64_t row, int64_t col, int64_t ld) {
  return op == CUBLAS_OP_T ? col + row * ld : row + col * ld;
}

// Rows of op(A) computed together: a k x kPanel fp32 panel, zero-padded past m so the inner
// loop has a fixed trip count (the compiler vectorises it across rows; each row's own sum
// stays one sequence in k).
constexpr int64_t kPanel = 64;

void Compute(const Problem& pr, int algo_id, float alpha, const void* a, const void* b, float beta,
             const void* c, void* d) {
  const int slices = 1 << algo_id;
  const int64_t m = pr.m, n = pr.n, k = pr.k;
  std::vector<float> bcols(static_cast<size_t>(n * k));  // op(B) column j at j * k
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t p = 0; p < k; ++p) {
      bcols[j * k + p] = LoadF32(pr.b.type, b, OpIndex(pr.trans_b, p, j, pr.b.ld));
    }
  }
  std::vector<float> panel(static_cast<size_t>(k * kPanel));
  for (int64_t i0 = 0; i0 < m; i0 += kPanel) {
    const int64_t rows = std::min(kPanel, m - i0);
    for (int64_t r = 0; r < kPanel; ++r) {  // row by row: contiguous reads for op T
      for (int64_t p = 0; p < k; ++p) {
        panel[p * kPanel + r] =
            r < rows ? LoadF32(pr.a.type, a, OpIndex(pr.trans_a, i0 + r, p, pr.a.ld)) : 0.0f;
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      float acc[1 << (kAlgorithms - 1)][kPanel] = {};
      const float* bj = &bcols[j * k];
      for (int64_t p = 0; p < k; ++p) {
        const float bv = bj[p];
        const float* row = &panel[p * kPanel];
        float* slice = acc[(p / kSliceTile) % slices];
        for (int64_t r = 0; r < kPanel; ++r) slice[r] += row[r] * bv;
      }
      for (int64_t r = 0; r < rows; ++r) {
        float sum = acc[0][r];
        for (int s = 1; s < slices; ++s) sum += acc[s][r];
        float v = alpha * sum;
        if (beta != 0.0f) v += beta * LoadF32(pr.c.type, c, (i0 + r) + j * pr.c.ld);
        StoreF32(pr.d.type, d, (i0 + r) + j * pr.d.ld, v);
      }
    }
  }
}

bool AlignedTo(const void* p, uint32_t bytes) {
  return bytes <= 1 || reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

}  // namespace
}  // namespace morserve::cublaslt_emu

// ---- morserve::cuda (engine/cuda/cublaslt_loader.h): nothing to load ----

namespace morserve::cuda {

const char* CublasLtSoname() { return "cublaslt_emu (CPU emulation, no library)"; }

const std::string& LoadCublasLt() {
  static const std::string kLoaded;
  return kLoaded;
}

bool CublasLtLoaded() { return true; }

}  // namespace morserve::cuda

// ---- the entry points (cublasLt.h's declarations; the compiler checks each signature) ----

namespace emu = morserve::cublaslt_emu;

size_t CUBLASWINAPI cublasLtGetVersion(void) { return CUBLAS_VERSION; }

const char* CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "<unknown>";
}

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* lightHandle) {
  if (lightHandle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *lightHandle = new cublasLtContext{emu::kHandleMagic};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t lightHandle) {
  return emu::Destroy<cublasLtContext>(lightHandle, emu::kHandleMagic,
                                       CUBLAS_STATUS_NOT_INITIALIZED);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                                     cublasComputeType_t computeType,
                                                     cudaDataType_t scaleType) {
  if (matmulDesc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (computeType != CUBLAS_COMPUTE_32F || scaleType != CUDA_R_32F) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  *matmulDesc = reinterpret_cast<cublasLtMatmulDesc_t>(new emu::Desc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  return emu::Destroy<emu::Desc>(matmulDesc, emu::kDescMagic, CUBLAS_STATUS_INVALID_VALUE);
}

// TRANSA / TRANSB (int32_t, N or T) only.
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr,
                                                           const void* buf, size_t sizeInBytes) {
  emu::Desc* desc = emu::Get<emu::Desc>(matmulDesc, emu::kDescMagic);
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (attr != CUBLASLT_MATMUL_DESC_TRANSA && attr != CUBLASLT_MATMUL_DESC_TRANSB) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  int32_t op;
  if (!emu::ReadAttr(buf, sizeInBytes, &op)) return CUBLAS_STATUS_INVALID_VALUE;
  if (op != CUBLAS_OP_N && op != CUBLAS_OP_T) {
    return op == CUBLAS_OP_C ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_INVALID_VALUE;
  }
  (attr == CUBLASLT_MATMUL_DESC_TRANSA ? desc->trans_a : desc->trans_b) =
      static_cast<cublasOperation_t>(op);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout,
                                                       cudaDataType type, uint64_t rows,
                                                       uint64_t cols, int64_t ld) {
  if (matLayout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (!emu::Supported(type)) return CUBLAS_STATUS_NOT_SUPPORTED;
  emu::Layout* l = new emu::Layout;
  l->type = type;
  l->rows = rows;
  l->cols = cols;
  l->ld = ld;  // checked against rows where the layout is used, as cuBLASLt does
  *matLayout = reinterpret_cast<cublasLtMatrixLayout_t>(l);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  return emu::Destroy<emu::Layout>(matLayout, emu::kLayoutMagic, CUBLAS_STATUS_INVALID_VALUE);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(new emu::Pref);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  return emu::Destroy<emu::Pref>(pref, emu::kPrefMagic, CUBLAS_STATUS_INVALID_VALUE);
}

// MAX_WORKSPACE_BYTES (uint64_t), MIN_ALIGNMENT_{A,B,C,D}_BYTES and REDUCTION_SCHEME_MASK
// (uint32_t) only.
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
    size_t sizeInBytes) {
  emu::Pref* p = emu::Get<emu::Pref>(pref, emu::kPrefMagic);
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return emu::ReadAttr(buf, sizeInBytes, &p->max_workspace) ? CUBLAS_STATUS_SUCCESS
                                                                : CUBLAS_STATUS_INVALID_VALUE;
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
      return emu::ReadAttr(buf, sizeInBytes, &p->scheme_mask) ? CUBLAS_STATUS_SUCCESS
                                                              : CUBLAS_STATUS_INVALID_VALUE;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: {
      const int which = attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES;
      return emu::ReadAttr(buf, sizeInBytes, &p->align.bytes[which]) ? CUBLAS_STATUS_SUCCESS
                                                                     : CUBLAS_STATUS_INVALID_VALUE;
    }
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

// The three algorithms for every supported problem, in the order HeuristicOrder gives for its
// n: no split-K (so every reduction-scheme mask lets them through), no workspace, the
// preference's alignments.
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount) {
  if (emu::Get<cublasLtContext>(lightHandle, emu::kHandleMagic) == nullptr) {
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  const emu::Pref* pref = emu::Get<emu::Pref>(preference, emu::kPrefMagic);
  if (pref == nullptr || requestedAlgoCount < 1 || heuristicResultsArray == nullptr ||
      returnAlgoCount == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  *returnAlgoCount = 0;
  emu::Problem pr;
  const cublasStatus_t st = emu::MakeProblem(operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &pr);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const int* order = emu::HeuristicOrder(pr.n);
  int count = std::min(requestedAlgoCount, emu::kAlgorithms);
  const int only = emu::OnlyAlgorithm(pr);
  if (only >= 0) {
    order = &only;
    count = 1;
  }
  for (int i = 0; i < count; ++i) {
    emu::AlgoRecord rec;
    rec.align = pref->align;
    rec.id = order[i];
    cublasLtMatmulHeuristicResult_t& r = heuristicResultsArray[i];
    r = cublasLtMatmulHeuristicResult_t{};
    std::memcpy(r.algo.data, &rec, sizeof(rec));
    r.workspaceSize = 0;
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
  }
  *returnAlgoCount = count;
  return CUBLAS_STATUS_SUCCESS;
}

// ID (int32_t, 0..2), SPLITK_NUM (int32_t, 1) and REDUCTION_SCHEME (uint32_t, NONE). Size 0 with
// sizeWritten asks for the size, as in cuBLASLt.
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoConfigGetAttribute(
    const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, void* buf,
    size_t sizeInBytes, size_t* sizeWritten) {
  emu::AlgoRecord rec;
  if (algo == nullptr || !emu::DecodeAlgo(algo, &rec)) return CUBLAS_STATUS_INVALID_VALUE;
  uint32_t value;
  switch (attr) {
    case CUBLASLT_ALGO_CONFIG_ID:
      value = static_cast<uint32_t>(rec.id);
      break;
    case CUBLASLT_ALGO_CONFIG_SPLITK_NUM:
      value = 1;
      break;
    case CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME:
      value = CUBLASLT_REDUCTION_SCHEME_NONE;
      break;
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (sizeInBytes == 0 && sizeWritten != nullptr) {
    *sizeWritten = sizeof(value);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (buf == nullptr || sizeInBytes != sizeof(value)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(buf, &value, sizeof(value));
  if (sizeWritten != nullptr) *sizeWritten = sizeof(value);
  return CUBLAS_STATUS_SUCCESS;
}

// Accepts any of the three algorithms on a supported problem (none needs a workspace), except
// where SetNoCommonAlgorithmRows says only the offered one runs.
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoCheck(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result) {
  if (emu::Get<cublasLtContext>(lightHandle, emu::kHandleMagic) == nullptr) {
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  emu::AlgoRecord rec;
  if (algo == nullptr || result == nullptr || !emu::DecodeAlgo(algo, &rec) || rec.id < 0 ||
      rec.id >= emu::kAlgorithms) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  emu::Problem pr;
  const cublasStatus_t st = emu::MakeProblem(operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &pr);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const int only = emu::OnlyAlgorithm(pr);
  if (only >= 0 && rec.id != only && !emu::OthersRunThere()) return CUBLAS_STATUS_NOT_SUPPORTED;
  const cublasLtMatmulAlgo_t copy = *algo;  // `algo` may point to result->algo
  *result = cublasLtMatmulHeuristicResult_t{};
  result->algo = copy;
  result->workspaceSize = 0;
  result->state = CUBLAS_STATUS_SUCCESS;
  result->wavesCount = 1.0f;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmul(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
    const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
    const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
    cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
    size_t workspaceSizeInBytes, cudaStream_t stream) {
  if (emu::Get<cublasLtContext>(lightHandle, emu::kHandleMagic) == nullptr) {
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  emu::Problem pr;
  const cublasStatus_t st = emu::MakeProblem(computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &pr);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (alpha == nullptr || beta == nullptr || A == nullptr || B == nullptr || D == nullptr ||
      (workspace == nullptr && workspaceSizeInBytes > 0)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  float a_scale, b_scale;
  std::memcpy(&a_scale, alpha, sizeof(float));
  std::memcpy(&b_scale, beta, sizeof(float));
  if (b_scale != 0.0f && C == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  // In place (C == D) needs one layout for both, as in cuBLASLt.
  if (C == D && (pr.c.ld != pr.d.ld || pr.c.type != pr.d.type)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  emu::AlgoRecord rec;  // no algorithm: cuBLASLt runs its heuristic; any pointer works here
  rec.align = emu::Alignments{{1, 1, 1, 1}};
  rec.id = emu::HeuristicOrder(pr.n)[0];
  if (algo != nullptr &&
      (!emu::DecodeAlgo(algo, &rec) || rec.id < 0 || rec.id >= emu::kAlgorithms)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const void* ptrs[4] = {A, B, C, D};
  for (int i = 0; i < 4; ++i) {
    if (ptrs[i] != nullptr && !emu::AlignedTo(ptrs[i], rec.align.bytes[i])) {
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  const int id = rec.id;
  const cudaError_t e =
      cuda_emu::Submit(stream, [=] { emu::Compute(pr, id, a_scale, A, B, b_scale, C, D); });
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

void morserve::cublaslt_emu::SetNoCommonAlgorithmRows(int64_t rows, bool others_run) {
  emu::NoCommonAlgorithmRows() = rows;
  emu::OthersRunThere() = others_run;
}
