// The requests of a run, made before it starts so that every target sees the same list:
//   random  token-id prompts of --input-len tokens (ids uniform in [1, vocab)), --output-len
//           output tokens;
//   jsonl   one JSON object a line: "prompt" (text or an array of token ids) and optionally
//           "max_tokens" (else --output-len);
//   decode  the decode protocol of docs/design.md#benchmark-protocol: a 1-token prompt ({1},
//           as `morserve bench`) and output lengths ~ N(256, 64) unless --output-len says
//           otherwise.
// (The multi-turn chat workload, whose turns depend on the replies, is chat_workload.h.)
// Lengths are clamped so that prompt + output fits the context when it is known.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "loadtest/distribution.h"

namespace morserve::loadtest {

// One message of a chat prompt ("system", "user" or "assistant").
struct ChatMessage {
  std::string role, content;
};

struct RequestSpec {
  std::vector<int> prompt_ids;  // token ids, or empty when prompt_text or messages is used
  std::string prompt_text;
  std::vector<ChatMessage> messages;  // a chat prompt (the chat workload)
  int max_tokens = 16;
  int prompt_tokens() const { return static_cast<int>(prompt_ids.size()); }
};

struct WorkloadOptions {
  std::string kind = "random";  // random | jsonl | decode
  std::string dataset;          // jsonl path
  LengthDistribution input_len = LengthDistribution::Fixed(32);
  LengthDistribution output_len = LengthDistribution::Fixed(64);
  bool output_len_given = false;
  int vocab_size = 0;      // for random ids; required for random
  int context_length = 0;  // 0: unknown, no clamp beyond the distribution
  uint64_t seed = 0;
};

absl::StatusOr<std::vector<RequestSpec>> MakeWorkload(const WorkloadOptions& o, int count);

}  // namespace morserve::loadtest
