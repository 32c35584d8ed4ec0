// Shared test helpers: temporary directories, running the morserve binary, fixture paths.
#pragma once

#include <initializer_list>
#include <string>

#include <gtest/gtest.h>

#include "absl/status/status.h"

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

// Passes when `status` is an error whose message contains every part (e.g. the tensor's
// name and the file's): EXPECT_TRUE(ErrorHas(status, {"model.norm.weight", "a.safetensors"})).
::testing::AssertionResult ErrorHas(const absl::Status& status,
                                    std::initializer_list<std::string> parts);
std::string ReadFile(const std::string& path);

}  // namespace morserve::testing
