// Decoders of tokenizer.json: token strings -> text, as transformers.js applies them (each step
// maps a list of strings to a list of strings; the result is joined). Supported: Sequence,
// ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace. The parsed steps are plain data so
// the streaming detokenizer (incremental_detokenizer.h) can run the same chain incrementally.
//
// Invalid UTF-8 from byte tokens decodes as TextDecoder does (maximal subparts -> U+FFFD);
// ByteFallback, like TextDecoder's default, drops a BOM at the start of each byte run, while
// ByteLevel keeps it (the reference passes ignoreBOM there). A ByteLevel token character outside
// GPT-2's byte table decodes as a NUL byte (the reference's Uint8Array conversion).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace morserve {

class AddedTokenSplitter;

struct DecoderStep {
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  Kind kind;
  std::string pattern;  // kReplace: literal pattern; kMetaspace: the replacement character
  std::string content;  // kReplace: replacement; kStrip: the character to strip
  int start = 0;        // kStrip
  int stop = 0;         // kStrip
  bool add_prefix_space = false;  // kMetaspace
};

// Parses a decoder (null -> empty list; Sequence is flattened).
absl::StatusOr<std::vector<DecoderStep>> ParseDecoder(const nlohmann::json& config);

// Runs the steps on token strings and joins the result. With no steps at all the reference
// joins tokens with single spaces; `has_decoder` distinguishes that from an empty Sequence.
std::string RunDecoder(const std::vector<DecoderStep>& steps, bool has_decoder,
                       const std::vector<std::string_view>& tokens,
                       const AddedTokenSplitter& added);

// Decodes a ByteFallback token "<0xHH>" (parseInt semantics of the reference); -1 otherwise.
int ParseByteToken(std::string_view token);

// transformers.js' clean_up_tokenization: removes the space before . ? ! , and before the
// English contractions, applied pattern by pattern over the whole text.
std::string CleanUpTokenization(std::string_view text);
// A split point p of raw text is safe for CleanUpTokenization (clean(a+b) == clean(a)+clean(b))
// when the character before p cannot start or continue a pattern match past p.
bool IsCleanUpSafeBoundary(char before);

}  // namespace morserve
