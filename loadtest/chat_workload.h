// The multi-turn chat workload (--workload chat), the traffic automatic prefix caching is for:
// every conversation starts with the same system prompt (--system-prompt-words words, about
// 1,000 tokens with the demo tokenizer by default) and has --turns user messages of
// --user-words words each. Turn k sends the whole conversation so far, as a chat client
// does: the system prompt, every earlier user message followed by the assistant reply the
// server gave for it, then user message k. Text is words drawn from a fixed English list
// with the seed, so a run is reproducible; the user messages differ per conversation and
// turn. The replies are only known during the run (loadtest/chat_runner.h sends turn k+1
// when turn k has finished).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "loadtest/distribution.h"
#include "loadtest/workload.h"

namespace morserve::loadtest {

struct ChatWorkloadOptions {
  int conversations = 16;
  int turns = 4;
  int system_prompt_words = 750;
  LengthDistribution user_words = LengthDistribution::Uniform(20, 60);
  LengthDistribution output_len = LengthDistribution::Fixed(32);  // max_tokens per turn
  uint64_t seed = 0;
};

struct Conversation {
  std::vector<std::string> user_messages;  // one per turn
  std::vector<int> max_tokens;             // one per turn
};

struct ChatWorkload {
  std::string system_prompt;  // shared by every conversation
  std::vector<Conversation> conversations;
  int turns() const {
    return conversations.empty() ? 0 : static_cast<int>(conversations[0].user_messages.size());
  }
};

absl::StatusOr<ChatWorkload> MakeChatWorkload(const ChatWorkloadOptions& o);

// The request of `turn` (0-based) of conversation `c`: system prompt, then user message i and
// replies[i] for every i < turn, then user message `turn`. `replies` holds at least `turn`
// entries (the assistant's text of the earlier turns).
RequestSpec ChatTurnSpec(const ChatWorkload& w, int c, int turn,
                         const std::vector<std::string>& replies);

}  // namespace morserve::loadtest
