// One Generate call: a gRPC callback-API write reactor over one engine request.
//
// Threads and invariants:
//   - The engine thread pushes events into the request's EventChannel; the channel's
//     listener only posts this reactor to the WakeQueue (once until it runs), so the engine
//     never calls into gRPC nor waits on a stream.
//   - Wake() (wake-queue thread) and OnWriteDone() (gRPC thread) drain the channel into one
//     message holding every token produced since the last write; at most one write is in
//     flight, so a slow client batches tokens instead of queueing messages.
//   - gRPC calls (StartWrite, Finish) are made outside mu_: a reaction may run inline.
//   - Client cancel, deadline and disconnect arrive as OnCancel: the engine request is
//     cancelled (its KV blocks are freed at the next step) and the call finishes CANCELLED.
//   - The reactor owns itself through self_ until OnDone; the channel's listener holds only
//     a weak reference.
//   - With a tokenizer, a TextStream turns the tokens into text deltas and matches stop
//     strings. On a match the tokens after the matching one are dropped, the engine request
//     is cancelled, and the stream waits for the engine's final event (one step at most) to
//     finish with FINISH_REASON_STOP and usage net of the dropped tokens.
//   - An engine error before any message went out ends the call with the error's status;
//     after that it is the last message's FINISH_REASON_ERROR (status OK).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "engine/runtime/engine.h"
#include "morserve/v1/morserve.pb.h"
#include "server/request_parse.h"
#include "server/serving_state.h"
#include "server/text_stream.h"
#include "server/wake_queue.h"

namespace morserve {

class GenerateReactor : public grpc::ServerWriteReactor<v1::GenerateResponse>,
                        public Wakeable,
                        public std::enable_shared_from_this<GenerateReactor> {
 public:
  // Starts the call: validates and submits, or finishes it with the error status.
  static GenerateReactor* Start(ServingState* state, const v1::GenerateRequest& request);

  void Wake() override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  explicit GenerateReactor(ServingState* state) : state_(state) {}
  void Begin(const v1::GenerateRequest& request);
  void FinishWith(const grpc::Status& status);
  // Under mu_: moves pending events into response_; returns what to do next.
  enum class Next { kNothing, kWrite, kWriteAndFinish, kFinishCancelled, kFinishError };
  Next PrepareLocked();
  // Under mu_: one engine event into response_ (tokens, text, finish information).
  void AppendEventLocked(const RequestEvent& e);
  void Pump();
  void Post();

  ServingState* state_;
  Engine* engine_ = nullptr;
  std::string engine_id_;  // unique per call: Engine::Cancel is by id
  std::string client_id_;
  std::shared_ptr<EventChannel> channel_;
  ParsedGenerate parsed_;
  std::shared_ptr<GenerateReactor> self_;
  std::atomic<bool> wake_posted_{false};

  std::mutex mu_;
  v1::GenerateResponse response_;  // the write in flight (guarded by writing_)
  bool writing_ = false;
  bool finishing_ = false;    // Finish or StartWriteAndFinish called (or about to be)
  bool cancelled_ = false;    // OnCancel ran
  bool engine_done_ = false;  // the final event was seen
  bool sent_first_ = false;
  std::optional<TextStream> text_;  // with a tokenizer
  bool stopped_ = false;            // a stop string matched; waiting for the final event
  int tokens_sent_ = 0;             // tokens put in messages
  int64_t dropped_loops_ = 0;       // loops of tokens dropped after a stop string
  grpc::Status error_;              // kFinishError: the engine's error
};

}  // namespace morserve
