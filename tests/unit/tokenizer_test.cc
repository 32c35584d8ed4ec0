// Tokenizer unit tests that need no downloads: WHATWG UTF-8 repair, clear load errors for
// malformed tokenizer.json, hand-checked encodes/decodes of two tiny tokenizers (byte-level and
// SentencePiece-style), and the streaming detokenizer's invariant -- concatenated deltas equal
// Decode(all ids), every delta whole UTF-8 -- over thousands of random id sequences.
#include "engine/tokenizer/tokenizer.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "engine/tokenizer/bpe.h"
#include "engine/tokenizer/incremental_detokenizer.h"
#include "engine/tokenizer/js_regex.h"
#include "engine/tokenizer/normalizer.h"
#include "engine/tokenizer/utf8.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace morserve {
namespace {

using nlohmann::json;

std::string Cp(char32_t c) {
  std::string s;
  AppendUtf8(c, &s);
  return s;
}
const std::string kFffd = Cp(0xFFFD);

TEST(Utf8, SanitizeReplacesMaximalSubpartsLikeTextDecoder) {
  EXPECT_EQ(SanitizeUtf8("abc"), "abc");
  EXPECT_EQ(SanitizeUtf8("a\x80z"), "a" + kFffd + "z");
  EXPECT_EQ(SanitizeUtf8("x\xE2\x82y"), "x" + kFffd + "y");        // one subpart
  EXPECT_EQ(SanitizeUtf8("\xC0\xAF"), kFffd + kFffd);              // overlong: two
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80"), kFffd + kFffd + kFffd);  // surrogate: three
  EXPECT_EQ(SanitizeUtf8("\xF0\x9F\x98"), kFffd);                  // truncated at end
  EXPECT_EQ(SanitizeUtf8("\xF0\x9F\x98\x80"), Cp(0x1F600));
}

TEST(Utf8, StreamingDecoderEqualsWholeForEverySplit) {
  const std::string bytes = "a\xE4\xBD\xA0\xE5\xA5 \xFF\xF0\x9F\x98\x80\xED\xA0\x80z\xC3";
  const std::string whole = SanitizeUtf8(bytes);
  for (size_t split = 0; split <= bytes.size(); ++split) {
    Utf8StreamDecoder d;
    std::string out;
    d.Feed(std::string_view(bytes).substr(0, split), &out);
    EXPECT_TRUE(IsValidUtf8(out));
    d.Feed(std::string_view(bytes).substr(split), &out);
    d.Finish(&out);
    EXPECT_EQ(out, whole) << "split at " << split;
  }
}

TEST(JsRegex, TranslatesJavaScriptClassesAndCaseGroup) {
  absl::StatusOr<std::string> t = TranslateJsRegex("(?i:'s|'t|'re|'ve|'m|'ll|'d)|\\s+(?!\\S)");
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(absl::StrContains(*t, "[sS]"));
  EXPECT_TRUE(absl::StrContains(*t, "\\x{FEFF}"));
  auto re = JsRegex::Compile("\\s+");
  ASSERT_TRUE(re.ok());
  // JavaScript's \s includes U+FEFF and excludes U+0085.
  std::vector<std::string> matches;
  std::string text = "a" + Cp(0xFEFF) + "b" + Cp(0x85) + "c";
  (*re)->ForEachMatch(text, [&](size_t s, size_t e) { matches.push_back(text.substr(s, e - s)); });
  ASSERT_EQ(matches.size(), 1u);
  EXPECT_EQ(matches[0], Cp(0xFEFF));
  EXPECT_FALSE(JsRegex::Compile("(unclosed").ok());
}

TEST(Normalizer, UnicodeFormsUseIcu) {
  auto make = [](const char* type) {
    absl::StatusOr<std::unique_ptr<Normalizer>> n = Normalizer::FromJson({{"type", type}});
    EXPECT_TRUE(n.ok()) << n.status();
    return *std::move(n);
  };
  const std::string composed = "caf\xC3\xA9", decomposed = "cafe\xCC\x81";
  EXPECT_EQ(make("NFC")->Normalize(decomposed), composed);
  EXPECT_EQ(make("NFC")->Normalize(composed), composed);
  EXPECT_EQ(make("NFD")->Normalize(composed), decomposed);
  EXPECT_EQ(make("NFKC")->Normalize("\xEF\xAC\x81 x\xC2\xB2"), "fi x2");  // ligature, superscript
  EXPECT_EQ(make("NFKD")->Normalize("\xC2\xA0"), " ");
  auto seq = Normalizer::FromJson(
      {{"type", "Sequence"},
       {"normalizers",
        json::array({{{"type", "Prepend"}, {"prepend", "_"}},
                     {{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", "-"}}})}});
  ASSERT_TRUE(seq.ok());
  EXPECT_EQ((*seq)->Normalize("a  b\tc"), "_a-b-c");
}

// A byte-level tokenizer: one token per byte, a few merges, one special token.
json ByteLevelJson() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[Cp(ByteToUnicode(static_cast<unsigned char>(b)))] = b;
  const std::string g = Cp(ByteToUnicode(' '));  // "Ġ"
  vocab[g + "s"] = 256;
  vocab["'s"] = 257;
  vocab["n'"] = 258;
  vocab["n't"] = 259;
  return {
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", json::array({g + " s", "' s", "n '", "n' t"})}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array(
             {{{"type", "Split"},
               {"pattern",
                {{"Regex", "(?i:'s|'t|'re|'ve|'m|'ll|'d)| ?\\p{L}+|\\s+|[^\\s\\p{L}]+"}}},
               {"behavior", "Isolated"},
               {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"post_processor", {{"type", "ByteLevel"}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens", json::array({{{"id", 260}, {"content", "<|end|>"}, {"special", true}}})},
  };
}

// A SentencePiece-style tokenizer: byte fallback, Llama 2's normalizer and decoder chain.
json SentencePieceJson() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) vocab[absl::StrFormat("<0x%02X>", b)] = 3 + b;
  const std::string m = "\xE2\x96\x81";  // ▁
  vocab[m] = 259;
  vocab["a"] = 260;
  vocab["b"] = 261;
  vocab[m + "a"] = 262;
  vocab["\xC3\xA9"] = 263;  // é
  return {
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", json::array({json::array({m, "a"})})},
        {"unk_token", "<unk>"},
        {"byte_fallback", true},
        {"fuse_unk", true}}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         json::array({{{"type", "Prepend"}, {"prepend", m}},
                      {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", m}}})}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         json::array({{{"type", "Replace"}, {"pattern", {{"String", m}}}, {"content", " "}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}},
                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"added_tokens", json::array({{{"id", 0}, {"content", "<unk>"}, {"special", true}},
                                    {{"id", 1}, {"content", "<s>"}, {"special", true}},
                                    {{"id", 2}, {"content", "</s>"}, {"special", true}}})},
  };
}

std::unique_ptr<Tokenizer> Load(const json& tj, const json& config) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromJson(tj, config);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

TEST(Tokenizer, ByteLevelEncodeDecode) {
  auto tok =
      Load(ByteLevelJson(), {{"clean_up_tokenization_spaces", false}, {"eos_token", "<|end|>"}});
  ASSERT_NE(tok, nullptr);
  // "it's" -> "it" (two bytes), "'s" merged; " s" merged to "Ġs"; the special token is cut out.
  EXPECT_EQ(tok->Encode("it's s<|end|>", true), (std::vector<int>{'i', 't', 257, 256, 260}));
  EXPECT_EQ(tok->Decode({'i', 't', 257, 256, 260}, false), "it's s<|end|>");
  EXPECT_EQ(tok->Decode({'i', 't', 257, 256, 260}, true), "it's s");
  EXPECT_EQ(tok->eos_token_ids(), std::vector<int>{260});
  EXPECT_TRUE(tok->IsSpecial(260));
  EXPECT_FALSE(tok->IsSpecial(257));
  EXPECT_EQ(tok->IdToToken(256), Cp(ByteToUnicode(' ')) + "s");
  // Invalid UTF-8 is repaired before tokenizing; bytes of U+FFFD come back.
  EXPECT_EQ(tok->Decode(tok->Encode("a\xFF", false), false), "a" + kFffd);
  // A character split across byte tokens decodes whole; a lone lead byte becomes U+FFFD.
  EXPECT_EQ(tok->Decode({0xC3, 0xA9}, false), "\xC3\xA9");
  EXPECT_EQ(tok->Decode({0xC3, 'x'}, false), kFffd + "x");
}

TEST(Tokenizer, SentencePieceEncodeDecode) {
  auto tok =
      Load(SentencePieceJson(),
           {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"clean_up_tokenization_spaces", false}});
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_token_id(), 1);
  EXPECT_EQ(tok->bos_token(), "<s>");
  // "a bé" -> "▁a▁bé": ▁a merges, ▁ alone, b, é; "z" is not in the vocabulary -> <0x7A>.
  EXPECT_EQ(tok->Encode("a bé", true), (std::vector<int>{1, 262, 259, 261, 263}));
  EXPECT_EQ(tok->Encode("a bé", false), (std::vector<int>{262, 259, 261, 263}));
  EXPECT_EQ(tok->Encode("z", false), (std::vector<int>{259, 3 + 'z'}));
  EXPECT_EQ(tok->Decode({1, 262, 259, 261, 263}, false), "<s> a bé");
  EXPECT_EQ(tok->Decode({1, 262, 259, 261, 263}, true), "a bé");  // leading space stripped
  // Byte fallback across tokens: é as <0xC3><0xA9>; a BOM at the start of a byte run drops.
  EXPECT_EQ(tok->Decode({3 + 0xC3, 3 + 0xA9}, false), "\xC3\xA9");
  EXPECT_EQ(tok->Decode({3 + 0xEF, 3 + 0xBB, 3 + 0xBF, 260}, false), "a");
  EXPECT_EQ(tok->Decode({3 + 0xC3, 260}, false), kFffd + "a");
}

TEST(Tokenizer, AddedTokenFlagsFollowHuggingFace) {
  json tj = SentencePieceJson();
  // single_word "ab" (id 264): only between non-word characters. normalized "a b" (id 265):
  // matched after the normalizer turned it into "▁a▁b". lstrip/rstrip "<x>" (id 266).
  tj["model"]["vocab"]["ab"] = 264;
  tj["model"]["vocab"]["a b"] = 265;
  tj["model"]["vocab"]["<x>"] = 266;
  tj["added_tokens"].push_back({{"id", 264}, {"content", "ab"}, {"single_word", true}});
  tj["added_tokens"].push_back({{"id", 265}, {"content", "a b"}, {"normalized", true}});
  tj["added_tokens"].push_back(
      {{"id", 266}, {"content", "<x>"}, {"lstrip", true}, {"rstrip", true}});
  auto tok = Load(tj, json::object());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode("ab", false), (std::vector<int>{264}));
  EXPECT_EQ(tok->Encode("(ab)", false), (std::vector<int>{259, 3 + '(', 264, 259, 3 + ')'}));
  // Inside a word "ab" is not the added token: "▁abb" -> ▁a, b, b.
  EXPECT_EQ(tok->Encode("abb", false), (std::vector<int>{262, 261, 261}));
  // The normalized token matches in "▁a▁b" (the normalized span), whole.
  EXPECT_EQ(tok->Encode("b a b", false), (std::vector<int>{259, 261, 265}));
  // Whitespace around an lstrip/rstrip token disappears.
  EXPECT_EQ(tok->Encode("a  <x>  b", false), (std::vector<int>{262, 266, 259, 261}));
}

TEST(Tokenizer, SmolLmStyleDigitsThenByteLevelRegex) {
  json tj = ByteLevelJson();
  tj["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Digits"}, {"individual_digits", true}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}})}};
  auto tok = Load(tj, {{"clean_up_tokenization_spaces", false}});
  ASSERT_NE(tok, nullptr);
  // Digits split "x 42s" into "x ", "4", "2", "s"; GPT-2's regex then splits "x " into "x", " ".
  EXPECT_EQ(tok->Encode("x 42s", false), (std::vector<int>{'x', ' ', '4', '2', 's'}));
  EXPECT_EQ(tok->Encode("it's", false), (std::vector<int>{'i', 't', 257}));
}

TEST(Tokenizer, CleanUpTokenizationSpaces) {
  auto tok = Load(ByteLevelJson(), json::object());  // clean_up defaults to true
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Decode(tok->Encode("a . b ' s do n't it 's", false), false), "a. b's don't it's");
}

TEST(Tokenizer, MalformedFilesFailAtLoadWithClearErrors) {
  struct Case {
    std::string what;
    std::function<void(json&)> edit;
    std::string message;
  };
  std::vector<Case> cases = {
      {"no model", [](json& j) { j.erase("model"); }, "missing 'model'"},
      {"vocab not object", [](json& j) { j["model"]["vocab"] = json::array(); }, "vocab"},
      {"bad vocab id", [](json& j) { j["model"]["vocab"]["a"] = "x"; }, "not a valid id"},
      {"merge of unknown token", [](json& j) { j["model"]["merges"].push_back("zz qq"); },
       "not in vocab"},
      {"malformed merge", [](json& j) { j["model"]["merges"].push_back(7); }, "malformed"},
      {"unigram model", [](json& j) { j["model"]["type"] = "Unigram"; }, "not supported"},
      {"unknown normalizer",
       [](json& j) {
         j["normalizer"] = {{"type", "Precompiled"}};
       },
       "normalizer type"},
      {"unknown pre-tokenizer",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
       },
       "pre_tokenizer"},
      {"bad regex",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(\\p{L}"; },
       "does not compile"},
      {"unknown decoder",
       [](json& j) {
         j["decoder"] = {{"type", "CTC"}};
       },
       "decoder type"},
      {"added token without id",
       [](json& j) {
         j["added_tokens"].push_back({{"content", "x"}});
       },
       "malformed added token"},
      // Found by the tokenizer_json fuzzer: a flag that is not a boolean threw from nlohmann.
      {"added token flag not a boolean",
       [](json& j) {
         j["added_tokens"].push_back({{"id", 300}, {"content", "x"}, {"special", "yes"}});
       },
       "added token 300: 'special' must be true or false"},
      {"unknown post-processor",
       [](json& j) {
         j["post_processor"] = {{"type", "Whatever"}};
       },
       "post_processor"},
  };
  for (const Case& c : cases) {
    json j = ByteLevelJson();
    c.edit(j);
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromJson(j, json::object());
    ASSERT_FALSE(t.ok()) << c.what;
    EXPECT_TRUE(absl::StrContains(t.status().message(), c.message)) << c.what << ": " << t.status();
  }
  EXPECT_FALSE(Tokenizer::FromJsonText("{not json", "").ok());
  EXPECT_TRUE(absl::StrContains(Tokenizer::FromJsonText("{not json", "").status().message(),
                                "invalid JSON"));
  EXPECT_EQ(Tokenizer::FromDirectory("/nonexistent/model").status().code(),
            absl::StatusCode::kNotFound);
}

// Streams ids one at a time; every delta must be whole UTF-8.
std::string Stream(const Tokenizer& tok, const std::vector<int>& ids, bool skip) {
  absl::StatusOr<IncrementalDetokenizer> d = IncrementalDetokenizer::Create(tok, skip);
  EXPECT_TRUE(d.ok()) << d.status();
  std::string out;
  for (int id : ids) {
    std::string delta = d->Push(id);
    EXPECT_TRUE(IsValidUtf8(delta));
    out += delta;
  }
  std::string tail = d->Flush();
  EXPECT_TRUE(IsValidUtf8(tail));
  return out + tail;
}

void CheckStreamingProperty(const Tokenizer& tok, const std::vector<int>& pool, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<int> ids(1 + rng() % 24);
    for (int& id : ids) {
      id = rng() % 4 == 0 ? static_cast<int>(rng() % tok.vocab_size()) : pool[rng() % pool.size()];
    }
    for (bool skip : {false, true}) {
      ASSERT_EQ(Stream(tok, ids, skip), tok.Decode(ids, skip)) << "iteration " << iter;
    }
  }
}

