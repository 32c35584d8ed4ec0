// Requests for the runner-sampling tests (tests/unit/runner_sampling_test on the CPU,
// tests/gpu/engine_gpu_test on the CUDA runner): greedy and seeded sampled requests that ask
// for no logits, so the runner samples them (ModelRunner::Sample), some with the stages before
// temperature (penalties, logit bias, allowed ids, a min_tokens ban), and the same requests
// asking for logits, so the engine's host sampler does.
#pragma once

#include <vector>

#include "engine/runtime/request.h"
#include "tests/engine_harness.h"

namespace morserve::testing {

// `count` requests over the workload's prompts: every other one greedy, the rest at temperature
// 0.8 with top_p 0.9, top_k 20 or min_p 0.05 in turn, each with its own seed; max_tokens 8.
// Requests 2..6 (where count reaches them) also change their logits before temperature:
// repetition and frequency penalties (2, greedy), presence penalty and logit bias (3),
// allowed ids (4, greedy), a min_tokens ban of eos and a stop id with a repetition penalty
// below 1 (5), a strong bias on one id (6, greedy).
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
    const std::vector<int>& prompt = w.requests[i].prompt;
    auto at = [&](size_t j) { return prompt[j % prompt.size()]; };  // prompts may be 1 token
    switch (i) {
      case 2:
        r.params.repetition_penalty = 1.3f;
        r.params.frequency_penalty = 0.4f;
        break;
      case 3: {
        r.params.presence_penalty = 0.5f;
        const int other = (at(1) + 1) % vocab == at(0) ? (at(0) + 1) % vocab : (at(1) + 1) % vocab;
        r.params.logit_bias = {{at(0), 2.0f}, {other, -3.0f}};
        break;
      }
      case 4:
        r.params.allowed_token_ids = std::vector<int>{at(0), at(1), at(2), (at(0) + 7) % vocab, 1};
        break;
      case 5:
        r.params.min_tokens = 6;
        r.params.stop_token_ids = {(at(0) + 3) % vocab};
        r.params.repetition_penalty = 0.9f;
        break;
      case 6:
        r.params.logit_bias = {{(at(1) + 11) % vocab, 6.0f}};
        break;
      default:
        break;
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
