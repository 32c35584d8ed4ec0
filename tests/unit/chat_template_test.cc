// ChatTemplate over tokenizer_config.json, and parity with an independent implementation:
// tests/chat_template/render.mjs renders a set of conversations with the real chat templates
// of Llama 3, Llama 3.1 Instruct, Llama 2 (chat), Gemma 3 and Qwen 3 using @huggingface/jinja; the
// ChatTemplateParity tests render the same here and require identical text, or an error
// where the reference raised one. ctest runs them with MORSERVE_CHAT_TEMPLATE_REFERENCE set
// (tests/chat_template/CMakeLists.txt); run alone without it they skip.
#include "engine/tokenizer/chat_template.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace morserve {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// ---------------------------------------------------------------- ChatTemplate

TEST(ChatTemplate, RendersWithSpecialTokensFromConfig) {
  const json config = {
      {"chat_template",
       "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% "
       "endfor %}"
       "{% if add_generation_prompt %}<assistant>{% endif %}"},
      {"bos_token", "<s>"},
      {"eos_token", {{"__type", "AddedToken"}, {"content", "</s>"}, {"lstrip", false}}},
      {"pad_token", nullptr}};
  absl::StatusOr<ChatTemplate> ct = ChatTemplate::FromTokenizerConfig(config);
  ASSERT_TRUE(ct.ok()) << ct.status();
  const json messages = json::array({{{"role", "user"}, {"content", "hi"}}});
  absl::StatusOr<std::string> out = ct->Render(messages, true);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "<s><user>hi</s><assistant>");
  out = ct->Render(messages, false, {{"bos_token", "[B]"}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "[B]<user>hi</s>");
  EXPECT_FALSE(ct->special_tokens().contains("pad_token"));
}

TEST(ChatTemplate, ToolsAndDocumentsDefaultToNone) {
  absl::StatusOr<ChatTemplate> ct = ChatTemplate::FromTokenizerConfig(
      {{"chat_template",
        "{{ tools is none }}{{ documents is none }}{{ tools is defined }}{{ x|default('-') }}"}});
  ASSERT_TRUE(ct.ok()) << ct.status();
  absl::StatusOr<std::string> out = ct->Render(json::array(), false);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "TrueTrueTrue-");
  out = ct->Render(json::array(), false, {{"x", 5}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "TrueTrueTrue5");
}

TEST(ChatTemplate, NamedTemplatesPickToolUseWhenToolsAreGiven) {
  const json config = {
      {"chat_template",
       json::array({{{"name", "default"}, {"template", "plain"}},
                    {{"name", "tool_use"}, {"template", "tools:{{ tools|length }}"}}})}};
  absl::StatusOr<ChatTemplate> ct = ChatTemplate::FromTokenizerConfig(config);
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_EQ(*ct->Render(json::array(), false), "plain");
  EXPECT_EQ(*ct->Render(json::array(), false, {{"tools", json::array({1, 2})}}), "tools:2");

  absl::StatusOr<ChatTemplate> only_tools = ChatTemplate::FromTokenizerConfig(
      {{"chat_template", json::array({{{"name", "tool_use"}, {"template", "t"}}})}});
  ASSERT_TRUE(only_tools.ok());
  absl::StatusOr<std::string> out = only_tools->Render(json::array(), false);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kNotFound);
}

TEST(ChatTemplate, KeyOrderIsKeptWithOrderedJson) {
  absl::StatusOr<ChatTemplate> ct =
      ChatTemplate::FromTokenizerConfig({{"chat_template", "{{ tools|tojson }}"}});
  ASSERT_TRUE(ct.ok());
  ordered_json extra =
      ordered_json::parse(R"({"tools": [{"name": "f", "description": "d", "args": 1.0}]})");
  absl::StatusOr<std::string> out = ct->Render(ordered_json::array(), false, extra);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, R"([{"name": "f", "description": "d", "args": 1.0}])");
}

