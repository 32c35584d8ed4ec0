// Added tokens (tokenizer.json `added_tokens`): they are cut out of the raw text before
// normalization and BPE, so they are never merged with their neighbours.
//
// Matching is leftmost-longest, as transformers.js' DictionarySplitter does. lstrip / rstrip
// remove JavaScript whitespace next to the token. The other two flags follow Hugging Face
// tokenizers (transformers.js ignores them; none of the four parity files sets them):
//  - single_word: a match counts only if no word character (\w) touches it on either side;
//  - normalized: the token is matched, in its normalized form, in normalized text. The
//    tokenizer keeps two splitters: raw-text tokens first, then normalized ones per span.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace morserve {

struct AddedToken {
  std::string content;
  int id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

class AddedTokenSplitter {
 public:
  struct Section {
    std::string_view text;
    int token = -1;  // index into tokens() when this section is an added token
  };
  void Add(AddedToken token);
  const std::vector<AddedToken>& tokens() const { return tokens_; }
  // Splits text into plain sections and added-token sections, in order, with lstrip/rstrip
  // applied to the neighbours; empty plain sections are kept (section indices count them).
  std::vector<Section> Split(std::string_view text) const;
  // The added token whose content equals s, or nullptr.
  const AddedToken* Find(std::string_view s) const;

 private:
  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<std::string, int> by_content_;
  // Byte trie: node -> (byte -> child); terminal[node] = token index or -1.
  std::vector<absl::flat_hash_map<unsigned char, int>> children_{1};
  std::vector<int> terminal_{-1};
  bool can_start_[256] = {};
};

}  // namespace morserve
