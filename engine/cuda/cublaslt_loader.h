// Loads cuBLASLt with dlopen on first use instead of linking it, so that a CUDA build of
// `morserve` keeps its Prometheus /metrics listener (see cublaslt_loader.cc for why a linked
// libcublasLt breaks civetweb). The library `morserve_cublaslt` also defines the cublasLt*
// entry points kernels/gemm.cu calls, each forwarding to the loaded library; the kernels link
// it instead of CUDA::cublasLt. Plain C++ (no absl): the kernel tests stay self-contained.
#pragma once

#include <string>

namespace morserve::cuda {

// The file name tried first: libcublasLt.so.<major of the cuBLAS headers built against>.
const char* CublasLtSoname();

// Loads cuBLASLt once per process (thread-safe; later calls return the first answer) and
// resolves every entry point morserve uses. Returns "" when loaded, otherwise why not
// (every place tried, dlopen's messages, a version mismatch or a missing symbol).
const std::string& LoadCublasLt();

// True once LoadCublasLt succeeded (does not load).
bool CublasLtLoaded();

}  // namespace morserve::cuda
