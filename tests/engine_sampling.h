// Requests for the runner-sampling tests (tests/unit/runner_sampling_test on the CPU,
// tests/gpu/engine_gpu_test on the CUDA runner): greedy and seeded sampled requests that ask
// for no logits, so the runner samples them (ModelRunner::Sample), and the same requests
// asking for logits, so the engine's host sampler does.
#pragma once

#include <vector>

#include "engine/runtime/request.h"
#include "tests/engine_harness.h"

namespace morserve::testing {

// `count` requests over the workload's prompts: every other one greedy, the rest at temperature
// 0.8 with top_p 0.9, top_k 20 or min_p 0.05 in turn, each with its own seed; max_tokens 8.
inline std::vector<GenerateRequest> RunnerSampledRequests(int vocab, int count) {
  Workload w = MakeWorkload(vocab, count);
  std::vector<GenerateRequest> out;
  for (int i = 0; i < count; ++i) {
    GenerateRequest r = Greedy(w.requests[i].prompt, 8);
    r.return_logits = false;
    if (i % 2 == 1) {
      r.params.temperature = 0.8f;
      r.params.seed = 100 + i;
      if (i % 6 == 1) r.params.top_p = 0.9f;
      if (i % 6 == 3) r.params.top_k = 20;
      if (i % 6 == 5) r.params.min_p = 0.05f;
    }
    out.push_back(r);
  }
  return out;
}

// The same requests, asking for logits (the host sampler's path).
inline std::vector<GenerateRequest> WithLogits(std::vector<GenerateRequest> requests) {
  for (GenerateRequest& r : requests) r.return_logits = true;
  return requests;
}

}  // namespace morserve::testing
