// Where the engine finds the CUDA model runner (--device cuda). The engine library never
// links a runner: a runner library registers its factory when it is linked into a program,
// the real one (engine/cuda, libcudart and the nvcc-built kernels: morserve_cuda_runner) into
// `morserve` and the GPU tests, the CPU-emulated one (the same runner source on
// kernels/emu: morserve_cuda_runner_emu) into the emulator tests. Without either, --device
// cuda is the clear "no CUDA backend" error. At most one runner may be registered.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/model/weights.h"
#include "engine/runtime/engine_config.h"
#include "engine/runtime/model_runner.h"

namespace morserve {

using CudaRunnerFactory = absl::StatusOr<std::unique_ptr<ModelRunner>> (*)(
    std::shared_ptr<const ModelWeights> weights, const EngineConfig& config, int num_kv_blocks);

// Registers the factory (from a static initialiser); aborts if one is already registered.
// Returns true so it can initialise a namespace-scope constant.
bool RegisterCudaRunner(CudaRunnerFactory factory);

// The registered factory, or nullptr when no runner is linked in.
CudaRunnerFactory RegisteredCudaRunner();

// The device's copy bandwidth in bytes per second (read + written, device to device, the best
// of `passes` copies between two `megabytes` buffers), the reference of `morserve bench
// --device cuda`'s MBU. Registered by the runner library beside its factory.
using CudaCopyBandwidthFn = absl::StatusOr<double> (*)(int64_t megabytes, int passes);
bool RegisterCudaCopyBandwidth(CudaCopyBandwidthFn fn);
// nullptr when no runner is linked in.
CudaCopyBandwidthFn RegisteredCudaCopyBandwidth();

}  // namespace morserve
