// The multi-turn chat workload (see chat_workload.h).
#include "loadtest/chat_workload.h"

#include <random>

#include "absl/strings/str_cat.h"

namespace morserve::loadtest {
namespace {

// Common English words (most of them are in the licence texts and docs the demo tokenizer is
// trained on, so a word is about one token there).
constexpr const char* kWords[] = {
    "the",       "software",   "license",    "you",           "program",   "work",
    "source",    "code",       "copy",       "distribute",    "terms",     "conditions",
    "any",       "other",      "this",       "that",          "with",      "for",
    "under",     "version",    "free",       "public",        "general",   "may",
    "must",      "not",        "all",        "each",          "such",      "which",
    "without",   "warranty",   "notice",     "file",          "files",     "model",
    "server",    "request",    "token",      "tokens",        "cache",     "block",
    "memory",    "engine",     "batch",      "step",          "time",      "first",
    "last",      "new",        "old",        "one",           "two",       "three",
    "more",      "less",       "only",       "also",          "when",      "where",
    "what",      "how",        "why",        "user",          "users",     "system",
    "data",      "text",       "output",     "input",         "run",       "runs",
    "test",      "tests",      "build",      "make",          "change",    "changes",
    "part",      "parts",      "whole",      "same",          "different", "rights",
    "use",       "used",       "using",      "provide",       "provided",  "include",
    "includes",  "modify",     "modified",   "original",      "author",    "authors",
    "holder",    "holders",    "permission", "permitted",     "granted",   "grant",
    "law",       "applicable", "written",    "form",          "object",    "binary",
    "library",   "libraries",  "document",   "documentation", "section",   "paragraph",
    "clause",    "agreement",  "party",      "parties",       "claim",     "damages",
    "liability", "event",      "case",       "way",           "order",     "point",
    "number",    "value",      "values",     "name",          "names",     "line",
    "lines",     "page",       "pages",      "read",          "write",     "send",
    "receive",   "give",       "take",       "keep",          "start",     "stop",
    "end",       "long",       "short",      "small",         "large",     "good",
    "better",    "best",       "simple",     "clear",         "please",    "answer",
    "question",  "explain",    "describe",   "summarize",     "list",
};
constexpr int kNumWords = sizeof(kWords) / sizeof(kWords[0]);

// `n` words as sentences of 8 to 15 words ("Word word ... word. Word ...").
std::string Sentences(int n, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> word(0, kNumWords - 1);
  std::uniform_int_distribution<int> sentence_len(8, 15);
  std::string out;
  int left_in_sentence = 0;
  for (int i = 0; i < n; ++i) {
    std::string w = kWords[word(rng)];
    if (left_in_sentence == 0) {
      if (!out.empty()) out += ". ";
      left_in_sentence = sentence_len(rng);
      w[0] = static_cast<char>(w[0] - 'a' + 'A');
    } else {
      out += ' ';
    }
    out += w;
    --left_in_sentence;
  }
  if (!out.empty()) out += '.';
  return out;
}

}  // namespace

absl::StatusOr<ChatWorkload> MakeChatWorkload(const ChatWorkloadOptions& o) {
  if (o.conversations < 1) {
    return absl::InvalidArgumentError("chat workload: --conversations must be >= 1");
  }
  if (o.turns < 1) return absl::InvalidArgumentError("chat workload: --turns must be >= 1");
  if (o.system_prompt_words < 0) {
    return absl::InvalidArgumentError("chat workload: --system-prompt-words must be >= 0");
  }
  ChatWorkload w;
  std::mt19937_64 rng(o.seed);
  if (o.system_prompt_words > 0) {
    w.system_prompt =
        absl::StrCat("You are a helpful assistant. ", Sentences(o.system_prompt_words, rng));
  }
  constexpr int kNoCap = 1 << 30;
  w.conversations.resize(o.conversations);
  for (Conversation& c : w.conversations) {
    for (int t = 0; t < o.turns; ++t) {
      c.user_messages.push_back(Sentences(o.user_words.Sample(rng, kNoCap), rng));
      c.max_tokens.push_back(o.output_len.Sample(rng, kNoCap));
    }
  }
  return w;
}

RequestSpec ChatTurnSpec(const ChatWorkload& w, int c, int turn,
                         const std::vector<std::string>& replies) {
  const Conversation& conv = w.conversations[c];
  RequestSpec spec;
  if (!w.system_prompt.empty()) spec.messages.push_back({"system", w.system_prompt});
  for (int i = 0; i < turn; ++i) {
    spec.messages.push_back({"user", conv.user_messages[i]});
    spec.messages.push_back({"assistant", replies[i]});
  }
  spec.messages.push_back({"user", conv.user_messages[turn]});
  spec.max_tokens = conv.max_tokens[turn];
  return spec;
}

}  // namespace morserve::loadtest
