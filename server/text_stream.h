// The text side of one Generate stream: generated token ids become text deltas through the
// tokenizer's IncrementalDetokenizer, and stop strings are matched on that text with vLLM's
// semantics (the output ends right before the match, the stop string itself excluded).
//
// Invariants:
//   - Every delta is whole UTF-8 characters (the detokenizer's guarantee, kept by cutting
//     only at the start of a stop-string prefix, itself a character start).
//   - Text that could be the beginning of a stop string is held back until a later token
//     decides it, so a match spanning token boundaries is never half sent.
//   - min_tokens (vLLM's): the text of the first min_tokens tokens is protected; a match
//     must end after it (it may start inside it), as vLLM's detokenizer checks only text
//     that later tokens add, looking back a stop string's length.
//   - Without a match, the deltas of Push() and Finish() concatenate to
//     Tokenizer::Decode(all ids, skip_special_tokens); with one, to the prefix of that text
//     before the earliest match.
// Pure CPU state, no gRPC: the reactor calls it under its own lock.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/incremental_detokenizer.h"
#include "engine/tokenizer/tokenizer.h"

namespace morserve {

class TextStream {
 public:
  // `stop` strings must be non-empty. Fails as IncrementalDetokenizer::Create does.
  static absl::StatusOr<TextStream> Create(const Tokenizer& tokenizer, bool skip_special_tokens,
                                           std::vector<std::string> stop, int min_tokens = 0);

  // The text this token makes final (possibly empty). Once stopped(), always empty.
  std::string Push(int id);
  // End of the generation: the text still held back, up to a stop string it completes.
  std::string Finish();

  bool stopped() const { return matched_ >= 0; }
  // The stop string that matched ("" when none).
  const std::string& stop_string() const;

 private:
  TextStream(IncrementalDetokenizer detokenizer, std::vector<std::string> stop, int min_tokens);
  // Where stop_[k] may start in pending_ so that its match ends after the protected text.
  size_t SearchFrom(const std::string& stop) const;
  // Moves the decided part of pending_ out; at the end nothing is held back.
  std::string Release(bool at_end);

  IncrementalDetokenizer detokenizer_;
  std::vector<std::string> stop_;
  size_t longest_stop_ = 0;
  std::string pending_;  // decoded, not yet sent: may still begin a stop string
  int matched_ = -1;     // index into stop_
  int min_tokens_ = 0;
  int pushed_ = 0;        // tokens pushed so far
  size_t protected_ = 0;  // leading bytes of pending_ from the first min_tokens tokens
};

}  // namespace morserve
