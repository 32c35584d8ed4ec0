// morserve's gRPC Generate as a load-test target, on gRPC's callback API: one reactor per
// request, no thread per stream, so thousands of requests can be in flight from one process.
// Token ids go out as `token_ids`, text prompts as `text`, chat messages as `chat`; every
// response message with tokens is one chunk; the final message's usage is the server's count
// (cached_tokens included).
#pragma once

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "loadtest/target.h"
#include "morserve/v1/morserve.grpc.pb.h"

namespace morserve::loadtest {

class GenerateCall;

class GrpcTarget : public Target {
 public:
  GrpcTarget(const std::string& address, SendOptions options);
  ~GrpcTarget() override;  // cancels and waits for open calls

  // Waits until the health service says SERVING, then reads the model info.
  absl::StatusOr<v1::ModelInfo> ModelInfo(int timeout_s);

  void Send(const RequestSpec& spec, RequestRecord record, Clock::time_point epoch,
            Done done) override;
  void CancelAll() override;
  std::string Describe() const override { return "grpc://" + address_; }

 private:
  friend class GenerateCall;
  void Finished(GenerateCall* call);

  std::string address_;
  SendOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Morserve::Stub> stub_;
  std::mutex mu_;
  std::condition_variable idle_;
  std::set<GenerateCall*> open_;
};

// "OK", "CANCELLED", "RESOURCE_EXHAUSTED", ...
const char* StatusCodeName(grpc::StatusCode code);

}  // namespace morserve::loadtest
