// Tokenizer: text <-> token ids from a Hugging Face model directory (tokenizer.json and
// tokenizer_config.json), for the BPE models in use: byte-level BPE with regex
// pre-tokenization (GPT-2, Llama 3, Qwen, SmolLM) and SentencePiece-style BPE with byte
// fallback (Llama 2, Gemma).
//
// Encode: sanitize UTF-8 -> cut out added tokens -> per remaining span: normalizer ->
// pre-tokenizer -> BPE -> post-processor (BOS and other template tokens). Decode: ids -> token
// strings -> decoder chain -> optional clean-up of tokenization spaces.
//
// The behaviour is that of transformers.js (the JavaScript port the parity tests compare
// against), including its documented quirks; see the component headers. Invalid UTF-8 input is
// decoded as JavaScript's TextDecoder does: each maximal ill-formed subpart becomes U+FFFD.
// Anything in a tokenizer file this code does not implement is an error at load.
// Encode and Decode are const and safe to call from several threads.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/tokenizer/added_tokens.h"
#include "engine/tokenizer/bpe.h"
#include "engine/tokenizer/decoder.h"
#include "engine/tokenizer/normalizer.h"
#include "engine/tokenizer/pretokenizer.h"
#include "nlohmann/json.hpp"

namespace morserve {

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json and DIR/tokenizer_config.json (optional; defaults when absent) and
  // DIR/generation_config.json (optional; adds its eos_token_id values).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromDirectory(const std::string& model_dir);
  // tokenizer_config may be null or an empty object.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(
      const nlohmann::json& tokenizer_json, const nlohmann::json& tokenizer_config);
  // The same from JSON text; parse errors name `what`.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJsonText(std::string_view tokenizer_json,
                                                                 std::string_view tokenizer_config);

  std::vector<int> Encode(std::string_view text, bool add_special_tokens) const;
  std::string Decode(absl::Span<const int> ids, bool skip_special_tokens) const;

  int vocab_size() const { return static_cast<int>(model_->id_to_token().size()); }
  std::optional<int> bos_token_id() const { return bos_id_; }
  std::vector<int> eos_token_ids() const { return eos_ids_; }
  std::optional<std::string> bos_token() const { return bos_token_; }
  std::optional<std::string> eos_token() const { return eos_token_; }
  // True for the ids of special tokens (added tokens marked special and the config's
  // additional_special_tokens): the ids skip_special_tokens drops.
  bool IsSpecial(int id) const;
  std::optional<std::string> IdToToken(int id) const;
  std::optional<int> TokenToId(std::string_view token) const;

  // For the streaming detokenizer: the string Decode uses for an id (the unknown token's for
  // ids out of range), the decoder chain and the clean-up flag.
  std::string_view TokenText(int id) const;
  const std::vector<DecoderStep>& decoder_steps() const { return decoder_steps_; }
  bool has_decoder() const { return has_decoder_; }
  bool clean_up_tokenization_spaces() const { return clean_up_; }
  const AddedTokenSplitter& added_tokens() const { return added_; }

 private:
  Tokenizer() = default;
  absl::Status Load(const nlohmann::json& tj, const nlohmann::json& config);
  absl::Status LoadPostProcessor(const nlohmann::json& pp);
  void EncodeText(std::string_view text, std::vector<int>* ids) const;
  void EncodeNormalized(std::string_view text, int section_index, std::vector<int>* ids) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  AddedTokenSplitter added_;             // all added tokens (decoding, lookups)
  AddedTokenSplitter raw_added_;         // matched in raw text (normalized=false)
  AddedTokenSplitter normalized_added_;  // matched in normalized text (normalized=true)
  std::vector<DecoderStep> decoder_steps_;
  bool has_decoder_ = false;
  bool clean_up_ = true;
  bool llama_non_legacy_ = false;  // LlamaTokenizer with legacy=false (see Encode)
  int metaspace_id_ = -1;
  // Post-processor template for a single sequence: ids to emit (special tokens) and -1 where
  // the sequence goes. Empty: the sequence alone.
  std::vector<int> template_;
  std::string unk_text_;
  absl::flat_hash_set<std::string> special_strings_;
  std::optional<int> bos_id_;
  std::vector<int> eos_ids_;
  std::optional<std::string> bos_token_, eos_token_;
};

}  // namespace morserve
