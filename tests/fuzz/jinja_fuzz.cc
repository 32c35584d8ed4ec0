// Fuzzes the Jinja lexer, parser and interpreter (engine/tokenizer/jinja) through the chat
// template entry point (engine/tokenizer/chat_template.cc) on arbitrary templates. Input: the
// template, optionally a NUL and a JSON array of messages (else a fixed conversation with a
// system prompt, a tool call and a tool result). The clock is pinned. Properties: a failure
// is a status with a message; rendering twice gives the same text (no hidden state).
#include "engine/tokenizer/chat_template.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

nlohmann::ordered_json FixedMessages() {
  return nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]},
    {"role": "assistant", "content": "",
     "tool_calls": [{"type": "function",
                     "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]},
    {"role": "tool", "content": "4"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3+3?"}])");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace morserve;
  const std::vector<std::string_view> parts = fuzz::SplitAtNul(fuzz::AsText(data, size), 2);
  static const nlohmann::json config = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  absl::StatusOr<ChatTemplate> t = ChatTemplate::FromString(parts[0], config);
  if (!t.ok()) {
    fuzz::Check(!t.status().message().empty(), "a parse error says what is wrong");
    return 0;
  }
  t->set_clock([] { return std::tm{.tm_mday = 26, .tm_mon = 10, .tm_year = 126}; });
  nlohmann::ordered_json messages = FixedMessages();
  if (parts.size() == 2) {
    messages = nlohmann::ordered_json::parse(parts[1], nullptr, false);
    if (messages.is_discarded()) return 0;
  }
  const nlohmann::ordered_json extra = {
      {"tools", nlohmann::ordered_json::array({{{"type", "function"},
                                                {"function", {{"name", "add"}}}}})},
      {"enable_thinking", false}};
  absl::StatusOr<std::string> a = t->Render(messages, true, extra);
  absl::StatusOr<std::string> b = t->Render(messages, true, extra);
  fuzz::Check(a.ok() == b.ok(), "rendering is deterministic");
  if (a.ok()) fuzz::Check(*a == *b, "rendering is deterministic");
  return 0;
}
