// Logit operations for device sampling (see sample_staging.h).
#include "engine/cuda/sample_staging.h"

#include <algorithm>
#include <cstdint>

#include "engine/core/check.h"

namespace morserve {

void StageLogitOps(const SampleInput& in, int vocab, int src_row,
                   std::vector<kernels::LogitOp>* ops, kernels::LogitRowProcess* row) {
  namespace k = kernels;
  const SamplingParams& p = *in.params;
  std::vector<k::LogitOp> raw;
  auto add = [&](int id, uint32_t flags, float bias, int32_t count) {
    MORSERVE_CHECK(id >= 0 && id < vocab, "a sampling token id outside the vocabulary");
    raw.push_back(k::LogitOp{id, flags, bias, count});
  };
  if (p.allowed_token_ids) {
    for (int id : *p.allowed_token_ids) add(id, k::kLogitOpAllowed, 0.0f, 0);
  }
  for (const auto& [id, bias] : p.logit_bias) add(id, k::kLogitOpBias, bias, 0);
  if (static_cast<int64_t>(in.output_ids.size()) < p.min_tokens) {
    for (int id : in.eos_ids) {
      if (id >= 0 && id < vocab) add(id, k::kLogitOpBanned, 0.0f, 0);
    }
    for (int id : p.stop_token_ids) add(id, k::kLogitOpBanned, 0.0f, 0);
  }
  const bool repetition = p.repetition_penalty != 1.0f;
  if (repetition || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    for (int id : in.output_ids) add(id, k::kLogitOpSeen, 0.0f, 1);
    if (repetition) {
      for (int id : in.prompt_ids) add(id, k::kLogitOpSeen, 0.0f, 0);
    }
  }
  std::sort(raw.begin(), raw.end(),
            [](const k::LogitOp& a, const k::LogitOp& b) { return a.id < b.id; });
  row->src_row = src_row;
  row->op_begin = static_cast<int32_t>(ops->size());
  for (const k::LogitOp& op : raw) {
    if (ops->size() > static_cast<size_t>(row->op_begin) && ops->back().id == op.id) {
      k::LogitOp& merged = ops->back();
      merged.flags |= op.flags;
      if ((op.flags & k::kLogitOpBias) != 0) merged.bias = op.bias;
      merged.count += op.count;
    } else {
      ops->push_back(op);
    }
  }
  row->op_end = static_cast<int32_t>(ops->size());
  row->masked = p.allowed_token_ids.has_value() ? 1 : 0;
  row->repetition = p.repetition_penalty;
  row->frequency = p.frequency_penalty;
  row->presence = p.presence_penalty;
}

}  // namespace morserve
