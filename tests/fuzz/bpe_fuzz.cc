// Fuzzes encoding and decoding with the two tokenizer shapes in use (byte-level BPE with a
// regex split; SentencePiece-style BPE with byte fallback; tests/fuzz/data): the first byte
// picks the tokenizer and the flags, the rest is text (any bytes, ill-formed UTF-8 included)
// or, with the id flag, little-endian 16-bit token ids (out-of-range ones included).
// Properties: ids are in the vocabulary; decoding is whole characters (valid UTF-8); the
// streaming detokenizer's output equals Decode for every stream of ids; byte-level BPE
// round-trips well-formed text exactly.
#include "engine/tokenizer/incremental_detokenizer.h"
#include "engine/tokenizer/utf8.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using morserve::fuzz::Check;

void CheckStreamEqualsDecode(const morserve::Tokenizer& tok, const std::vector<int>& ids,
                             bool skip_special) {
  const std::string whole = tok.Decode(ids, skip_special);
  Check(morserve::IsValidUtf8(whole), "Decode gives well-formed UTF-8");
  absl::StatusOr<morserve::IncrementalDetokenizer> d =
      morserve::IncrementalDetokenizer::Create(tok, skip_special);
  Check(d.ok(), "both fixture tokenizers stream");
  std::string streamed;
  for (int id : ids) {
    const std::string delta = d->Push(id);
    Check(morserve::IsValidUtf8(delta), "every streamed delta is whole characters");
    streamed += delta;
  }
  streamed += d->Flush();
  Check(streamed == whole, "streaming detokenization equals Decode");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace morserve;
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  const Tokenizer& tok =
      (flags & 1) ? fuzz::SentencePieceTokenizer() : fuzz::ByteLevelTokenizer();
  const bool skip_special = flags & 2, add_special = flags & 4, as_ids = flags & 8;
  std::vector<int> ids;
  if (as_ids) {
    for (size_t i = 1; i + 1 < size; i += 2) ids.push_back(data[i] | (data[i + 1] << 8));
  } else {
    const std::string_view text = fuzz::AsText(data + 1, size - 1);
    ids = tok.Encode(text, add_special);
    for (int id : ids) Check(id >= 0 && id < tok.vocab_size(), "encoded ids are in the vocabulary");
    const bool round_trips = !(flags & 1) && !add_special && IsValidUtf8(text);
    if (round_trips) Check(tok.Decode(ids, false) == text, "byte-level BPE round-trips text");
  }
  CheckStreamEqualsDecode(tok, ids, skip_special);
  return 0;
}
