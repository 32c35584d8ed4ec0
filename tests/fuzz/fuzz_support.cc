// Shared pieces of the fuzz harnesses; see fuzz_support.h.
#include "tests/fuzz/fuzz_support.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

namespace morserve::fuzz {
namespace {

// DATA/<name>.tokenizer.json with DATA/<name>.tokenizer_config.json when there is one.
std::unique_ptr<Tokenizer> LoadTokenizer(const std::string& name) {
  const std::string path = DataPath(name + ".tokenizer.json");
  const std::string config_path = DataPath(name + ".tokenizer_config.json");
  const std::string config =
      std::filesystem::exists(config_path) ? ReadFile(config_path) : std::string();
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromJsonText(ReadFile(path), config);
  if (!t.ok()) {
    std::fprintf(stderr, "fuzz: cannot load %s: %s\n", path.c_str(),
                 std::string(t.status().message()).c_str());
    std::abort();
  }
  return *std::move(t);
}

struct Scratch {
  std::string dir;
  Scratch() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "morserve-fuzz.XXXXXX").string();
    Check(mkdtemp(tmpl.data()) != nullptr, "mkdtemp");
    dir = tmpl;
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

}  // namespace

std::string DataPath(const std::string& file) {
  return std::string(MORSERVE_FUZZ_DATA_DIR) + "/" + file;
}

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz: property violated: %s\n", what);
  std::abort();
}

std::vector<std::string_view> SplitAtNul(std::string_view text, size_t max_parts) {
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < max_parts) {
    const size_t nul = text.find('\0');
    if (nul == std::string_view::npos) break;
    parts.push_back(text.substr(0, nul));
    text.remove_prefix(nul + 1);
  }
  parts.push_back(text);
  return parts;
}

const std::string& ScratchDir() {
  static Scratch scratch;
  return scratch.dir;
}

void WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  Check(out.good(), "writing a scratch file");
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  Check(in.good(), "reading a fuzz data file");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void TouchBytes(const void* p, size_t n) {
  const volatile uint8_t* b = static_cast<const volatile uint8_t*>(p);
  uint8_t acc = 0;
  for (size_t i = 0; i < n; ++i) acc ^= b[i];
  static volatile uint8_t sink;
  sink = acc;
}

const Tokenizer& ByteLevelTokenizer() {
  static const std::unique_ptr<Tokenizer> t = LoadTokenizer("bytelevel");
  return *t;
}

const Tokenizer& SentencePieceTokenizer() {
  static const std::unique_ptr<Tokenizer> t = LoadTokenizer("sentencepiece");
  return *t;
}

}  // namespace morserve::fuzz
