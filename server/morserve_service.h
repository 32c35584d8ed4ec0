// The morserve.v1.Morserve service on gRPC's callback API: every handler returns at once
// (Generate hands the call to a GenerateReactor; the unary calls finish inline, as they
// only read engine stats or tokenize in place, on the calling thread, never the engine's).
#pragma once

#include "morserve/v1/morserve.grpc.pb.h"
#include "server/serving_state.h"

namespace morserve {

class MorserveService final : public v1::Morserve::CallbackService {
 public:
  explicit MorserveService(ServingState* state) : state_(state) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* out) override;

 private:
  ServingState* state_;
};

// The family name GetModelInfo reports ("vanilla", "recursive", "relaxed", "mor-ec",
// "mor-tc", "early-exit", "recurrent").
const char* ModelFamilyName(const ModelConfig& c);

}  // namespace morserve
