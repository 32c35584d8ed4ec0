// Shared test helpers: temporary directories, running the morserve binary, fixture paths.
#pragma once

#include <string>

namespace morserve::testing {

// A fresh directory under $TMPDIR, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string FixtureDir();       // tests/fixtures in the source tree
std::string MorserveBinary();   // the built `morserve` CLI

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};
CommandResult RunCommand(const std::string& command);

void WriteFile(const std::string& path, const std::string& contents);
std::string ReadFile(const std::string& path);

}  // namespace morserve::testing
