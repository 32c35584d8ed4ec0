// Byte-level BPE merge learning (the training half of a GPT-2 / Llama 3 style tokenizer):
// text is cut into words by the same PreTokenizer the tokenizer will use, words are counted,
// and merges are learned on the distinct words weighted by their counts.
//
// The base vocabulary is the 256 single bytes (id = byte value). Each step merges the most
// frequent adjacent pair; ties go to the pair with the smallest (left id, right id), so the
// result depends only on the multiset of words. Pair occurrences are counted as the reference
// trainers do (every adjacent position, "aaa" holds (a,a) twice) and a merge rewrites a word
// left to right. A merge whose byte string already exists (("a","bc") after ("ab","c")) gets
// the existing id, as in Hugging Face's trainer, so it is listed but adds no token.
//
// Incremental: pair counts and, per pair, the words that hold it are kept across steps; a
// merge touches only the words holding its pair, and a max-heap with lazy deletion (a popped
// entry whose count is stale is pushed again with the current count) picks the next pair.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/tokenizer/pretokenizer.h"

namespace morserve {

struct TrainedBpe {
  // Token id -> its raw bytes: ids 0..255 are the single bytes, then one per new merge result.
  std::vector<std::string> tokens;
  // Merges in rank order: (left id, right id) -> result id.
  struct Merge {
    int left;
    int right;
    int result;
  };
  std::vector<Merge> merges;
};

class BpeTrainer {
 public:
  // `pre_tokenizer` (not owned, must outlive the trainer) cuts text into words; it must end
  // in ByteLevel so words are raw bytes.
  static absl::StatusOr<BpeTrainer> Create(const PreTokenizer* pre_tokenizer);

  // Pre-tokenizes valid UTF-8 text (callers sanitize first) and counts its words.
  void AddText(std::string_view text);
  // Counts one word directly (tests: hand-computed merges without a regex).
  void AddWord(std::string_view word, int64_t count = 1);

  // Learns merges until the vocabulary holds `max_tokens` tokens (bytes included) or no pair
  // occurs any more. Fails when max_tokens < 256.
  absl::StatusOr<TrainedBpe> Train(int max_tokens) const;

  int64_t total_words() const { return total_words_; }
  size_t distinct_words() const { return word_counts_.size(); }

 private:
  explicit BpeTrainer(const PreTokenizer* pre_tokenizer) : pre_tokenizer_(pre_tokenizer) {}

  const PreTokenizer* pre_tokenizer_;
  absl::flat_hash_map<std::string, int64_t> word_counts_;
  int64_t total_words_ = 0;
};

}  // namespace morserve
