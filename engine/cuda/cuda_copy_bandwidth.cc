// The device's copy bandwidth for `morserve bench --device cuda` (cuda_runner_registry.h):
// device-to-device cudaMemcpy between two buffers, timed on the host around a
// synchronisation (the emulated runtime has no events), best of the passes. Registered with
// the runner's factory, in the same object library.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/runtime/cuda_runner_registry.h"

namespace morserve {
namespace {

absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(absl::StrCat("--device cuda: ", what, ": ", cudaGetErrorString(e)));
}

absl::StatusOr<double> CopyBandwidth(int64_t megabytes, int passes) {
  if (megabytes < 1) return absl::InvalidArgumentError("--membw-mb: must be >= 1");
  if (passes < 1) return absl::InvalidArgumentError("--membw-passes: must be >= 1");
  const size_t bytes = static_cast<size_t>(megabytes) << 20;
  void* src = nullptr;
  void* dst = nullptr;
  cudaError_t alloc = cudaMalloc(&src, bytes);
  if (alloc == cudaSuccess) {
    alloc = cudaMalloc(&dst, bytes);
    if (alloc != cudaSuccess) cudaFree(src);
  }
  if (alloc != cudaSuccess) {
    return absl::ResourceExhaustedError(
        absl::StrCat("--membw-mb: cannot allocate 2 x ", megabytes,
                     " MiB on the device: ", cudaGetErrorString(alloc)));
  }
  absl::Status status = absl::OkStatus();
  double best = 0;
  // A first copy outside the timing (first touch of the pages), then the timed passes.
  if (cudaError_t e = cudaMemset(src, 1, bytes); e != cudaSuccess) status = CudaError(e, "memset");
  for (int pass = -1; status.ok() && pass < passes; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (e != cudaSuccess) {
      status = CudaError(e, "device-to-device copy");
    } else if (pass >= 0 && seconds > 0) {
      const double rate = 2.0 * static_cast<double>(bytes) / seconds;
      if (rate > best) best = rate;
    }
  }
  cudaFree(src);
  cudaFree(dst);
  if (!status.ok()) return status;
  return best;
}

[[maybe_unused]] const bool kRegistered = RegisterCudaCopyBandwidth(&CopyBandwidth);

}  // namespace
}  // namespace morserve
