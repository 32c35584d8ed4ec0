// One Generate call to a backend with gRPC's callback API (no thread per stream): every
// stream message and the final status become CallEvents in the request's EventSink. The
// call owns itself and deletes itself in OnDone, after releasing its backend slot.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>

#include "morserve/v1/morserve.grpc.pb.h"
#include "server/gateway/backend_pool.h"
#include "server/gateway/call_events.h"

namespace morserve::gateway {

class GenerateCall : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  // Starts the call on `backend` (already Acquired; released when the call ends). When the
  // sink was cancelled first, a CANCELLED done event is pushed instead.
  static void Start(BackendPool* pool, BackendRef backend, const v1::GenerateRequest& request,
                    int choice, std::shared_ptr<EventSink> sink);

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  GenerateCall(BackendPool* pool, BackendRef backend, int choice, std::shared_ptr<EventSink> sink)
      : pool_(pool), backend_(std::move(backend)), choice_(choice), sink_(std::move(sink)) {}

  BackendPool* pool_;
  BackendRef backend_;
  int choice_;
  std::shared_ptr<EventSink> sink_;
  std::shared_ptr<grpc::ClientContext> ctx_ = std::make_shared<grpc::ClientContext>();
  v1::GenerateRequest request_;
  v1::GenerateResponse response_;
};

}  // namespace morserve::gateway
