// Pre-tokenizers of tokenizer.json: split normalized text into words for the BPE model.
// Supported: Sequence, Split (Regex or String; all HF behaviours and invert), ByteLevel,
// Metaspace, Digits (SmolLM), Punctuation, Whitespace, WhitespaceSplit.
// ByteLevel does not remap bytes to printable characters here: words stay raw UTF-8 and the BPE
// model of a byte-level tokenizer works on bytes directly (its vocabulary is translated once at
// load), which is the same tokenization without a remap per word.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace morserve {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Appends the words of `text` to *words. section_index is the position of the text among the
  // spans between added tokens (Metaspace's prepend_scheme "first" uses it).
  virtual void Split(std::string_view text, int section_index,
                     std::vector<std::string>* words) const = 0;
  // True when the chain ends in ByteLevel: words are then byte strings for a byte-level model.
  virtual bool byte_level() const { return false; }
  // A null JSON value yields nullptr (the whole text is one word).
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> FromJson(const nlohmann::json& config);
};

// The Metaspace pre-tokenizer built in code (LlamaTokenizer with legacy=false).
std::unique_ptr<PreTokenizer> MakeMetaspacePreTokenizer(std::string replacement,
                                                        bool add_prefix_space,
                                                        std::string prepend_scheme);

}  // namespace morserve
