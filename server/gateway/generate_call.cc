// Callback-API Generate call (see generate_call.h).
#include "server/gateway/generate_call.h"

namespace morserve::gateway {

void GenerateCall::Start(BackendPool* pool, BackendRef backend, const v1::GenerateRequest& request,
                         int choice, std::shared_ptr<EventSink> sink) {
  auto* call = new GenerateCall(pool, backend, choice, sink);
  if (!sink->Register(call->ctx_)) {
    pool->Release(backend.get());
    delete call;
    CallEvent e;
    e.choice = choice;
    e.done = true;
    e.status = grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
    sink->Push(std::move(e));
    return;
  }
  call->request_ = request;
  backend->stub->async()->Generate(call->ctx_.get(), &call->request_, call);
  call->StartRead(&call->response_);
  call->StartCall();
}

void GenerateCall::OnReadDone(bool ok) {
  if (!ok) return;  // end of stream or failure: OnDone follows
  CallEvent e;
  e.choice = choice_;
  e.message.Swap(&response_);
  sink_->Push(std::move(e));
  StartRead(&response_);
}

void GenerateCall::OnDone(const grpc::Status& status) {
  pool_->Release(backend_.get());
  CallEvent e;
  e.choice = choice_;
  e.done = true;
  e.status = status;
  sink_->Unregister(ctx_.get());
  sink_->Push(std::move(e));
  delete this;
}

}  // namespace morserve::gateway
