// cuBLASLt GEMM wrapper; the contract is in gemm.cuh. Host code only (compiled by nvcc with
// the rest of the kernels library).
#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "kernels/gemm.cuh"

namespace morserve::kernels {
namespace {

// Wide lists of candidates for Pin (cuBLASLt on an H200 returns 8 per m for the engine's shapes).
constexpr int kHeuristicResults = 64;

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

// One m's descriptors (MakeDescriptors) for a question to cuBLASLt, destroyed with the object.
struct Descriptors {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasStatus_t status;  // MakeDescriptors's: the others are usable when it is SUCCESS
  Descriptors(int m, int n, int k, DType y_dtype)
      : status(MakeDescriptors(m, n, k, y_dtype, &desc, &a, &b, &c)) {}
  ~Descriptors() {
    for (cublasLtMatrixLayout_t l : {a, b, c}) {
      if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
    }
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
};

// One heuristic result's algorithm. (A named wrapper: nvcc's front end fails on containers of
// the anonymous-struct typedef cublasLtMatmulAlgo_t.)
struct Algo {
  cublasLtMatmulAlgo_t algo;
};

// Appends to *out the algorithms the heuristic offers without split-K, best first (reduction
// scheme NONE only when `none_only`).
cublasStatus_t Offered(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                       cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, bool none_only,
                       std::vector<Algo>* out, int* found_out = nullptr) {
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
  if (found_out != nullptr) *found_out = found;
  for (int i = 0; i < found; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS && NoSplitK(results[i].algo)) {
      out->push_back(Algo{results[i].algo});
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

// The no-split-K algorithms offered for one m, best first: descriptors made for the question
// and destroyed after it.
cublasStatus_t OfferedAt(cublasLtHandle_t handle, int m, int n, int k, DType y_dtype,
                         std::vector<Algo>* out) {
  const Descriptors d(m, n, k, y_dtype);
  cublasStatus_t st = d.status;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = Offered(handle, d.desc, d.a, d.b, d.c, /*none_only=*/true, out);
  if (st == CUBLAS_STATUS_SUCCESS && out->empty()) {  // the mask filtered everything: by hand
    st = Offered(handle, d.desc, d.a, d.b, d.c, /*none_only=*/false, out);
  }
  return st;
}

// True when cuBLASLt can run `algo` on the problem of one m (cublasLtMatmulAlgoCheck) within
// the workspace: the heuristic need not offer an algorithm at an m for it to run there.
bool RunsAt(cublasLtHandle_t handle, const cublasLtMatmulAlgo_t& algo, int m, int n, int k,
            DType y_dtype) {
  const Descriptors d(m, n, k, y_dtype);
  cublasLtMatmulHeuristicResult_t result{};
  return d.status == CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulAlgoCheck(handle, d.desc, d.a, d.b, d.c, d.c, &algo, &result) ==
             CUBLAS_STATUS_SUCCESS &&
         result.workspaceSize <= LtGemm::kWorkspaceBytes;
}

// True when two algorithms are one kernel configuration: every configuration attribute reads
// the same (an attribute neither can report counts as equal).
constexpr cublasLtMatmulAlgoConfigAttributes_t kConfigAttributes[] = {
    CUBLASLT_ALGO_CONFIG_ID,
    CUBLASLT_ALGO_CONFIG_TILE_ID,
    CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
    CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
    CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING,
    CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION,
    CUBLASLT_ALGO_CONFIG_STAGES_ID,
    CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID,
    CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID};

bool SameAlgorithm(const cublasLtMatmulAlgo_t& x, const cublasLtMatmulAlgo_t& y) {
  for (const cublasLtMatmulAlgoConfigAttributes_t attr : kConfigAttributes) {
    uint64_t vx = 0, vy = 0;
    size_t size = 0;
    const cublasStatus_t sx = cublasLtMatmulAlgoConfigGetAttribute(&x, attr, nullptr, 0, &size);
    if (sx != CUBLAS_STATUS_SUCCESS || size == 0 || size > sizeof(vx)) {
      size_t other = 0;
      if (cublasLtMatmulAlgoConfigGetAttribute(&y, attr, nullptr, 0, &other) ==
              CUBLAS_STATUS_SUCCESS &&
          other != size) {
        return false;
      }
      continue;
    }
    if (cublasLtMatmulAlgoConfigGetAttribute(&x, attr, &vx, size, nullptr) !=
            CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulAlgoConfigGetAttribute(&y, attr, &vy, size, nullptr) !=
            CUBLAS_STATUS_SUCCESS ||
        vx != vy) {
      return false;
    }
  }
  return true;
}

// Position of `algo` in `list`, or -1.
int RankIn(const std::vector<Algo>& list, const cublasLtMatmulAlgo_t& algo) {
  for (size_t i = 0; i < list.size(); ++i) {
    if (SameAlgorithm(list[i].algo, algo)) return static_cast<int>(i);
  }
  return -1;
}

// M buckets after `from` up to `to`: the powers of two, and `to` itself.
std::vector<int> Buckets(int from, int to) {
  std::vector<int> out;
  for (int64_t m = 1; m <= to; m *= 2) {
    if (m > from) out.push_back(static_cast<int>(m));
  }
  if (to > from && (out.empty() || out.back() != to)) out.push_back(to);
  return out;
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

const LtGemm::Pinned* LtGemm::PinLocked(int m, int n, int k, DType y_dtype,
                                        cublasStatus_t* status) {
  *status = CUBLAS_STATUS_SUCCESS;
  auto it = pinned_.find(PinKey{n, k, y_dtype});
  if (it != pinned_.end() && it->second.checked_m >= m) return &it->second;
  if (it != pinned_.end()) {  // m is over the buckets checked: the pinned algorithm or nothing
    for (int bucket : Buckets(it->second.checked_m, m)) {
      if (!RunsAt(handle_, it->second.algo, bucket, n, k, y_dtype)) {
        *status = CUBLAS_STATUS_NOT_SUPPORTED;
        return nullptr;
      }
      it->second.checked_m = bucket;
    }
    return &it->second;
  }
  const std::vector<int> buckets = Buckets(0, std::max(kPinMaxM, m));
  std::vector<std::vector<Algo>> offered(buckets.size());
  for (size_t i = 0; i < buckets.size(); ++i) {
    *status = OfferedAt(handle_, buckets[i], n, k, y_dtype, &offered[i]);
    if (*status != CUBLAS_STATUS_SUCCESS) return nullptr;
  }
  // Every algorithm offered at some bucket, scored by its ranks summed over the buckets (one
  // not offered at a bucket counts kHeuristicResults there); ties keep the first seen.
  std::vector<Algo> candidates;
  std::vector<int64_t> scores;
  for (const auto& list : offered) {
    for (const Algo& algo : list) {
      if (RankIn(candidates, algo.algo) >= 0) continue;
      int64_t score = 0;
      for (const auto& other : offered) {
        const int rank = RankIn(other, algo.algo);
        score += rank < 0 ? kHeuristicResults : rank;
      }
      candidates.push_back(algo);
      scores.push_back(score);
    }
  }
  std::vector<size_t> order(candidates.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return scores[x] < scores[y]; });
  // The best-scored one that runs at every bucket: where the heuristic did not offer it,
  // cublasLtMatmulAlgoCheck must accept it.
  for (size_t c : order) {
    bool everywhere = true;
    for (size_t i = 0; i < buckets.size() && everywhere; ++i) {
      everywhere = RankIn(offered[i], candidates[c].algo) >= 0 ||
                   RunsAt(handle_, candidates[c].algo, buckets[i], n, k, y_dtype);
    }
    if (!everywhere) continue;
    Pinned pin;
    pin.algo = candidates[c].algo;
    pin.checked_m = buckets.back();
    return &pinned_.emplace(PinKey{n, k, y_dtype}, pin).first->second;
  }
  *status = CUBLAS_STATUS_NOT_SUPPORTED;
  return nullptr;
}

const LtGemm::Plan* LtGemm::FindOrCreate(int m, int n, int k, DType y_dtype,
                                         cublasStatus_t* status) {
  const Pinned* pin = PinLocked(m, n, k, y_dtype, status);
  if (pin == nullptr) return nullptr;
  const Key key{m, n, k, y_dtype};
  auto it = plans_.find(key);
  if (it != plans_.end()) return &it->second;
  Plan plan;
  *status = MakeDescriptors(m, n, k, y_dtype, &plan.desc, &plan.a, &plan.b, &plan.c);
  if (*status != CUBLAS_STATUS_SUCCESS) {
    Destroy(plan);
    return nullptr;
  }
  plan.algo = pin->algo;
  return &plans_.emplace(key, plan).first->second;
}

cublasStatus_t LtGemm::Pin(int n, int k, DType y_dtype) {
  if (!ValidShape(1, n, k, y_dtype)) return CUBLAS_STATUS_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(mu_);
  if (handle_ == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  cublasStatus_t st;
  PinLocked(1, n, k, y_dtype, &st);
  return st;
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
  return cublasLtMatmul(handle_, plan->desc, &alpha, p.w, plan->a, p.x, plan->b, &beta, p.y,
                        plan->c, p.y, plan->c, &plan->algo, workspace_, kWorkspaceBytes, stream);
}

size_t LtGemm::num_cached_shapes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.size();
}

size_t LtGemm::num_pinned() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pinned_.size();
}

int LtGemm::pinned_algorithm_id(int n, int k, DType y_dtype) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pinned_.find(PinKey{n, k, y_dtype});
  if (it == pinned_.end()) return -1;
  int32_t id = -1;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&it->second.algo, CUBLASLT_ALGO_CONFIG_ID, &id,
                                           sizeof(id), &written) != CUBLAS_STATUS_SUCCESS) {
    return -1;
  }
  return id;
}

std::string LtGemm::Describe(int n, int k, DType y_dtype) {
  std::lock_guard<std::mutex> lock(mu_);
  if (handle_ == nullptr || !ValidShape(1, n, k, y_dtype)) return "not initialised or bad shape";
  std::string out =
      std::to_string(n) + " x " + std::to_string(k) + " offers (m: all / no split-K):";
  for (int m : Buckets(0, kPinMaxM)) {
    const Descriptors d(m, n, k, y_dtype);
    std::vector<Algo> offered;
    int found = 0;
    cublasStatus_t st = d.status;
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = Offered(handle_, d.desc, d.a, d.b, d.c, /*none_only=*/false, &offered, &found);
    }
    out +=
        " " + std::to_string(m) + ": " +
        (st == CUBLAS_STATUS_SUCCESS ? std::to_string(found) + "/" + std::to_string(offered.size())
                                     : std::string(cublasLtGetStatusString(st)));
  }
  cublasStatus_t st;
  const Pinned* pin = PinLocked(1, n, k, y_dtype, &st);
  if (pin == nullptr) return out + "; pinned: none (" + cublasLtGetStatusString(st) + ")";
  out += "; pinned:";
  static constexpr const char* kNames[] = {"id",     "tile",   "splitk", "scheme", "swizzle",
                                           "custom", "stages", "inner",  "cluster"};
  static_assert(std::size(kNames) == std::size(kConfigAttributes));
  for (size_t i = 0; i < std::size(kConfigAttributes); ++i) {
    uint64_t v = 0;
    size_t size = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&pin->algo, kConfigAttributes[i], nullptr, 0, &size) !=
            CUBLAS_STATUS_SUCCESS ||
        size == 0 || size > sizeof(v) ||
        cublasLtMatmulAlgoConfigGetAttribute(&pin->algo, kConfigAttributes[i], &v, size, nullptr) !=
            CUBLAS_STATUS_SUCCESS) {
      continue;
    }
    out += std::string(" ") + kNames[i] + "=" + std::to_string(v);
  }
  return out;
}

const char* GemmStatusString(cublasStatus_t status) { return cublasLtGetStatusString(status); }

}  // namespace morserve::kernels
