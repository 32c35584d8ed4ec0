// `morserve mktokenizer`: trains a byte-level BPE tokenizer on text files and writes it as a
// Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json,
// generation_config.json; see engine/tokenizer/bpe_tokenizer_files.h). The demo model of
// run.sh uses one trained on the licence texts every Debian system has and the repo's docs.
//
//   morserve mktokenizer --corpus FILE|DIR[,...] --vocab-size N --out DIR [--chat-template T]
//
// --vocab-size counts everything: 256 bytes, the learned merges and the special tokens. A
// directory in --corpus means its regular files, recursively, in name order; a file named
// twice (or through a symlink) is read once. The text is read as UTF-8 (ill-formed bytes
// become U+FFFD, as the tokenizer itself sees them).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/tokenizer/bpe_tokenizer_files.h"
#include "engine/tokenizer/bpe_trainer.h"
#include "engine/tokenizer/utf8.h"
#include "engine/tools/commands.h"
#include "engine/tools/flags.h"

namespace morserve {
namespace {

constexpr char kUsage[] =
    "usage: morserve mktokenizer --corpus FILE|DIR[,FILE|DIR...] --vocab-size N --out DIR\n"
    "                            [--chat-template llama3|none]\n"
    "Trains a byte-level BPE (Llama 3 split regex and special tokens) on the corpus;\n"
    "N counts the 256 bytes, the learned merges and the special tokens.\n";

int Fail(const std::string& message) {
  std::fprintf(stderr, "morserve mktokenizer: %s\n%s", message.c_str(), kUsage);
  return 2;
}

// The corpus files in order: each argument, a directory expanded to its sorted regular files.
absl::StatusOr<std::vector<std::filesystem::path>> CorpusFiles(
    const std::vector<std::string>& args) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  std::set<fs::path> seen;
  auto add = [&](const fs::path& p) {
    std::error_code ec;
    const fs::path canonical = fs::canonical(p, ec);
    if (!ec && seen.insert(canonical).second) files.push_back(p);
  };
  for (const std::string& arg : args) {
    std::error_code ec;
    const fs::file_status st = fs::status(arg, ec);
    if (ec || !fs::exists(st)) {
      return absl::NotFoundError(absl::StrCat("--corpus: '", arg, "' does not exist"));
    }
    if (fs::is_directory(st)) {
      std::vector<fs::path> inside;
      for (fs::recursive_directory_iterator it(arg, ec), end; !ec && it != end; it.increment(ec)) {
        if (it->is_regular_file()) inside.push_back(it->path());
      }
      if (ec)
        return absl::InternalError(absl::StrCat("--corpus: cannot list ", arg, ": ", ec.message()));
      std::sort(inside.begin(), inside.end());
      for (const fs::path& p : inside) add(p);
    } else if (fs::is_regular_file(st)) {
      add(arg);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--corpus: '", arg, "' is not a file"));
    }
  }
  return files;
}

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) return absl::NotFoundError(absl::StrCat("--corpus: cannot read ", path.string()));
  return text.str();
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int MktokenizerCommand(const Args& args) {
  absl::StatusOr<Flags> f =
      Flags::Parse(args, {"corpus", "vocab-size", "out", "chat-template"}, {"help"});
  if (!f.ok()) return Fail(std::string(f.status().message()));
  if (f->Has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!f->Has("corpus")) return Fail("--corpus FILE[,FILE...] is required");
  if (!f->Has("out")) return Fail("--out DIR is required");
  if (!f->Has("vocab-size")) return Fail("--vocab-size N is required");
  absl::StatusOr<int> vocab = f->GetInt("vocab-size", 0);
  if (!vocab.ok()) return Fail(std::string(vocab.status().message()));
  const int specials = static_cast<int>(Llama3SpecialTokens().size());
  if (*vocab < 256 + specials) {
    return Fail(absl::StrCat("--vocab-size ", *vocab, " is smaller than the 256 byte tokens + ",
                             specials, " special tokens = ", 256 + specials));
  }
  const std::string chat_template = f->Get("chat-template", "llama3");

  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<PreTokenizer>> pre =
      PreTokenizer::FromJson(Llama3PreTokenizerJson());
  if (!pre.ok()) return Fail(std::string(pre.status().message()));
  absl::StatusOr<BpeTrainer> trainer = BpeTrainer::Create(pre->get());
  if (!trainer.ok()) return Fail(std::string(trainer.status().message()));
  absl::StatusOr<std::vector<std::filesystem::path>> files = CorpusFiles(f->GetList("corpus"));
  if (!files.ok()) return Fail(std::string(files.status().message()));
  size_t corpus_bytes = 0;
  for (const std::filesystem::path& path : *files) {
    absl::StatusOr<std::string> text = ReadFile(path);
    if (!text.ok()) return Fail(std::string(text.status().message()));
    corpus_bytes += text->size();
    trainer->AddText(SanitizeUtf8(*text));
  }
  if (trainer->total_words() == 0) return Fail("--corpus: the files hold no text");

  absl::StatusOr<TrainedBpe> bpe = trainer->Train(*vocab - specials);
  if (!bpe.ok()) return Fail(std::string(bpe.status().message()));
  absl::StatusOr<BpeTokenizerFiles> out = MakeBpeTokenizerFiles(*bpe, chat_template);
  if (!out.ok()) return Fail(std::string(out.status().message()));
  if (absl::Status s = WriteBpeTokenizerFiles(*out, f->Get("out")); !s.ok()) {
    std::fprintf(stderr, "morserve mktokenizer: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  const int total = static_cast<int>(bpe->tokens.size()) + specials;
  std::printf(
      "mktokenizer: %zu bytes in %zu files, %lld words (%zu distinct); %zu merges -> vocab %d "
      "(256 bytes + %zu learned + %d special) in %.2f s; wrote %s\n",
      corpus_bytes, files->size(), static_cast<long long>(trainer->total_words()),
      trainer->distinct_words(), bpe->merges.size(), total, bpe->tokens.size() - 256, specials,
      SecondsSince(start), f->Get("out").c_str());
  if (total < *vocab) {
    std::printf("mktokenizer: the corpus ran out of pairs before --vocab-size %d\n", *vocab);
  }
  return 0;
}

}  // namespace morserve
