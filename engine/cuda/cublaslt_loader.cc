// cuBLASLt through dlopen (see cublaslt_loader.h).
//
// Why not link libcublasLt: civetweb (Debian's libcivetweb1 1.15, under prometheus-cpp's
// Exposer) creates its master and worker threads with a fixed stack of 102400 bytes
// (USE_STACK_SIZE: `mov $0x19000,%esi; call pthread_attr_setstacksize` in libcivetweb.so.1).
// glibc carves a thread's static TLS block out of its stack and rejects a stack smaller than
// static TLS + 16 KiB (MINIMAL_REST_STACK) with EINVAL. The static TLS block holds the TLS of
// every library loaded at startup, and libcublasLt.so.13 has a 94,240-byte TLS segment
// (readelf -l: TLS MemSiz 0x17020), so with it linked the smallest stack pthread_create accepts
// is 110,592 bytes; mg_start's pthread_create fails ("Cannot create threads: error 22" in
// /usr/bin/civetweb under LD_PRELOAD=libcublasLt.so.13), mg_start returns NULL and
// CivetServer throws "null context when constructing CivetServer". No symbol interposition is
// involved. A library loaded later with dlopen gets its TLS allocated dynamically (cuBLASLt
// uses only the general-dynamic model: R_X86_64_DTPMOD64 relocations, no DF_STATIC_TLS), and
// glibc fixes the static TLS size at startup, so loading it here, when the CUDA runner first
// creates a handle (`--device cuda` only), leaves civetweb's threads (and /metrics) working
// before and after the load. tests/server/metrics_cublaslt_test checks both halves.
#include "engine/cuda/cublaslt_loader.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <atomic>
#include <mutex>

#define MORSERVE_STR2(x) #x
#define MORSERVE_STR(x) MORSERVE_STR2(x)

namespace morserve::cuda {
namespace {

// Every entry point kernels/gemm.cu (and the loader's check) uses; a new cublasLt call there
// needs a line here and a forwarder below (else the link fails with an undefined reference).
enum Sym {
  kGetVersion,
  kCreate,
  kDestroy,
  kGetStatusString,
  kMatmul,
  kMatmulDescCreate,
  kMatmulDescDestroy,
  kMatmulDescSetAttribute,
  kMatrixLayoutCreate,
  kMatrixLayoutDestroy,
  kMatmulPreferenceCreate,
  kMatmulPreferenceSetAttribute,
  kMatmulPreferenceDestroy,
  kMatmulAlgoGetHeuristic,
  kMatmulAlgoConfigGetAttribute,
  kMatmulAlgoCheck,
  kNumSyms
};
constexpr const char* kSymNames[kNumSyms] = {"cublasLtGetVersion",
                                             "cublasLtCreate",
                                             "cublasLtDestroy",
                                             "cublasLtGetStatusString",
                                             "cublasLtMatmul",
                                             "cublasLtMatmulDescCreate",
                                             "cublasLtMatmulDescDestroy",
                                             "cublasLtMatmulDescSetAttribute",
                                             "cublasLtMatrixLayoutCreate",
                                             "cublasLtMatrixLayoutDestroy",
                                             "cublasLtMatmulPreferenceCreate",
                                             "cublasLtMatmulPreferenceSetAttribute",
                                             "cublasLtMatmulPreferenceDestroy",
                                             "cublasLtMatmulAlgoGetHeuristic",
                                             "cublasLtMatmulAlgoConfigGetAttribute",
                                             "cublasLtMatmulAlgoCheck"};

constexpr const char* kSoname = "libcublasLt.so." MORSERVE_STR(CUBLAS_VER_MAJOR);

struct Library {
  void* fn[kNumSyms] = {};
  std::string error;  // "" once loaded
};

std::atomic<bool> g_loaded{false};

// dlopen by soname (LD_LIBRARY_PATH, the executable's RUNPATH, ld.so.cache), then in the
// toolkit directory the build used.
void* Open(std::string* tried) {
  void* handle = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
  if (handle != nullptr) return handle;
  *tried = std::string(dlerror());
#ifdef MORSERVE_CUDA_LIBRARY_DIR
  const std::string path = std::string(MORSERVE_CUDA_LIBRARY_DIR) + "/" + kSoname;
  handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle != nullptr) return handle;
  *tried += "; " + std::string(dlerror());
#endif
  return nullptr;
}

Library Load() {
  Library lib;
  std::string tried;
  void* handle = Open(&tried);
  if (handle == nullptr) {
    lib.error = std::string("cannot load ") + kSoname + " (install the CUDA " +
                MORSERVE_STR(CUBLAS_VER_MAJOR) + " cuBLAS libraries or add their folder to " +
                "LD_LIBRARY_PATH): " + tried;
    return lib;
  }
  for (int s = 0; s < kNumSyms; ++s) {
    lib.fn[s] = dlsym(handle, kSymNames[s]);
    if (lib.fn[s] == nullptr) {
      lib.error = std::string(kSoname) + " has no " + kSymNames[s];
      return lib;
    }
  }
  const size_t version = reinterpret_cast<size_t (*)()>(lib.fn[kGetVersion])();
  if (version / 10000 != CUBLAS_VER_MAJOR) {
    lib.error = std::string("loaded cuBLASLt version ") + std::to_string(version) +
                ", built against major version " + MORSERVE_STR(CUBLAS_VER_MAJOR);
    return lib;  // the handle stays open: unloading a half-used CUDA library is not worth it
  }
  g_loaded.store(true, std::memory_order_release);
  return lib;
}

const Library& Lib() {
  static const Library lib = Load();  // thread-safe, once
  return lib;
}

// Calls entry point `s` as type `Fn` (the header's declaration), or returns `fallback` when
// the library did not load.
template <typename Fn, typename R, typename... A>
R Call(Sym s, R fallback, A... args) {
  const Library& lib = Lib();
  if (!lib.error.empty()) return fallback;
  return reinterpret_cast<Fn>(lib.fn[s])(args...);
}

constexpr cublasStatus_t kNotLoaded = CUBLAS_STATUS_NOT_INITIALIZED;

}  // namespace