TEST(ChatTemplate, LoadErrorsAreClear) {
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig({{"bos_token", "<s>"}}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig({{"chat_template", nullptr}}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig({{"chat_template", 5}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status bad =
      ChatTemplate::FromTokenizerConfig({{"chat_template", "ok\n{% for m in messages %}"}})
          .status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.message()).find("line 2"), std::string::npos) << bad;
  absl::Status unsupported =
      ChatTemplate::FromTokenizerConfig({{"chat_template", "{{ x|pprint }}"}}).status();
  EXPECT_EQ(unsupported.code(), absl::StatusCode::kUnimplemented) << unsupported;
  EXPECT_EQ(
      ChatTemplate::FromTokenizerConfig({{"chat_template", "x"}, {"bos_token", 3}}).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplate, RenderErrorsAreClear) {
  absl::StatusOr<ChatTemplate> ct = ChatTemplate::FromString(
      "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif "
      "%}ok");
  ASSERT_TRUE(ct.ok());
  absl::StatusOr<std::string> out =
      ct->Render(json::array({{{"role", "assistant"}, {"content", "x"}}}), false);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(out.status().message()).find("first must be user"), std::string::npos);
  EXPECT_EQ(ct->Render(json::object(), false).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplate, StrftimeNowFollowsTheClock) {
  absl::StatusOr<ChatTemplate> ct =
      ChatTemplate::FromString("Today Date: {{ strftime_now('%d %b %Y') }}");
  ASSERT_TRUE(ct.ok());
  ct->set_clock([] {
    std::tm tm{};
    tm.tm_year = 124;
    tm.tm_mon = 0;
    tm.tm_mday = 2;
    return tm;
  });
  EXPECT_EQ(*ct->Render(json::array(), true), "Today Date: 02 Jan 2024");
}

// ---------------------------------------------------------------- parity with the reference

class ChatTemplateParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* path = std::getenv("MORSERVE_CHAT_TEMPLATE_REFERENCE");
    if (path == nullptr) return;
    std::ifstream in(path);
    if (!in) {
      load_error_ = std::string("cannot read ") + path;
      return;
    }
    std::stringstream buf;
    buf << in.rdbuf();
    reference_ = new ordered_json(ordered_json::parse(buf.str(), nullptr, false));
    if (reference_->is_discarded()) load_error_ = std::string("bad JSON in ") + path;
  }

  void SetUp() override {
    if (std::getenv("MORSERVE_CHAT_TEMPLATE_REFERENCE") == nullptr) {
      GTEST_SKIP() << "MORSERVE_CHAT_TEMPLATE_REFERENCE not set (ctest sets it)";
    }
    ASSERT_TRUE(load_error_.empty()) << load_error_;
  }

  static const ordered_json& Model(const std::string& name) {
    for (const ordered_json& m : (*reference_)["models"]) {
      if (m["name"] == name) return m;
    }
    static const ordered_json kNone;
    return kNone;
  }

  // Renders every case of `name` and compares with the reference; returns the count compared.
  static int CheckModel(const std::string& name) {
    const ordered_json& model = Model(name);
    EXPECT_TRUE(model.is_object()) << "no model " << name << " in the reference";
    if (!model.is_object()) return 0;
    absl::StatusOr<ChatTemplate> ct =
        ChatTemplate::FromTokenizerConfig(json(model["tokenizer_config"]));
    EXPECT_TRUE(ct.ok()) << name << ": " << ct.status();
    if (!ct.ok()) return 0;
    int compared = 0;
    for (const ordered_json& c : model["cases"]) {
      SCOPED_TRACE(name + " / " + c["name"].get<std::string>());
      absl::StatusOr<std::string> out =
          ct->Render(c["messages"], c["add_generation_prompt"].get<bool>(), c["extra"]);
      if (c.contains("error")) {
        EXPECT_FALSE(out.ok()) << "reference failed with: " << c["error"] << "\nwe rendered:\n"
                               << *out;
        const std::string ref_error = c["error"];
        if (!out.ok() && c.value("raised", false)) {
          EXPECT_NE(std::string(out.status().message()).find(ref_error), std::string::npos)
              << out.status();
        }
      } else {
        EXPECT_TRUE(out.ok()) << out.status();
        if (out.ok()) EXPECT_EQ(*out, c["output"].get<std::string>());
      }
      ++compared;
    }
    return compared;
  }

  static ordered_json* reference_;
  static std::string load_error_;
};

ordered_json* ChatTemplateParity::reference_ = nullptr;
std::string ChatTemplateParity::load_error_;

TEST_F(ChatTemplateParity, Llama3) { EXPECT_GE(CheckModel("llama3"), 15); }
TEST_F(ChatTemplateParity, Llama31Instruct) { EXPECT_GE(CheckModel("llama3.1"), 20); }
TEST_F(ChatTemplateParity, Llama2Chat) { EXPECT_GE(CheckModel("llama2-chat"), 15); }
TEST_F(ChatTemplateParity, Gemma3) { EXPECT_GE(CheckModel("gemma3"), 15); }
TEST_F(ChatTemplateParity, Qwen3) { EXPECT_GE(CheckModel("qwen3"), 20); }

TEST_F(ChatTemplateParity, Llama2BaseConfigHasNoTemplate) {
  const ordered_json& model = Model("llama2");
  ASSERT_TRUE(model.is_object());
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig(json(model["tokenizer_config"])).status().code(),
            absl::StatusCode::kNotFound);
}

// Every prefix of each real template either fails to parse with a message or renders (to
// text or an error); none may crash.
TEST_F(ChatTemplateParity, TruncatedRealTemplatesFailCleanly) {
  for (const ordered_json& model : (*reference_)["models"]) {
    const ordered_json& config = model["tokenizer_config"];
    if (!config["chat_template"].is_string() || model["cases"].empty()) continue;
    const std::string full = config["chat_template"];
    const ordered_json& c = model["cases"][0];
    int failures = 0;
    for (size_t n = 0; n < full.size(); n += 1 + n / 400) {
      json truncated = json(config);
      truncated["chat_template"] = full.substr(0, n);
      absl::StatusOr<ChatTemplate> ct = ChatTemplate::FromTokenizerConfig(truncated);
      if (!ct.ok()) {
        ++failures;
        EXPECT_FALSE(ct.status().message().empty());
        continue;
      }
      (void)ct->Render(c["messages"], true, c["extra"]);
    }
    EXPECT_GT(failures, 0) << model["name"];
  }
}

}  // namespace
}  // namespace morserve
