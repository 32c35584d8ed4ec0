// Samples the rows of one engine step at once, rows spread over a thread pool. Each row's
// result is Sampler::Sample of that row alone (sampler.h: a pure function of the row's logits,
// request and seeded counter), so the tokens do not depend on the number of threads nor on
// which thread drew which row; a Sampler's scratch is held by one range at a time.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "absl/types/span.h"
#include "engine/cpu/thread_pool.h"
#include "engine/runtime/sampler.h"
#include "engine/runtime/sequence.h"

namespace morserve {

// The sampler's input for the next token of `seq` (its logits left empty: the caller's).
SampleInput NextTokenInput(const Sequence& seq, absl::Span<const int> eos_ids);

class RowSampler {
 public:
  explicit RowSampler(ThreadPool* pool) : pool_(pool) {}

  // out[i] = Sampler().Sample(inputs[i]); the inputs' spans must stay valid for the call.
  void SampleRows(absl::Span<const SampleInput> inputs, std::vector<SampleResult>* out);

 private:
  std::unique_ptr<Sampler> Acquire();
  void Release(std::unique_ptr<Sampler> s);

  ThreadPool* pool_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Sampler>> idle_;  // scratch kept between steps
};

}  // namespace morserve
