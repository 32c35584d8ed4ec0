// main() for the fuzz harnesses outside a libFuzzer build: runs every file named on the
// command line, and every regular file inside each directory named (dotfiles skipped), through
// LLVMFuzzerTestOneInput once. ctest's fuzz_replay_* tests use it to replay the seed corpus
// and the crash regressions with the ordinary compiler and flags.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_support.h"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg = argv[i];
    if (!fs::exists(arg)) continue;  // an empty regressions/<name> dir may not be in git
    if (!fs::is_directory(arg)) {
      inputs.push_back(arg);
      continue;
    }
    std::vector<fs::path> files;
    for (const fs::directory_entry& e : fs::directory_iterator(arg)) {
      if (e.is_regular_file() && e.path().filename().string()[0] != '.') files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    inputs.insert(inputs.end(), files.begin(), files.end());
  }
  for (const fs::path& p : inputs) {
    const std::string bytes = morserve::fuzz::ReadFile(p.string());
    std::fprintf(stderr, "replay %s (%zu bytes)\n", p.c_str(), bytes.size());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("replayed %zu inputs\n", inputs.size());
  return inputs.empty() ? 1 : 0;
}
