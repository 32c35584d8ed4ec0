// BPE trainer and `morserve mktokenizer`: merges hand-computed on a tiny word list (ties
// included), determinism, and the written tokenizer as the loader sees it -- it round-trips
// the training corpus and random text exactly, special tokens are single ids, the chat
// template renders -- plus the CLI's errors. The corpus is the licence texts of Debian's
// base-files (/usr/share/common-licenses, on every Debian system) and the repo's README.
#include "engine/tokenizer/bpe_trainer.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "engine/tokenizer/bpe_tokenizer_files.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testutil.h"

namespace morserve {
namespace {

using nlohmann::json;
using testing::ReadFile;
using testing::RunCommand;
using testing::TempDir;

std::unique_ptr<PreTokenizer> Llama3PreTokenizer() {
  absl::StatusOr<std::unique_ptr<PreTokenizer>> p =
      PreTokenizer::FromJson(Llama3PreTokenizerJson());
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

// Merges as "left+right" strings of raw bytes.
std::vector<std::string> MergeStrings(const TrainedBpe& bpe) {
  std::vector<std::string> out;
  for (const TrainedBpe::Merge& m : bpe.merges) {
    out.push_back(bpe.tokens[m.left] + "+" + bpe.tokens[m.right]);
  }
  return out;
}

TEST(BpeTrainer, HandComputedMergesWithTies) {
  auto pre = Llama3PreTokenizer();
  absl::StatusOr<BpeTrainer> t = BpeTrainer::Create(pre.get());
  ASSERT_TRUE(t.ok());
  // Pair counts: u+g 20, p+u 17, u+n 16, h+u 15, g+s 5, b+u 4.
  t->AddWord("hug", 10);
  t->AddWord("pug", 5);
  t->AddWord("pun", 12);
  t->AddWord("bun", 4);
  t->AddWord("hugs", 5);
  absl::StatusOr<TrainedBpe> bpe = t->Train(1000);
  ASSERT_TRUE(bpe.ok()) << bpe.status();
  // 1. u+g (20). Then h+ug 15, p+ug 5, ug+s 5, p+u 12, u+n 16, b+u 4.
  // 2. u+n (16). Then p+un 12, b+un 4.   3. h+ug (15).   4. p+un (12).
  // 5. p+ug and hug+s tie at 5: the smaller left id wins ('p' = 112 < "hug" = 258).
  // 6. hug+s (5).   7. b+un (4). Then every word is one token: no pairs left.
  EXPECT_EQ(MergeStrings(*bpe),
            (std::vector<std::string>{"u+g", "u+n", "h+ug", "p+un", "p+ug", "hug+s", "b+un"}));
  ASSERT_EQ(bpe->tokens.size(), 263u);
  EXPECT_EQ(bpe->tokens[256], "ug");
  EXPECT_EQ(bpe->tokens[262], "bun");
  EXPECT_EQ(bpe->merges[2].left, 'h');
  EXPECT_EQ(bpe->merges[2].right, 256);
  EXPECT_EQ(bpe->merges[2].result, 258);

  // A budget stops training early: 256 + 3 tokens = the first three merges.
  absl::StatusOr<TrainedBpe> short_run = t->Train(259);
  ASSERT_TRUE(short_run.ok());
  EXPECT_EQ(MergeStrings(*short_run), (std::vector<std::string>{"u+g", "u+n", "h+ug"}));
  EXPECT_FALSE(t->Train(255).ok());
}

TEST(BpeTrainer, TiesOnTheLeftGoToTheSmallerRightAndRepeatsMergeLeftToRight) {
  auto pre = Llama3PreTokenizer();
  absl::StatusOr<BpeTrainer> t = BpeTrainer::Create(pre.get());
  ASSERT_TRUE(t.ok());
  // "aaa" holds a+a twice (count 2 x 2 = 4); "ab", "ac" hold a+b and a+c 3 times each.
  t->AddWord("aaa", 2);
  t->AddWord("ac", 3);
  t->AddWord("ab", 3);
  absl::StatusOr<TrainedBpe> bpe = t->Train(1000);
  ASSERT_TRUE(bpe.ok());
  // a+a (4) -> "aaa" is [aa, a] (left to right); aa+a (2) ties nothing; a+b and a+c (3) tie:
  // the smaller right id ('b') first.
  EXPECT_EQ(MergeStrings(*bpe), (std::vector<std::string>{"a+a", "a+b", "a+c", "aa+a"}));
}

// The definition, slowly: every step recounts all pairs of all words from scratch.
std::vector<std::string> NaiveMerges(const std::vector<std::pair<std::string, int64_t>>& words,
                                     int max_tokens) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
  std::vector<std::vector<int>> symbols;
  for (const auto& [w, c] : words) {
    symbols.emplace_back();
    for (unsigned char b : w) symbols.back().push_back(b);
  }
  std::vector<std::string> merges;
  while (static_cast<int>(tokens.size()) < max_tokens) {
    std::map<std::pair<int, int>, int64_t> counts;
    for (size_t w = 0; w < symbols.size(); ++w) {
      for (size_t i = 0; i + 1 < symbols[w].size(); ++i) {
        counts[{symbols[w][i], symbols[w][i + 1]}] += words[w].second;
      }
    }
    if (counts.empty()) break;
    auto best = counts.begin();  // map order: the smallest pair wins ties
    for (auto it = counts.begin(); it != counts.end(); ++it) {
      if (it->second > best->second) best = it;
    }
    const auto [l, r] = best->first;
    const std::string joined = tokens[l] + tokens[r];
    int id = static_cast<int>(std::find(tokens.begin(), tokens.end(), joined) - tokens.begin());
    if (id == static_cast<int>(tokens.size())) tokens.push_back(joined);
    merges.push_back(tokens[l] + "+" + tokens[r]);
    for (std::vector<int>& s : symbols) {
      std::vector<int> out;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == l && s[i + 1] == r) {
          out.push_back(id);
          ++i;
        } else {
          out.push_back(s[i]);
        }
      }
      s = std::move(out);
    }
  }
  return merges;
}

