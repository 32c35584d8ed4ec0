// The multi-turn chat workload without a server: the generator (one shared system prompt of
// the asked size, a user message and max_tokens per turn, reproducible by seed), the turn
// structure (turn k resends turn k-1's messages plus its reply and a new user message, so
// consecutive turns share their whole prefix), the runner against a fake target (turns of a
// conversation strictly one after the other, each carrying the previous reply; warm-up
// conversations first; a failed turn ends its conversation), the --workload chat flags, and
// the prompt cache report.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "loadtest/chat_runner.h"
#include "loadtest/chat_workload.h"
#include "loadtest/http_target.h"
#include "loadtest/options.h"
#include "loadtest/prompt_cache_report.h"
#include "tests/testutil.h"

namespace morserve::loadtest {
namespace {

ChatWorkloadOptions Small(int conversations, int turns) {
  ChatWorkloadOptions o;
  o.conversations = conversations;
  o.turns = turns;
  o.system_prompt_words = 200;
  o.user_words = LengthDistribution::Uniform(5, 9);
  o.output_len = LengthDistribution::Fixed(7);
  o.seed = 3;
  return o;
}

int Words(const std::string& s) {
  return static_cast<int>(
      std::vector<std::string>(absl::StrSplit(s, ' ', absl::SkipEmpty())).size());
}

TEST(ChatWorkloadTest, SharedSystemPromptAndOneUserMessagePerTurn) {
  auto w = MakeChatWorkload(Small(5, 3));
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->conversations.size(), 5u);
  EXPECT_EQ(w->turns(), 3);
  // "You are a helpful assistant. " and the asked number of words.
  EXPECT_EQ(w->system_prompt.rfind("You are a helpful assistant. ", 0), 0u);
  EXPECT_EQ(Words(w->system_prompt), 5 + 200);
  std::set<std::string> users;
  for (const Conversation& c : w->conversations) {
    ASSERT_EQ(c.user_messages.size(), 3u);
    EXPECT_EQ(c.max_tokens, (std::vector<int>{7, 7, 7}));
    for (const std::string& u : c.user_messages) {
      EXPECT_GE(Words(u), 5);
      EXPECT_LE(Words(u), 9);
      users.insert(u);
    }
  }
  EXPECT_EQ(users.size(), 15u) << "user messages differ across conversations and turns";
  // Reproducible by seed; another seed gives other text.
  auto again = MakeChatWorkload(Small(5, 3));
  EXPECT_EQ(again->system_prompt, w->system_prompt);
  EXPECT_EQ(again->conversations[4].user_messages, w->conversations[4].user_messages);
  ChatWorkloadOptions other = Small(5, 3);
  other.seed = 4;
  EXPECT_NE(MakeChatWorkload(other)->system_prompt, w->system_prompt);
  // No system prompt at all with 0 words; bad sizes are errors.
  ChatWorkloadOptions none = Small(1, 1);
  none.system_prompt_words = 0;
  EXPECT_TRUE(MakeChatWorkload(none)->system_prompt.empty());
  EXPECT_FALSE(MakeChatWorkload(Small(0, 2)).ok());
  EXPECT_FALSE(MakeChatWorkload(Small(2, 0)).ok());
}

TEST(ChatWorkloadTest, EachTurnResendsTheConversationSoFar) {
  auto w = MakeChatWorkload(Small(2, 4));
  ASSERT_TRUE(w.ok());
  const std::vector<std::string> replies = {"r0", "r1", "r2"};
  const Conversation& c = w->conversations[1];
  std::vector<ChatMessage> previous;
  for (int t = 0; t < 4; ++t) {
    const RequestSpec s = ChatTurnSpec(*w, 1, t, replies);
    EXPECT_TRUE(s.prompt_ids.empty());
    EXPECT_TRUE(s.prompt_text.empty());
    EXPECT_EQ(s.max_tokens, c.max_tokens[t]);
    ASSERT_EQ(s.messages.size(), static_cast<size_t>(2 + 2 * t));
    EXPECT_EQ(s.messages[0].role, "system");
    EXPECT_EQ(s.messages[0].content, w->system_prompt);
    for (int i = 0; i < t; ++i) {
      EXPECT_EQ(s.messages[1 + 2 * i].role, "user");
      EXPECT_EQ(s.messages[1 + 2 * i].content, c.user_messages[i]);
      EXPECT_EQ(s.messages[2 + 2 * i].role, "assistant");
      EXPECT_EQ(s.messages[2 + 2 * i].content, replies[i]);
    }
    EXPECT_EQ(s.messages.back().role, "user");
    EXPECT_EQ(s.messages.back().content, c.user_messages[t]);
    // The previous turn's messages are this turn's prefix, then its reply.
    for (size_t i = 0; i < previous.size(); ++i) {
      EXPECT_EQ(s.messages[i].role, previous[i].role);
      EXPECT_EQ(s.messages[i].content, previous[i].content);
    }
    if (t > 0) EXPECT_EQ(s.messages[previous.size()].content, replies[t - 1]);
    previous = s.messages;
  }
  // Another conversation shares the system message only.
  const RequestSpec other = ChatTurnSpec(*w, 0, 1, replies);
  EXPECT_EQ(other.messages[0].content, w->system_prompt);
  EXPECT_NE(other.messages[1].content, c.user_messages[0]);
}

// Answers every request on its own thread after a short delay with the reply
// "reply <conversation>.<turn>"; fails the requests listed in `fail`.
class FakeChatTarget : public Target {
 public:
  void Send(const RequestSpec& spec, RequestRecord r, Clock::time_point epoch, Done done) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      sent.push_back({r.conversation, r.turn, r.warmup, spec.messages});
      ++in_flight_[r.conversation];
      EXPECT_EQ(in_flight_[r.conversation], 1) << "two turns of one conversation in flight";
    }
    threads_.emplace_back([this, r = std::move(r), epoch, done = std::move(done)]() mutable {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      r.send_s = 0;
      r.end_s = SecondsSince(epoch, Clock::now());
      const bool failed = fail.count({r.conversation, r.turn}) > 0;
      r.ok = !failed;
      if (failed) r.failure = "INTERNAL";
      r.output_text = absl::StrCat("reply ", r.conversation, ".", r.turn);
      r.usage_prompt_tokens = 100 + 10 * r.turn;
      r.usage_cached_tokens = r.turn == 0 ? 64 : 96;
      {
        std::lock_guard<std::mutex> lock(mu_);
        --in_flight_[r.conversation];
      }
      done(std::move(r));
    });
  }
  void CancelAll() override {}
  std::string Describe() const override { return "fake"; }
  ~FakeChatTarget() override {
    for (std::thread& t : threads_) t.join();
  }

  struct Sent {
    int conversation, turn;
    bool warmup;
    std::vector<ChatMessage> messages;
  };
  std::vector<Sent> sent;
  std::set<std::pair<int, int>> fail;

 private:
  std::mutex mu_;
  std::map<int, int> in_flight_;
  std::vector<std::thread> threads_;
};

