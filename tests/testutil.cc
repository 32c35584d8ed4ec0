// Shared test helpers (see testutil.h).
#include "tests/testutil.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <sys/wait.h>

#include "absl/strings/match.h"

namespace morserve::testing {

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "morserve-test-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string FixtureDir() { return MORSERVE_FIXTURE_DIR; }
// $MORSERVE_BIN overrides the built binary (e.g. a ThreadSanitizer build's: scripts/tsan.sh).
std::string MorserveBinary() {
  const char* env = std::getenv("MORSERVE_BIN");
  return env != nullptr && *env != '\0' ? env : MORSERVE_BINARY;
}

CommandResult RunCommand(const std::string& command) {
  CommandResult r;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

::testing::AssertionResult ErrorHas(const absl::Status& status,
                                    std::initializer_list<std::string> parts) {
  if (status.ok()) return ::testing::AssertionFailure() << "status is OK";
  for (const std::string& part : parts) {
    if (!absl::StrContains(status.message(), part)) {
      return ::testing::AssertionFailure()
             << "message \"" << status.message() << "\" lacks \"" << part << "\"";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace morserve::testing
