// cuBLASLt GEMM wrapper; the contract is in gemm.cuh. Host code only (compiled by nvcc with
// the rest of the kernels library).
#include "kernels/gemm.cuh"

namespace morserve::kernels {
namespace {

constexpr int kHeuristicResults = 16;

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool ValidShape(int m, int n, int k, DType y_dtype) {
  return m > 0 && n > 0 && k > 0 && k % 8 == 0 && n % 8 == 0 &&
         (y_dtype == DType::kBF16 || y_dtype == DType::kF32);
}

#define MORSERVE_LT_OK(expr)                                        \
  do {                                                              \
    const cublasStatus_t morserve_st_ = (expr);                     \
    if (morserve_st_ != CUBLAS_STATUS_SUCCESS) return morserve_st_; \
  } while (0)

// True when an algorithm sums each output's k range in one sequence (no split-K).
bool NoSplitK(const cublasLtMatmulAlgo_t& algo) {
  int32_t splits = 1;
  uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                           sizeof(splits), &written) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                           sizeof(scheme), &written) != CUBLAS_STATUS_SUCCESS) {
    return false;
  }
  return splits <= 1 && scheme == CUBLASLT_REDUCTION_SCHEME_NONE;
}

// Descriptors for y^T = op_T(w) · x^T (see gemm.cuh).
cublasStatus_t MakeDescriptors(int m, int n, int k, DType y_dtype, cublasLtMatmulDesc_t* desc,
                               cublasLtMatrixLayout_t* a, cublasLtMatrixLayout_t* b,
                               cublasLtMatrixLayout_t* c) {
  MORSERVE_LT_OK(cublasLtMatmulDescCreate(desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  MORSERVE_LT_OK(
      cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
  MORSERVE_LT_OK(
      cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
  MORSERVE_LT_OK(cublasLtMatrixLayoutCreate(a, CUDA_R_16BF, k, n, k));
  MORSERVE_LT_OK(cublasLtMatrixLayoutCreate(b, CUDA_R_16BF, k, m, k));
  const cudaDataType_t y_type = y_dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  MORSERVE_LT_OK(cublasLtMatrixLayoutCreate(c, y_type, n, m, n));
  return CUBLAS_STATUS_SUCCESS;
}

// Asks the heuristic for algorithms (reduction scheme NONE only when `none_only`) and
// returns the first without split-K in *algo.
cublasStatus_t Choose(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                      cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, bool none_only,
                      cublasLtMatmulAlgo_t* algo) {
  cublasLtMatmulPreference_t pref = nullptr;
  MORSERVE_LT_OK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = LtGemm::kWorkspaceBytes;
  const uint32_t align = 16;
  const uint32_t mask = none_only ? CUBLASLT_REDUCTION_SCHEME_NONE : CUBLASLT_REDUCTION_SCHEME_MASK;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align));
  }
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                              &mask, sizeof(mask));
  }
  cublasLtMatmulHeuristicResult_t results[kHeuristicResults] = {};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, c, c, pref, kHeuristicResults, results,
                                        &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) return st;
  for (int i = 0; i < found; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS && NoSplitK(results[i].algo)) {
      *algo = results[i].algo;
      return CUBLAS_STATUS_SUCCESS;
    }
  }
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

}  // namespace

LtGemm::~LtGemm() {
  for (auto& [key, plan] : plans_) Destroy(plan);
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

void LtGemm::Destroy(Plan& plan) {
  if (plan.a != nullptr) cublasLtMatrixLayoutDestroy(plan.a);
  if (plan.b != nullptr) cublasLtMatrixLayoutDestroy(plan.b);
  if (plan.c != nullptr) cublasLtMatrixLayoutDestroy(plan.c);
  if (plan.desc != nullptr) cublasLtMatmulDescDestroy(plan.desc);
  plan = Plan{};
}

cublasStatus_t LtGemm::Init() {
  std::lock_guard<std::mutex> lock(mu_);
  if (handle_ != nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  MORSERVE_LT_OK(cublasLtCreate(&handle_));
  if (cudaMalloc(&workspace_, kWorkspaceBytes) != cudaSuccess) {
    workspace_ = nullptr;
    cublasLtDestroy(handle_);
    handle_ = nullptr;
    return CUBLAS_STATUS_ALLOC_FAILED;
  }
  return CUBLAS_STATUS_SUCCESS;
}

const LtGemm::Plan* LtGemm::FindOrCreate(int m, int n, int k, DType y_dtype,
                                         cublasStatus_t* status) {
  const Key key{m, n, k, y_dtype};
  auto it = plans_.find(key);
  if (it != plans_.end()) {
    *status = CUBLAS_STATUS_SUCCESS;
    return &it->second;
  }
  Plan plan;
  *status = MakeDescriptors(m, n, k, y_dtype, &plan.desc, &plan.a, &plan.b, &plan.c);
  if (*status == CUBLAS_STATUS_SUCCESS) {
    *status = Choose(handle_, plan.desc, plan.a, plan.b, plan.c, /*none_only=*/true, &plan.algo);
    if (*status == CUBLAS_STATUS_NOT_SUPPORTED) {  // the mask filtered everything: filter by hand
      *status = Choose(handle_, plan.desc, plan.a, plan.b, plan.c, /*none_only=*/false, &plan.algo);
    }
  }
  if (*status != CUBLAS_STATUS_SUCCESS) {
    Destroy(plan);
    return nullptr;
  }
  return &plans_.emplace(key, plan).first->second;
}

cublasStatus_t LtGemm::Prepare(int m, int n, int k, DType y_dtype) {
  if (!ValidShape(m, n, k, y_dtype)) return CUBLAS_STATUS_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(mu_);
  if (handle_ == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  cublasStatus_t st;
  FindOrCreate(m, n, k, y_dtype, &st);
  return st;
}

cublasStatus_t LtGemm::Run(const GemmParams& p, cudaStream_t stream) {
  if (!ValidShape(p.m, p.n, p.k, p.y_dtype) || p.x == nullptr || p.w == nullptr || p.y == nullptr ||
      !Aligned16(p.x) || !Aligned16(p.w) || !Aligned16(p.y)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (handle_ == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  cublasStatus_t st;
  const Plan* plan = FindOrCreate(p.m, p.n, p.k, p.y_dtype, &st);
  if (plan == nullptr) return st;
  const float alpha = 1.0f, beta = 0.0f;
#ifdef MORSERVE_CUDA_EMU
  // The emulated cuBLASLt computes when called: first the work queued before it on the
  // stream (kernels/emu/cuda_emu.h), as the GPU would order it.
  cuda_emu::SyncStream(stream);
#endif
  return cublasLtMatmul(handle_, plan->desc, &alpha, p.w, plan->a, p.x, plan->b, &beta, p.y,
                        plan->c, p.y, plan->c, &plan->algo, workspace_, kWorkspaceBytes, stream);
}

size_t LtGemm::num_cached_shapes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.size();
}

const char* GemmStatusString(cublasStatus_t status) { return cublasLtGetStatusString(status); }

}  // namespace morserve::kernels