TEST(ChatRunnerTest, TurnsFollowEachOtherWithTheReplies) {
  auto w = MakeChatWorkload(Small(6, 3));
  ASSERT_TRUE(w.ok());
  FakeChatTarget target;
  target.fail = {{4, 1}};  // conversation 4 ends at its second turn
  RunOptions o;
  o.warmup = 2;
  o.request_rate = 200;
  o.max_concurrency = 3;
  auto result = RunChat(target, *w, o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->hit_duration);
  EXPECT_EQ(result->not_sent, 1) << "conversation 4's third turn";
  // 2 warm-up conversations x 3 turns, then 4 measured: 3 + 3 + 2 + 3 turns.
  EXPECT_EQ(result->records.size(), 6u + 11u);
  EXPECT_EQ(target.sent.size(), 17u);
  std::map<int, int> next_turn;
  for (size_t i = 0; i < target.sent.size(); ++i) {
    const auto& s = target.sent[i];
    EXPECT_EQ(s.warmup, s.conversation < 2);
    if (i < 6) EXPECT_LT(s.conversation, 2) << "warm-up conversations run first";
    EXPECT_EQ(s.turn, next_turn[s.conversation]++) << "turns in order";
    ASSERT_EQ(s.messages.size(), static_cast<size_t>(2 + 2 * s.turn));
    for (int k = 0; k < s.turn; ++k) {
      EXPECT_EQ(s.messages[2 + 2 * k].content, absl::StrCat("reply ", s.conversation, ".", k));
    }
  }
  EXPECT_EQ(next_turn[4], 2);
  for (const RequestRecord& r : result->records) {
    EXPECT_TRUE(r.output_text.empty()) << "replies are not kept in the records";
    EXPECT_GE(r.turn, 0);
    EXPECT_EQ(r.warmup, r.conversation < 2);
  }

  // The report: measured and completed only (10 of the 11 measured turns).
  const nlohmann::json pc = PromptCacheJson(result->records);
  EXPECT_EQ(pc["requests_with_usage"], 10);
  // 4 turn-0 (100, 64 cached), 4 turn-1 minus the failed one (3 x 110, 96), 3 turn-2 (120, 96).
  EXPECT_EQ(pc["prompt_tokens"], 4 * 100 + 3 * 110 + 3 * 120);
  EXPECT_EQ(pc["cached_tokens"], 4 * 64 + 6 * 96);
  EXPECT_EQ(pc["computed_prompt_tokens"], 4 * 100 + 3 * 110 + 3 * 120 - (4 * 64 + 6 * 96));
  const nlohmann::json turns = ChatTurnsJson(result->records);
  ASSERT_EQ(turns.size(), 3u);
  EXPECT_EQ(turns[1]["turn"], 1);
  EXPECT_EQ(turns[1]["completed"], 3);
  EXPECT_EQ(turns[1]["failed"], 1);
  EXPECT_EQ(turns[2]["mean_cached_tokens"], 96.0);
  EXPECT_EQ(turns[0]["ttft_ms"]["count"], 4);
}

