// The registered CUDA runner factory and copy-bandwidth probe (see cuda_runner_registry.h).
#include "engine/runtime/cuda_runner_registry.h"

#include <cstdio>
#include <cstdlib>

namespace morserve {
namespace {

// A function-local static: registration runs during other files' static initialisation.
CudaRunnerFactory& Slot() {
  static CudaRunnerFactory factory = nullptr;
  return factory;
}

}  // namespace

bool RegisterCudaRunner(CudaRunnerFactory factory) {
  if (Slot() != nullptr && Slot() != factory) {
    std::fprintf(stderr, "two CUDA model runners are linked into this program\n");
    std::abort();
  }
  Slot() = factory;
  return true;
}

CudaRunnerFactory RegisteredCudaRunner() { return Slot(); }

namespace {
CudaCopyBandwidthFn& BandwidthSlot() {
  static CudaCopyBandwidthFn fn = nullptr;
  return fn;
}
}  // namespace

bool RegisterCudaCopyBandwidth(CudaCopyBandwidthFn fn) {
  BandwidthSlot() = fn;
  return true;
}

CudaCopyBandwidthFn RegisteredCudaCopyBandwidth() { return BandwidthSlot(); }

}  // namespace morserve
