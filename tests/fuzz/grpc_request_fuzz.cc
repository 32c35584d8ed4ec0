// Fuzzes the gRPC edge validation (server/request_parse.cc: ParseGenerateRequest, RenderChat)
// on GenerateRequests built from the fuzz bytes (protobuf's own parser first, so any field
// combination reaches the validation), with the byte-level fixture tokenizer and its Llama 3
// chat template (tests/fuzz/data). Properties: a rejected request is INVALID_ARGUMENT or
// FAILED_PRECONDITION with a message; an accepted one has a prompt of in-vocabulary ids.
#include "server/request_parse.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

const morserve::ChatTemplate& FixtureTemplate() {
  static const morserve::ChatTemplate t = [] {
    const nlohmann::json config = nlohmann::json::parse(
        morserve::fuzz::ReadFile(morserve::fuzz::DataPath("bytelevel.tokenizer_config.json")));
    absl::StatusOr<morserve::ChatTemplate> parsed =
        morserve::ChatTemplate::FromTokenizerConfig(config);
    morserve::fuzz::Check(parsed.ok(), "the fixture chat template parses");
    return *std::move(parsed);
  }();
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace morserve;
  v1::GenerateRequest in;
  if (!in.ParseFromArray(data, static_cast<int>(size))) return 0;
  const TextModel text{&fuzz::ByteLevelTokenizer(), &FixtureTemplate()};
  // The text model, and none (token ids only), as servers without a tokenizer run.
  for (const TextModel& model : {text, TextModel{}}) {
    absl::StatusOr<ParsedGenerate> p = ParseGenerateRequest(in, model);
    if (!p.ok()) {
      const absl::StatusCode c = p.status().code();
      fuzz::Check(c == absl::StatusCode::kInvalidArgument ||
                      c == absl::StatusCode::kFailedPrecondition,
                  "a rejected request is INVALID_ARGUMENT or FAILED_PRECONDITION");
      fuzz::Check(!p.status().message().empty(), "an error says what is wrong");
      continue;
    }
    if (model.tokenizer != nullptr && !in.has_token_ids()) {
      for (int id : p->request.prompt) {
        fuzz::Check(id >= 0 && id < model.tokenizer->vocab_size(), "encoded ids are in vocab");
      }
    }
  }
  return 0;
}