TEST(ChatRunnerTest, DurationCutsTheRun) {
  auto w = MakeChatWorkload(Small(50, 3));
  ASSERT_TRUE(w.ok());
  FakeChatTarget target;
  RunOptions o;
  o.request_rate = 20;  // 50 conversations would take ~2.5 s
  o.duration_s = 0.3;
  auto result = RunChat(target, *w, o);
  ASSERT_TRUE(result.ok());
  EXPECT_TRUE(result->hit_duration);
  EXPECT_GT(result->not_sent, 0);
  EXPECT_LT(result->wall_s, 2.0);
  EXPECT_EQ(static_cast<int>(result->records.size()) + result->not_sent, 150);
}

// Over HTTP: the chat messages go out as they are; the usage chunk's
// prompt_tokens_details.cached_tokens and (when collected) the text come back.
TEST(ChatRunnerTest, OpenAiChatBodyUsageAndText) {
  Url url;
  url.host = "127.0.0.1";
  url.port = "1";
  url.target = "/v1/chat/completions";
  SendOptions so;
  so.collect_text = true;
  HttpTarget target(url, "m", "", so);
  RequestSpec spec;
  spec.messages = {{"system", "s"}, {"user", "u"}, {"assistant", "a"}, {"user", "v"}};
  spec.max_tokens = 5;
  const nlohmann::json body = nlohmann::json::parse(target.Body(spec));
  ASSERT_EQ(body["messages"].size(), 4u);
  EXPECT_EQ(body["messages"][2]["role"], "assistant");
  EXPECT_EQ(body["messages"][2]["content"], "a");
  EXPECT_EQ(body["max_tokens"], 5);

  RequestRecord r;
  bool done = false;
  ApplyOpenAiEvent(R"({"choices":[{"delta":{"content":"Hel"},"finish_reason":null}]})", true, 0.1,
                   &r, &done, true);
  ApplyOpenAiEvent(R"({"choices":[{"delta":{"content":"lo"},"finish_reason":"length"}]})", true,
                   0.2, &r, &done, true);
  ApplyOpenAiEvent(
      R"({"choices":[],"usage":{"prompt_tokens":80,"completion_tokens":2,"total_tokens":82,)"
      R"("prompt_tokens_details":{"cached_tokens":64}}})",
      true, 0.3, &r, &done, true);
  EXPECT_EQ(r.output_text, "Hello");
  EXPECT_EQ(r.usage_prompt_tokens, 80);
  EXPECT_EQ(r.usage_cached_tokens, 64);
  RequestRecord plain;
  ApplyOpenAiEvent(R"({"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":2}})", true, 0.3,
                   &plain, &done);
  EXPECT_EQ(plain.usage_cached_tokens, -1) << "not reported";
  EXPECT_TRUE(plain.output_text.empty());
}

TEST(ChatRunnerTest, Flags) {
  auto o = ParseLoadTestOptions({"--grpc", "127.0.0.1:1", "--workload", "chat", "--conversations",
                                 "5", "--turns", "3", "--system-prompt-words", "100",
                                 "--user-words", "uniform:4:8", "--output-len", "12"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->is_chat());
  EXPECT_EQ(o->chat.conversations, 5);
  EXPECT_EQ(o->chat.turns, 3);
  EXPECT_EQ(o->chat.system_prompt_words, 100);
  EXPECT_EQ(o->chat.user_words.Describe(), "uniform:4:8");
  EXPECT_EQ(o->chat.output_len.Describe(), "fixed:12");
  EXPECT_EQ(o->num_requests, 15);
  EXPECT_TRUE(o->send.collect_text);
  EXPECT_EQ(ConfigJson(*o)["turns"], 3);
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--grpc", "127.0.0.1:1", "--turns", "3"}, "--turns: only with --workload chat"},
      {{"--grpc", "127.0.0.1:1", "--workload", "chat", "--num-requests", "3"}, "--num-requests"},
      {{"--grpc", "127.0.0.1:1", "--workload", "chat", "--turns", "0"}, "--turns"},
      {{"--grpc", "127.0.0.1:1", "--workload", "chats"}, "--workload chats"}};
  for (const auto& [args, needle] : bad) {
    EXPECT_TRUE(testing::ErrorHas(ParseLoadTestOptions(args).status(), {needle})) << needle;
  }
}

}  // namespace
}  // namespace morserve::loadtest