TEST(BpeTrainer, IncrementalCountsEqualRecountingEveryMerge) {
  auto pre = Llama3PreTokenizer();
  absl::StatusOr<BpeTrainer> t = BpeTrainer::Create(pre.get());
  ASSERT_TRUE(t.ok());
  // Real text (words with repeats, runs of spaces and newlines) plus repeated letters.
  std::string text = testing::ReadFile("/usr/share/common-licenses/BSD") +
                     testing::ReadFile("/usr/share/common-licenses/Artistic") +
                     " aaaaaaa aaaa aaa ababab abab  \n\n\n   xxxxxxxxxxxxxxxx";
  std::vector<std::string> split;
  pre->Split(text, 0, &split);
  std::map<std::string, int64_t> counted;
  for (const std::string& w : split) counted[w]++;
  for (const auto& [w, c] : counted) t->AddWord(w, c);
  const std::vector<std::pair<std::string, int64_t>> words(counted.begin(), counted.end());
  absl::StatusOr<TrainedBpe> bpe = t->Train(256 + 700);
  ASSERT_TRUE(bpe.ok());
  const std::vector<std::string> expected = NaiveMerges(words, 256 + 700);
  EXPECT_EQ(expected.size(), 700u);
  EXPECT_EQ(MergeStrings(*bpe), expected);
}

TEST(BpeTrainer, NeedsAByteLevelPreTokenizer) {
  EXPECT_FALSE(BpeTrainer::Create(nullptr).ok());
  absl::StatusOr<std::unique_ptr<PreTokenizer>> ws =
      PreTokenizer::FromJson({{"type", "Whitespace"}});
  ASSERT_TRUE(ws.ok());
  EXPECT_FALSE(BpeTrainer::Create(ws->get()).ok());
}

// The Debian licence texts and the README: the demo tokenizer's corpus.
std::vector<std::string> CorpusTexts() {
  std::vector<std::string> paths;
  for (const auto& e : std::filesystem::directory_iterator("/usr/share/common-licenses")) {
    if (e.is_regular_file() && !e.is_symlink()) paths.push_back(e.path().string());
  }
  std::sort(paths.begin(), paths.end());
  paths.push_back(testing::FixtureDir() + "/../../README.md");
  std::vector<std::string> texts;
  for (const std::string& p : paths) texts.push_back(ReadFile(p));
  return texts;
}

// Trains on the corpus (whole texts in the given order) and returns tokenizer files.
BpeTokenizerFiles TrainFiles(const std::vector<std::string>& texts, int vocab,
                             const std::string& chat_template = "llama3") {
  auto pre = Llama3PreTokenizer();
  absl::StatusOr<BpeTrainer> t = BpeTrainer::Create(pre.get());
  EXPECT_TRUE(t.ok());
  for (const std::string& text : texts) t->AddText(SanitizeUtf8(text));
  absl::StatusOr<TrainedBpe> bpe = t->Train(vocab - 5);
  EXPECT_TRUE(bpe.ok()) << bpe.status();
  absl::StatusOr<BpeTokenizerFiles> files = MakeBpeTokenizerFiles(*bpe, chat_template);
  EXPECT_TRUE(files.ok()) << files.status();
  return *std::move(files);
}

std::unique_ptr<Tokenizer> Load(const BpeTokenizerFiles& f) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::FromJsonText(f.tokenizer.dump(), f.tokenizer_config.dump());
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

class TrainedTokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    texts_ = new std::vector<std::string>(CorpusTexts());
    files_ = new BpeTokenizerFiles(TrainFiles(*texts_, 2048));
  }
  static void TearDownTestSuite() {
    delete texts_;
    delete files_;
  }
  static std::vector<std::string>* texts_;
  static BpeTokenizerFiles* files_;
};
std::vector<std::string>* TrainedTokenizer::texts_ = nullptr;
BpeTokenizerFiles* TrainedTokenizer::files_ = nullptr;

TEST_F(TrainedTokenizer, IsDeterministicWhateverTheInputOrder) {
  std::vector<std::string> reversed(texts_->rbegin(), texts_->rend());
  const BpeTokenizerFiles again = TrainFiles(reversed, 2048);
  EXPECT_EQ(again.tokenizer.dump(), files_->tokenizer.dump());
  EXPECT_EQ(again.tokenizer_config.dump(), files_->tokenizer_config.dump());
}

TEST_F(TrainedTokenizer, HasTheRequestedVocabularyAndUniqueTokens) {
  auto tok = Load(*files_);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 2048);
  const json& model = files_->tokenizer["model"];
  std::set<std::string> names;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) names.insert(it.key());
  EXPECT_EQ(names.size(), 2043u);                   // learned tokens, all distinct
  EXPECT_GE(model["merges"].size(), 2043u - 256u);  // a merge may repeat a token
  // Frequent English words of the licences are single tokens.
  for (const char* word : {" the", " License", " software"}) {
    EXPECT_EQ(tok->Encode(word, false).size(), 1u) << word;
  }
}

TEST_F(TrainedTokenizer, RoundTripsTheCorpusAndCompressesIt) {
  auto tok = Load(*files_);
  ASSERT_NE(tok, nullptr);
  size_t bytes = 0, tokens = 0;
  for (const std::string& text : *texts_) {
    std::vector<int> ids = tok->Encode(text, false);
    EXPECT_EQ(tok->Decode(ids, false), text);
    bytes += text.size();
    tokens += ids.size();
  }
  // A 2k vocabulary on its own training text: well under one token per 3 bytes.
  EXPECT_LT(tokens * 3, bytes) << tokens << " tokens for " << bytes << " bytes";
}

std::string RandomUnicode(std::mt19937& rng, int length) {
  // Code points from ASCII (controls and newlines too), Latin-1, Greek, CJK, combining marks,
  // Unicode spaces and emoji (4-byte UTF-8).
  static const std::pair<char32_t, char32_t> kRanges[] = {
      {0x01, 0x7F},   {0x0A, 0x0D},     {0x20, 0x20},     {0xA0, 0xFF},       {0x370, 0x3FF},
      {0x300, 0x36F}, {0x4E00, 0x4FFF}, {0x2000, 0x200B}, {0x1F600, 0x1F64F}, {0x3000, 0x3000}};
  std::string s;
  for (int i = 0; i < length; ++i) {
    const auto& [lo, hi] = kRanges[rng() % std::size(kRanges)];
    AppendUtf8(lo + rng() % (hi - lo + 1), &s);
  }
  return s;
}

TEST_F(TrainedTokenizer, RoundTripsRandomUnicodeAndBytes) {
  auto tok = Load(*files_);
  ASSERT_NE(tok, nullptr);
  std::mt19937 rng(7);
  for (int i = 0; i < 500; ++i) {
    const std::string text = RandomUnicode(rng, 1 + rng() % 60);
    EXPECT_EQ(tok->Decode(tok->Encode(text, false), false), text) << "case " << i;
    std::vector<int> with_bos = tok->Encode(text, true);
    ASSERT_FALSE(with_bos.empty());
    EXPECT_EQ(with_bos[0], *tok->bos_token_id());
    EXPECT_EQ(tok->Decode(with_bos, true), text);
  }
  // Arbitrary bytes: the tokenizer sees them as TextDecoder would (ill-formed -> U+FFFD).
  for (int i = 0; i < 500; ++i) {
    std::string bytes(1 + rng() % 40, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() % 256);
    EXPECT_EQ(tok->Decode(tok->Encode(bytes, false), false), SanitizeUtf8(bytes)) << "case " << i;
  }
}

TEST_F(TrainedTokenizer, SpecialTokensAreSingleIdsAfterTheLearnedOnes) {
  auto tok = Load(*files_);
  ASSERT_NE(tok, nullptr);
  const std::vector<std::string>& specials = Llama3SpecialTokens();
  for (size_t i = 0; i < specials.size(); ++i) {
    const int id = 2043 + static_cast<int>(i);
    EXPECT_EQ(tok->Encode(specials[i], false), std::vector<int>{id}) << specials[i];
    EXPECT_TRUE(tok->IsSpecial(id));
    EXPECT_EQ(tok->Decode({id}, false), specials[i]);
    EXPECT_EQ(tok->Decode({id}, true), "");
  }
  std::vector<int> ids = tok->Encode("<|eot_id|>the<|start_header_id|>", false);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 2047);
  EXPECT_EQ(ids.back(), 2045);
  EXPECT_EQ(tok->bos_token_id(), 2043);
  EXPECT_EQ(tok->eos_token_ids(), std::vector<int>{2047});  // eos_token <|eot_id|>
  EXPECT_EQ(files_->generation_config["eos_token_id"], json({2044, 2047}));
}

