// Prefix caching through the OpenAI gateway with curl: the real `morserve serve` (prefix
// cache on, a tiny vanilla model on a `morserve mktokenizer` tokenizer with a plain chat
// template: no npm) behind the real `morserve-gateway`, both on 127.0.0.1 port 0. Every
// usage carries prompt_tokens_details.cached_tokens (OpenAI's shape): 0 for a new prompt,
// > 0 for a chat's second turn that resends the first turn and its reply, in the
// non-streaming response and in the streamed usage chunk (stream_options.include_usage).
// cache_salt (vLLM's) is passed through on both endpoints: only the same salt shares cached
// blocks; a salt that is not a non-empty string is a 400 naming the field.
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tests/gateway/gateway_process.h"
#include "tests/server/served_suite.h"
#include "tests/server/test_models.h"

namespace morserve::testing {
namespace {

using nlohmann::json;

// A system prompt of many blocks from the tokenizer's corpus words, distinct by `tag`.
std::string LongText(const std::string& tag) {
  static const char* kWords[] = {"the",    "gateway", "server",  "model", "request",
                                 "stream", "tokens",  "cache",   "block", "prompt",
                                 "engine", "batch",   "metrics", "loop",  "depth"};
  std::string out = tag + ":";
  uint32_t x = 2166136261u;
  for (char c : tag) x = (x ^ static_cast<uint8_t>(c)) * 16777619u;
  for (int i = 0; i < 90; ++i) {
    x = x * 1664525u + 1013904223u;
    absl::StrAppend(&out, " ", kWords[(x >> 16) % 15]);
  }
  return out + ".";
}

class GatewayPrefixCacheTest : public ServedSuite<GatewayPrefixCacheTest, GatewayStack> {
 protected:
  static void SetUpTestSuite() {
    StartSuite("vanilla", [](TinyModelSpec* spec, const TempDir&) { spec->max_pos = 512; });
  }
  static HttpResult Post(const std::string& path, const json& body) {
    return served_->Post(path, body);
  }
  static json ChatBody(const json& messages) {
    return {{"messages", messages}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true}};
  }
  // usage.prompt_tokens_details.cached_tokens of a 200 response (-1 when missing).
  static int Cached(const json& usage) {
    if (!usage.is_object() || !usage.contains("prompt_tokens_details")) return -1;
    const json& d = usage["prompt_tokens_details"];
    if (!d.is_object() || !d.contains("cached_tokens") || !d["cached_tokens"].is_number_integer())
      return -1;
    return d["cached_tokens"].get<int>();
  }
  static json UsageOf(const HttpResult& r) {
    EXPECT_EQ(r.status, 200) << r.body;
    return r.Json().is_object() ? r.Json().value("usage", json()) : json();
  }
  static void ExpectSaltError(const HttpResult& got) {
    EXPECT_EQ(got.status, 400) << got.body;
    const json j = got.Json();
    ASSERT_TRUE(j.is_object() && j.contains("error")) << got.body;
    EXPECT_EQ(j["error"]["param"], "cache_salt") << got.body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << got.body;
  }
};

TEST_F(GatewayPrefixCacheTest, SecondChatTurnReportsCachedTokens) {
  const json turn1 = {{{"role", "system"}, {"content", LongText("chat")}},
                      {{"role", "user"}, {"content", "describe the gateway"}}};
  const HttpResult one = Post("/v1/chat/completions", ChatBody(turn1));
  const json u1 = UsageOf(one);
  EXPECT_EQ(Cached(u1), 0) << u1.dump();
  json turn2 = turn1;
  turn2.push_back(
      {{"role", "assistant"}, {"content", one.Json()["choices"][0]["message"]["content"]}});
  turn2.push_back({{"role", "user"}, {"content", "and the server"}});
  const json u2 = UsageOf(Post("/v1/chat/completions", ChatBody(turn2)));
  EXPECT_GT(Cached(u2), 0) << u2.dump();
  EXPECT_LT(Cached(u2), u2.value("prompt_tokens", 0)) << u2.dump();
  EXPECT_GE(Cached(u2), u1.value("prompt_tokens", 0) / 2) << "most of the first turn is reused";

  // Streamed with include_usage: the usage chunk carries it too.
  json body = ChatBody(turn2);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  const HttpResult streamed = Post("/v1/chat/completions", body);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  const std::vector<std::string> data = SseData(streamed.body);
  ASSERT_GE(data.size(), 2u);
  ASSERT_EQ(data.back(), "[DONE]");
  const json usage_chunk = json::parse(data[data.size() - 2]);
  EXPECT_TRUE(usage_chunk["choices"].empty()) << usage_chunk.dump();
  EXPECT_GE(Cached(usage_chunk["usage"]), Cached(u2)) << usage_chunk.dump();
}

TEST_F(GatewayPrefixCacheTest, CacheSaltSeparatesCompletions) {
  const std::string prompt = LongText("salt");
  auto cached = [&](const json& salt) {
    json body = {{"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0}, {"ignore_eos", true}};
    if (!salt.is_null()) body["cache_salt"] = salt;
    return Cached(UsageOf(Post("/v1/completions", body)));
  };
  EXPECT_EQ(cached("a"), 0);
  EXPECT_GT(cached("a"), 0) << "the same salt shares";
  EXPECT_EQ(cached("b"), 0) << "another salt does not";
  EXPECT_EQ(cached(json()), 0) << "nor does none";
  EXPECT_GT(cached(json()), 0) << "the default namespace's own blocks";
  // Chat passes it through too.
  const json m = {{{"role", "system"}, {"content", LongText("chat-salt")}},
                  {{"role", "user"}, {"content", "hi"}}};
  json body = ChatBody(m);
  body["cache_salt"] = "x";
  EXPECT_EQ(Cached(UsageOf(Post("/v1/chat/completions", body))), 0);
  EXPECT_GT(Cached(UsageOf(Post("/v1/chat/completions", body))), 0);
  body["cache_salt"] = "y";
  EXPECT_EQ(Cached(UsageOf(Post("/v1/chat/completions", body))), 0);
}

TEST_F(GatewayPrefixCacheTest, BadCacheSaltIsA400NamingIt) {
  for (const json& bad : {json(5), json(""), json::array({"a"}), json::object(), json(true)}) {
    SCOPED_TRACE(bad.dump());
    ExpectSaltError(Post("/v1/completions", {{"prompt", "x"}, {"cache_salt", bad}}));
    json chat = ChatBody(json::array({{{"role", "user"}, {"content", "x"}}}));
    chat["cache_salt"] = bad;
    ExpectSaltError(Post("/v1/chat/completions", chat));
  }
}

}  // namespace
}  // namespace morserve::testing
