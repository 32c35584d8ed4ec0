// RowSampler (see row_sampler.h).
#include "engine/runtime/row_sampler.h"

#include <utility>

namespace morserve {

SampleInput NextTokenInput(const Sequence& seq, absl::Span<const int> eos_ids) {
  SampleInput in;
  in.params = &seq.request.params;
  in.prompt_ids = absl::MakeConstSpan(seq.tokens.data(), seq.num_prompt);
  in.output_ids = absl::MakeConstSpan(seq.tokens.data() + seq.num_prompt, seq.num_generated());
  in.eos_ids = eos_ids;
  in.seed = seq.seed;
  return in;
}

void RowSampler::SampleRows(absl::Span<const SampleInput> inputs, std::vector<SampleResult>* out) {
  out->assign(inputs.size(), SampleResult{});
  // ParallelFor runs a single row on this thread: batch 1 pays nothing for the pool.
  pool_->ParallelFor(static_cast<int64_t>(inputs.size()), [&](int64_t begin, int64_t end) {
    std::unique_ptr<Sampler> s = Acquire();
    for (int64_t i = begin; i < end; ++i) (*out)[i] = s->Sample(inputs[i]);
    Release(std::move(s));
  });
}

std::unique_ptr<Sampler> RowSampler::Acquire() {
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_.empty()) return std::make_unique<Sampler>();
  std::unique_ptr<Sampler> s = std::move(idle_.back());
  idle_.pop_back();
  return s;
}

void RowSampler::Release(std::unique_ptr<Sampler> s) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back(std::move(s));
}

}  // namespace morserve
