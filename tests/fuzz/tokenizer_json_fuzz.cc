// Fuzzes tokenizer loading (engine/tokenizer/tokenizer.cc and the normalizer, pre-tokenizer,
// BPE model, added-token, post-processor and decoder readers it calls) on arbitrary
// tokenizer.json text, optionally followed by a NUL and tokenizer_config.json text. A
// tokenizer that loads must then encode and decode (plain and streaming) a fixed text without
// crashing; the streaming detokenizer's output must equal Decode.
#include "engine/tokenizer/incremental_detokenizer.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace morserve;
  const std::vector<std::string_view> parts = fuzz::SplitAtNul(fuzz::AsText(data, size), 2);
  absl::StatusOr<std::unique_ptr<Tokenizer>> t =
      Tokenizer::FromJsonText(parts[0], parts.size() == 2 ? parts[1] : std::string_view());
  if (!t.ok()) {
    fuzz::Check(!t.status().message().empty(), "an error says what is wrong");
    return 0;
  }
  const Tokenizer& tok = **t;
  const std::vector<int> ids = tok.Encode("Hello, world! 123 \xC3\xA9t\xC3\xA9 <s> \n\t x", true);
  for (int id : ids) fuzz::Check(id >= 0, "ids are not negative");
  const std::string whole = tok.Decode(ids, false);
  absl::StatusOr<IncrementalDetokenizer> d = IncrementalDetokenizer::Create(tok, false);
  if (d.ok()) {
    std::string streamed;
    for (int id : ids) streamed += d->Push(id);
    streamed += d->Flush();
    fuzz::Check(streamed == whole, "streaming detokenization equals Decode");
  }
  return 0;
}