TEST(IncrementalDetokenizer, ByteLevelWithCleanUpEqualsDecode) {
  auto tok = Load(ByteLevelJson(), json::object());
  ASSERT_NE(tok, nullptr);
  // Bytes that exercise the clean-up hold-back and UTF-8 sequences across tokens.
  std::vector<int> pool = {' ',  '\'', 'n',  't',  's',  'm',  'v',  'e',  'r',  '.',
                           ',',  '!',  '?',  'x',  0xC3, 0xA9, 0xE4, 0xBD, 0xA0, 0xF0,
                           0x9F, 0x98, 0x80, 0xFF, 256,  257,  258,  259,  260};
  CheckStreamingProperty(*tok, pool, 7);
}

TEST(IncrementalDetokenizer, SentencePieceByteFallbackEqualsDecode) {
  auto tok = Load(SentencePieceJson(), {{"clean_up_tokenization_spaces", false}});
  ASSERT_NE(tok, nullptr);
  std::vector<int> pool = {0,        1,        2,        259,      259,      260,      261,
                           262,      263,      3 + ' ',  3 + 0xC3, 3 + 0xA9, 3 + 0xEF, 3 + 0xBB,
                           3 + 0xBF, 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80};
  CheckStreamingProperty(*tok, pool, 11);
}

TEST(IncrementalDetokenizer, HoldsBackOnlyWhatIsUncertain) {
  auto tok = Load(SentencePieceJson(), {{"clean_up_tokenization_spaces", false}});
  ASSERT_NE(tok, nullptr);
  absl::StatusOr<IncrementalDetokenizer> d = IncrementalDetokenizer::Create(*tok, true);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->Push(1), "");         // <s> skipped
  EXPECT_EQ(d->Push(262), "a");      // "▁a": the leading space is stripped
  EXPECT_EQ(d->Push(3 + 0xC3), "");  // half of é
  EXPECT_EQ(d->Push(3 + 0xA9), "\xC3\xA9");
  EXPECT_EQ(d->Push(259), " ");
  EXPECT_EQ(d->Push(3 + 0xF0), "");
  EXPECT_EQ(d->Flush(), kFffd);  // an unfinished sequence ends as U+FFFD
}

}  // namespace
}  // namespace morserve