const char* CublasLtSoname() { return kSoname; }

const std::string& LoadCublasLt() { return Lib().error; }

bool CublasLtLoaded() { return g_loaded.load(std::memory_order_acquire); }

}  // namespace morserve::cuda

// The forwarders: same names and signatures as cublasLt.h declares them (the compiler checks
// each definition against the header's declaration).
using morserve::cuda::Call;
using morserve::cuda::kNotLoaded;
namespace mc = morserve::cuda;

size_t CUBLASWINAPI cublasLtGetVersion(void) {
  return Call<decltype(&cublasLtGetVersion)>(mc::kGetVersion, size_t{0});
}

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* lightHandle) {
  return Call<decltype(&cublasLtCreate)>(mc::kCreate, kNotLoaded, lightHandle);
}

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t lightHandle) {
  return Call<decltype(&cublasLtDestroy)>(mc::kDestroy, kNotLoaded, lightHandle);
}

// Without the library, the load error is the only useful text for any status.
const char* CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status) {
  const std::string& error = mc::LoadCublasLt();
  if (!error.empty()) return error.c_str();
  return Call<decltype(&cublasLtGetStatusString)>(mc::kGetStatusString, "", status);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmul(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
    const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
    const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
    cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
    size_t workspaceSizeInBytes, cudaStream_t stream) {
  return Call<decltype(&cublasLtMatmul)>(mc::kMatmul, kNotLoaded, lightHandle, computeDesc, alpha,
                                         A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo,
                                         workspace, workspaceSizeInBytes, stream);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                                     cublasComputeType_t computeType,
                                                     cudaDataType_t scaleType) {
  return Call<decltype(&cublasLtMatmulDescCreate)>(mc::kMatmulDescCreate, kNotLoaded, matmulDesc,
                                                   computeType, scaleType);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  return Call<decltype(&cublasLtMatmulDescDestroy)>(mc::kMatmulDescDestroy, kNotLoaded, matmulDesc);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr,
                                                           const void* buf, size_t sizeInBytes) {
  return Call<decltype(&cublasLtMatmulDescSetAttribute)>(mc::kMatmulDescSetAttribute, kNotLoaded,
                                                         matmulDesc, attr, buf, sizeInBytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout,
                                                       cudaDataType type, uint64_t rows,
                                                       uint64_t cols, int64_t ld) {
  return Call<decltype(&cublasLtMatrixLayoutCreate)>(mc::kMatrixLayoutCreate, kNotLoaded, matLayout,
                                                     type, rows, cols, ld);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  return Call<decltype(&cublasLtMatrixLayoutDestroy)>(mc::kMatrixLayoutDestroy, kNotLoaded,
                                                      matLayout);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  return Call<decltype(&cublasLtMatmulPreferenceCreate)>(mc::kMatmulPreferenceCreate, kNotLoaded,
                                                         pref);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
    size_t sizeInBytes) {
  return Call<decltype(&cublasLtMatmulPreferenceSetAttribute)>(
      mc::kMatmulPreferenceSetAttribute, kNotLoaded, pref, attr, buf, sizeInBytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  return Call<decltype(&cublasLtMatmulPreferenceDestroy)>(mc::kMatmulPreferenceDestroy, kNotLoaded,
                                                          pref);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount) {
  return Call<decltype(&cublasLtMatmulAlgoGetHeuristic)>(
      mc::kMatmulAlgoGetHeuristic, kNotLoaded, lightHandle, operationDesc, Adesc, Bdesc, Cdesc,
      Ddesc, preference, requestedAlgoCount, heuristicResultsArray, returnAlgoCount);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoConfigGetAttribute(
    const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, void* buf,
    size_t sizeInBytes, size_t* sizeWritten) {
  return Call<decltype(&cublasLtMatmulAlgoConfigGetAttribute)>(
      mc::kMatmulAlgoConfigGetAttribute, kNotLoaded, algo, attr, buf, sizeInBytes, sizeWritten);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoCheck(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result) {
  return Call<decltype(&cublasLtMatmulAlgoCheck)>(mc::kMatmulAlgoCheck, kNotLoaded, lightHandle,
                                                  operationDesc, Adesc, Bdesc, Cdesc, Ddesc, algo,
                                                  result);
}
