// The sizes the engine GPU tests (engine_gpu_test.cc, engine_gpu_recurrent_test.cc) run at. On
// a GPU: testing::GpuModelSpec (hidden 256, 4 heads of 64, 2 kv heads) and the full
// workloads. Built as engine_gpu_emu_test / engine_gpu_recurrent_emu_test
// (MORSERVE_EMULATED_RUNNER: the same checks on the CPU-emulated CUDA runner, kernels/emu, where
// every CUDA thread is a fiber), the same model and fewer requests and prompt lengths. (A
// smaller model, hidden 128, saved little time and left too few clear steps to compare.) The
// emulated runs check the runner's logic (indexing, staging, packing, launch configurations), not
// its speed.
#pragma once

#include <string>
#include <vector>

#include "tests/engine_harness.h"

namespace morserve::testing {

#ifdef MORSERVE_EMULATED_RUNNER
inline constexpr bool kEmulatedRunner = true;
#else
inline constexpr bool kEmulatedRunner = false;
#endif

// Requests of engine_gpu_test's staggered workload (testing::MakeWorkload).
inline int EngineGpuRequests() { return kEmulatedRunner ? 8 : 16; }

// engine_gpu_recurrent_test's prompt lengths: powers of two and not, on and off the 32-key
// fold tiles (the emulated runner keeps the tile edges, 31..33 and 64..65).
inline std::vector<int> RecurrentPromptLengths() {
  if (kEmulatedRunner) return {1, 2, 7, 31, 32, 33, 64, 65};
  return {1, 2, 7, 31, 32, 33, 64, 100, 129, 255, 256, 300};
}

}  // namespace morserve::testing
