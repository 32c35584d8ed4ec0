// Host side of the CUDA runner's sampling for rows whose request changes its logits before
// temperature (allowed ids, logit bias, a min_tokens ban, repetition / frequency / presence
// penalties): the row's per-id operations for kernels/logit_process.cuh, built from the same
// SampleInput the CPU sampler reads, so the device's processed row equals
// Sampler::ProcessLogits bit for bit (kernel_logit_process_test). Plain C++. Which rows need it:
// Sampler::ChangesLogits.
#pragma once

#include <vector>

#include "engine/runtime/sampler.h"
#include "kernels/logit_ops.h"

namespace morserve {

// Appends the row's operations to *ops (one per distinct id, ascending) and fills *row
// (src_row, its op range, its penalties). Ids outside [0, vocab) are refused by Validate()
// before a request runs; eos ids outside the vocabulary are skipped, as the sampler does.
void StageLogitOps(const SampleInput& in, int vocab, int src_row,
                   std::vector<kernels::LogitOp>* ops, kernels::LogitRowProcess* row);

}  // namespace morserve
