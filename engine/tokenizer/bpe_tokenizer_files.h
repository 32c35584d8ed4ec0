// The Hugging Face files of a trained byte-level BPE (what `morserve mktokenizer` writes):
// tokenizer.json in Llama 3's shape -- the GPT-4 / Llama 3 split regex then ByteLevel, model
// BPE over GPT-2's printable byte stand-ins, ByteLevel decoder, a BOS template post-processor,
// Llama 3's special tokens as added tokens after the learned ones -- plus
// tokenizer_config.json (bos/eos, add_bos_token, a chat template) and generation_config.json
// (bos and eos ids). The files load in engine/tokenizer/tokenizer.h, transformers and
// transformers.js alike.
//
// Decoding gives back the encoded text exactly: there is no normalizer, every byte is a token,
// and clean_up_tokenization_spaces is false.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/tokenizer/bpe_trainer.h"
#include "nlohmann/json.hpp"

namespace morserve {

// The pre_tokenizer object of tokenizer.json; training cuts words with the same one.
nlohmann::json Llama3PreTokenizerJson();

// <|begin_of_text|>, <|end_of_text|>, <|start_header_id|>, <|end_header_id|>, <|eot_id|>:
// the ids right after the learned tokens, in this order.
const std::vector<std::string>& Llama3SpecialTokens();

// Chat template names: "llama3" (Llama 3 Instruct's; eos <|eot_id|>) and "none" (no
// template; eos <|end_of_text|>).
const std::vector<std::string>& ChatTemplateNames();

struct BpeTokenizerFiles {
  nlohmann::ordered_json tokenizer;          // tokenizer.json
  nlohmann::ordered_json tokenizer_config;   // tokenizer_config.json
  nlohmann::ordered_json generation_config;  // generation_config.json
};

// Fails for an unknown chat template name.
absl::StatusOr<BpeTokenizerFiles> MakeBpeTokenizerFiles(const TrainedBpe& bpe,
                                                        const std::string& chat_template);

// Writes the three files into dir (created if needed).
absl::Status WriteBpeTokenizerFiles(const BpeTokenizerFiles& files, const std::string& dir);

}  // namespace morserve
