// The real `morserve serve` as a subprocess for end-to-end tests: started on 127.0.0.1 with
// port 0 (the ports are read from its stdout), stopped with SIGTERM, killed if it outlives
// the test (the process itself is a ChildProcess). Plus small clients: gRPC stubs, a
// one-shot HTTP GET, a free-port finder. The models the tests serve: test_models.h.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "grpc/health/v1/health.grpc.pb.h"
#include "morserve/v1/morserve.grpc.pb.h"
#include "tests/child_process.h"

namespace morserve::testing {

class ServerProcess {
 public:
  // Starts `morserve serve --model DIR --port 0 --metrics-port 0 EXTRA...` and waits for the
  // two port lines (false after `timeout_s`, with the output so far in output()).
  bool Start(const std::string& model_dir, const std::vector<std::string>& extra,
             int timeout_s = 60);
  // Waits until health reports `serving` (true) or not (false).
  bool WaitHealth(bool serving, int timeout_s = 60);
  // Waits until a stdout line contains `text`.
  bool WaitForLine(const std::string& text, int timeout_s = 30);
  // SIGTERM, then waits for the exit (-1 on timeout, after which it is killed).
  int Terminate(int timeout_s = 60) { return child_.Terminate(timeout_s); }
  void Signal(int sig) { child_.Signal(sig); }
  std::optional<grpc::health::v1::HealthCheckResponse::ServingStatus> Health();

  pid_t pid() const { return child_.pid(); }
  bool started() const { return channel_ != nullptr; }  // Start() succeeded
  const std::string& address() const { return address_; }
  int metrics_port() const { return metrics_port_; }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  // A stub on the server's channel; on a server that did not start, a test failure and a
  // stub whose calls fail with UNAVAILABLE (never a null channel).
  std::unique_ptr<v1::Morserve::Stub> Stub() const;
  // Everything it wrote so far (after why it could not start, when it could not).
  std::string output() { return StartError() + child_.output(); }

 private:
  std::string StartError() const {
    return child_.error().empty() ? "" : "cannot start: " + child_.error() + "\n";
  }
  ChildProcess child_;
  std::string address_;
  int metrics_port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
};

// Starts `server` on `model` (port 0) and waits until it serves; a fatal test failure with
// its output otherwise (call under ASSERT_NO_FATAL_FAILURE).
void StartOrDie(ServerProcess* server, const std::string& model,
                const std::vector<std::string>& extra = {});

// Result of one Generate call read to the end.
struct StreamResult {
  grpc::Status status;
  std::vector<int> tokens;
  std::vector<int> loops;
  std::vector<float> logprobs;
  int messages = 0;
  std::optional<v1::Finished> finished;
  std::vector<int> echoed;
  std::string text;         // the text deltas concatenated
  std::string prompt_text;  // echo with a tokenizer
  std::vector<v1::Token> prompt_logprobs;      // with prompt_logprobs
  std::vector<int> prompt_logprob_messages;    // indexes of the messages that carried them
};
StreamResult GenerateAll(v1::Morserve::Stub* stub, const v1::GenerateRequest& request,
                         int deadline_s = 60);
v1::GenerateRequest TokenRequest(const std::vector<int>& prompt, int max_tokens);

// GET http://127.0.0.1:port/path; the body, or nullopt on a connection error or non-200.
std::optional<std::string> HttpGet(int port, const std::string& path_and_query);
// A port that was free a moment ago (bind 0, read, close).
int FreePort();
// The value of an unlabelled or labelled series in a text exposition ("name{labels}").
std::optional<double> ScrapeValue(const std::string& exposition, const std::string& series);

}  // namespace morserve::testing