TEST_F(TrainedTokenizer, ChatTemplateRendersLlama3Turns) {
  absl::StatusOr<ChatTemplate> tmpl =
      ChatTemplate::FromTokenizerConfig(json::parse(files_->tokenizer_config.dump()));
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  json messages = {{{"role", "system"}, {"content", "Be brief."}},
                   {{"role", "user"}, {"content", " Hi there\n"}}};
  absl::StatusOr<std::string> text = tmpl->Render(messages, /*add_generation_prompt=*/true);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  auto tok = Load(*files_);
  ASSERT_NE(tok, nullptr);
  std::vector<int> ids = tok->Encode(*text, false);
  EXPECT_EQ(ids.front(), 2043);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2047), 2);  // two <|eot_id|>
  EXPECT_EQ(tok->Decode(ids, false), *text);

  // "none": no chat template, eos <|end_of_text|>.
  const BpeTokenizerFiles plain = TrainFiles({"a tiny corpus"}, 300, "none");
  EXPECT_FALSE(plain.tokenizer_config.contains("chat_template"));
  EXPECT_EQ(plain.tokenizer_config["eos_token"], "<|end_of_text|>");
  auto plain_tok = Load(plain);
  ASSERT_NE(plain_tok, nullptr);
  EXPECT_EQ(plain_tok->vocab_size(), 256 + 10 + 5);  // 4 + 6 merges make " tiny", " corpus"
  EXPECT_FALSE(MakeBpeTokenizerFiles(TrainedBpe{}, "chatml").ok());
}

// ---- The CLI -----------------------------------------------------------------------------

std::string Cli(const std::string& args) {
  return testing::MorserveBinary() + " mktokenizer " + args + " 2>&1";
}

TEST(MktokenizerCli, WritesATokenizerDirectoryThatLoads) {
  TempDir dir;
  const std::string corpus = testing::FixtureDir() + "/../../README.md";
  testing::CommandResult r = RunCommand(Cli("--corpus /usr/share/common-licenses," + corpus +
                                            " --vocab-size 600 --out " + dir.File("tok")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "vocab 600 (256 bytes + 339 learned + 5 special)"))
      << r.output;
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromDirectory(dir.File("tok"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 600);
  // eos from tokenizer_config (<|eot_id|>) and generation_config (<|end_of_text|> too).
  EXPECT_EQ((*tok)->eos_token_ids(), (std::vector<int>{599, 596}));
  const std::string readme = ReadFile(corpus);
  EXPECT_EQ((*tok)->Decode((*tok)->Encode(readme, true), true), readme);
}

TEST(MktokenizerCli, ErrorsAreClear) {
  TempDir dir;
  const std::string out = " --out " + dir.File("tok");
  struct Case {
    std::string args;
    std::string message;
  } cases[] = {
      {"--corpus " + dir.File("missing.txt") + " --vocab-size 600" + out,
       "--corpus: '" + dir.File("missing.txt") + "' does not exist"},
      {"--vocab-size 600" + out, "--corpus FILE[,FILE...] is required"},
      {"--corpus /usr/share/common-licenses/BSD --vocab-size 260" + out,
       "--vocab-size 260 is smaller than the 256 byte tokens + 5 special tokens = 261"},
      {"--corpus /usr/share/common-licenses/BSD --vocab-size many" + out, "--vocab-size"},
      {"--corpus /usr/share/common-licenses/BSD" + out, "--vocab-size N is required"},
      {"--corpus /usr/share/common-licenses/BSD --vocab-size 600", "--out DIR is required"},
      {"--corpus /usr/share/common-licenses/BSD --vocab-size 600 --chat-template chatml" + out,
       "unknown chat template 'chatml' (known: llama3, none)"},
  };
  for (const Case& c : cases) {
    testing::CommandResult r = RunCommand(Cli(c.args));
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, c.message)) << c.args << "\n" << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, "usage: morserve mktokenizer")) << r.output;
  }
  testing::WriteFile(dir.File("empty.txt"), "");
  testing::CommandResult r =
      RunCommand(Cli("--corpus " + dir.File("empty.txt") + " --vocab-size 600" + out));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(r.output, "the files hold no text")) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir.File("tok")));
}

}  // namespace
}  // namespace morserve
