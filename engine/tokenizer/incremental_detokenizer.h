// Streaming detokenization: one token at a time, the text that is now certain.
//
// The decoder chain of the tokenizer runs as a stream: per-token steps (Replace, Metaspace,
// Strip before any fusing) map each token; a byte-grouping step (ByteLevel or ByteFallback)
// feeds a streaming UTF-8 decoder, so a character whose bytes span tokens is emitted once its
// last byte arrives and never half; steps on the fused text (Strip) hold back only what they
// may still remove (a leading space until the first character is known, trailing characters
// until more text arrives); the clean-up of tokenization spaces holds back text from the last
// point where a pattern could still match across the boundary.
//
// Invariant, checked by property tests: the concatenation of every Push() and the final
// Flush() equals Tokenizer::Decode of all pushed ids (same skip_special_tokens).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/decoder.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"

namespace morserve {

class IncrementalDetokenizer {
 public:
  // Fails (UNIMPLEMENTED) for decoder chains this streaming form does not cover.
  static absl::StatusOr<IncrementalDetokenizer> Create(const Tokenizer& tokenizer,
                                                       bool skip_special_tokens);

  // The text delta made certain by this token (possibly empty); always whole characters.
  std::string Push(int id);
  // Ends the stream: the text still held back. The detokenizer is then ready for a new stream.
  std::string Flush();

 private:
  enum class Grouping { kNone, kByteLevel, kByteFallback };
  // Strip on the fused text: drop up to `start` leading and `stop` trailing `content`.
  struct StreamStrip {
    std::string content;
    int start_left;
    int stop;
    std::string held;  // trailing run of `content`, at most `stop` copies
    bool seen_other = false;
  };

  explicit IncrementalDetokenizer(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}
  void EmitText(std::string_view text, std::string* out);
  void EmitAfterStrips(std::string_view text, std::string* out);
  void FinishGroup(std::string* out);

  const Tokenizer* tokenizer_;
  bool skip_special_ = false;
  bool join_with_spaces_ = false;  // no decoder at all: tokens joined with " "
  std::vector<DecoderStep> token_steps_;
  Grouping grouping_ = Grouping::kNone;
  std::vector<StreamStrip> strips_;
  std::vector<StreamStrip> initial_strips_;
  bool clean_up_ = false;
  Utf8StreamDecoder utf8_;
  bool group_open_ = false;
  int tokens_seen_ = 0;
  std::string clean_pending_;
};

}  // namespace morserve
