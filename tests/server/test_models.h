// The tiny models the serving tests (server, gateway, loadtest) run: a "slow" vanilla model
// (a long generation takes seconds on one thread, so cancellation and draining land
// mid-stream) and models that take text, on a tokenizer `morserve mktokenizer` trains from
// this repository's README (vocab 400: no npm), optionally with an eos set to the model's
// own greedy first token for a prompt; ServedTextModel runs one in the real server for a
// test suite (tests/gateway/gateway_process.h puts the gateway in front).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tools/mkmodel.h"
#include "tests/server/server_process.h"
#include "tests/testutil.h"

namespace morserve::testing {

// mkmodel's default tiny model of `family` (bf16) with max_pos 256: the e2e tests' models.
TinyModelSpec ServingSpec(const std::string& family);

// Vanilla, hidden 512, intermediate 2048, 8 heads (4 kv), 6 layers, max_pos 4096, bf16.
TinyModelSpec SlowVanillaSpec();

// An fp32 tiny model of `family` (max_pos 128) on the README tokenizer, trained into
// DIR/tokenizer: vocab, bos and eos come from it; WriteTinyModel copies its files next to
// the weights.
absl::StatusOr<TinyModelSpec> ReadmeTokenizerSpec(const TempDir& dir, const std::string& family);

// "role: content\n" per message, then "assistant:" with add_generation_prompt.
inline constexpr char kPlainChatTemplate[] =
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}";

// Sets spec's eos to the greedy first token the same weights give for `prompt` (written to
// `probe_dir` and run on the in-process engine); returns that token.
absl::StatusOr<int> EosAtGreedyFirstToken(const std::vector<int>& prompt,
                                          const std::string& probe_dir, TinyModelSpec* spec);

// A text-taking tiny model in the real `morserve serve` (127.0.0.1 port 0), for a test
// suite (tests/server/served_suite.h): its files live in dir() (ReadmeTokenizerSpec(dir(),
// ...) trains the tokenizer there).
class ServedTextModel {
 public:
  const TempDir& dir() const { return dir_; }
  // Writes `spec` to dir()/model with kPlainChatTemplate, loads its tokenizer and starts the
  // server, waiting until it serves; fatal test failures (ASSERT_NO_FATAL_FAILURE).
  virtual void Start(const TinyModelSpec& spec);
  // Terminates the server (when it was started); it must exit 0.
  virtual void Stop();
  virtual ~ServedTextModel() = default;

  const std::string& model_dir() const { return model_dir_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  ServerProcess& server() { return server_; }

 private:
  TempDir dir_;
  std::string model_dir_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ServerProcess server_;
};

}  // namespace morserve::testing
