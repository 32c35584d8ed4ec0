// The Generate reactor (see generate_reactor.h).
#include "server/generate_reactor.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace morserve {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

RejectReason ReasonFor(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kResourceExhausted:
      return RejectReason::kQueueFull;
    case absl::StatusCode::kUnavailable:
      return RejectReason::kUnavailable;
    case absl::StatusCode::kFailedPrecondition:
      return absl::StrContains(s.message(), "tokenizer") ? RejectReason::kNoTokenizer
                                                         : RejectReason::kContextLength;
    default:
      return RejectReason::kInvalidArgument;
  }
}

v1::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
    case FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
    case FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

// `pieces`: with token_text, the tokenizer that gives each token's own text (else null).
void AppendToken(const TokenEvent& t, const Tokenizer* pieces, v1::GenerateResponse* out) {
  v1::Token* tok = out->add_tokens();
  tok->set_id(t.token);
  tok->set_logprob(t.logprob);
  tok->set_loops(t.loops);
  if (pieces != nullptr) tok->set_text(pieces->Decode({t.token}, false));
  for (const TokenLogprob& lp : t.top_logprobs) {
    v1::TopLogprob* top = tok->add_top_logprobs();
    top->set_token_id(lp.token);
    top->set_logprob(lp.logprob);
    if (pieces != nullptr) top->set_text(pieces->Decode({lp.token}, false));
  }
}

// The prompt's entries: the first token bare (rank 0: nothing predicts it), then one scored
// entry per later token.
void AppendPromptLogprobs(const std::vector<int>& prompt,
                          const std::vector<PromptTokenLogprob>& scored, const Tokenizer* pieces,
                          v1::GenerateResponse* out) {
  if (prompt.empty()) return;
  v1::Token* first = out->add_prompt_logprobs();
  first->set_id(prompt[0]);
  if (pieces != nullptr) first->set_text(pieces->Decode({prompt[0]}, false));
  for (const PromptTokenLogprob& p : scored) {
    v1::Token* tok = out->add_prompt_logprobs();
    tok->set_id(p.token);
    tok->set_logprob(p.logprob);
    tok->set_rank(p.rank);
    if (pieces != nullptr) tok->set_text(pieces->Decode({p.token}, false));
    for (const TokenLogprob& lp : p.top_logprobs) {
      v1::TopLogprob* top = tok->add_top_logprobs();
      top->set_token_id(lp.token);
      top->set_logprob(lp.logprob);
      if (pieces != nullptr) top->set_text(pieces->Decode({lp.token}, false));
    }
  }
}

}  // namespace

GenerateReactor* GenerateReactor::Start(ServingState* state, const v1::GenerateRequest& request) {
  std::shared_ptr<GenerateReactor> r(new GenerateReactor(state));
  r->self_ = r;
  state->open_streams.fetch_add(1);
  if (state->metrics) state->metrics->OnStreamOpened();
  r->Begin(request);
  return r.get();
}

void GenerateReactor::Begin(const v1::GenerateRequest& request) {
  absl::StatusOr<Engine*> engine = state_->ReadyEngine();
  if (!engine.ok()) {
    state_->Reject(RejectReason::kUnavailable);
    return FinishWith(ToGrpc(engine.status()));
  }
  engine_ = *engine;
  absl::StatusOr<ParsedGenerate> parsed = ParseGenerateRequest(request, state_->text);
  if (!parsed.ok()) {
    state_->Reject(ReasonFor(parsed.status()));
    return FinishWith(ToGrpc(parsed.status()));
  }
  parsed_ = std::move(*parsed);
  if (request.max_tokens_to_context() && !request.has_max_tokens()) {
    // At least 1: a prompt that fills the context still gets the engine's context error.
    const int context = engine_->weights().config.max_position_embeddings;
    parsed_.request.params.max_tokens =
        std::max(1, context - static_cast<int>(parsed_.request.prompt.size()));
  }
  if (state_->text.tokenizer != nullptr) {
    absl::StatusOr<TextStream> text =
        TextStream::Create(*state_->text.tokenizer, parsed_.skip_special_tokens, parsed_.stop,
                           parsed_.request.params.min_tokens);
    if (!text.ok()) return FinishWith(ToGrpc(text.status()));
    text_.emplace(*std::move(text));
  }
  client_id_ = parsed_.request.request_id;
  engine_id_ = absl::StrCat("grpc-", state_->next_request.fetch_add(1), ":", client_id_);
  GenerateRequest submit = parsed_.request;
  submit.request_id = engine_id_;
  absl::StatusOr<std::shared_ptr<EventChannel>> channel = engine_->Submit(std::move(submit));
  if (!channel.ok()) {
    state_->Reject(ReasonFor(channel.status()));
    return FinishWith(ToGrpc(channel.status()));
  }
  channel_ = *channel;
  std::weak_ptr<GenerateReactor> weak = weak_from_this();
  channel_->SetListener([weak] {
    if (auto r = weak.lock()) r->Post();
  });
  Post();  // events pushed before the listener was set
}

void GenerateReactor::FinishWith(const grpc::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    finishing_ = true;
  }
  Finish(status);
}

void GenerateReactor::Post() {
  if (wake_posted_.exchange(true)) return;
  state_->wake->Post(shared_from_this());
}

void GenerateReactor::Wake() {
  wake_posted_.store(false);
  Pump();
}

void GenerateReactor::AppendEventLocked(const RequestEvent& e) {
  if (e.prompt_logprobs) {
    AppendPromptLogprobs(parsed_.request.prompt, *e.prompt_logprobs,
                         parsed_.token_text ? state_->text.tokenizer : nullptr, &response_);
  }
  for (const TokenEvent& t : e.tokens) {
    if (stopped_) {
      dropped_loops_ += t.loops;
      continue;
    }
    AppendToken(t, parsed_.token_text ? state_->text.tokenizer : nullptr, &response_);
    ++tokens_sent_;
    if (!text_) continue;
    response_.mutable_text()->append(text_->Push(t.token));
    if (text_->stopped()) {
      stopped_ = true;
      if (!e.final()) engine_->Cancel(engine_id_, FinishReason::kStop);  // metrics: "stop"
    }
  }
  if (!e.final()) return;
  if (text_ && !stopped_) {
    response_.mutable_text()->append(text_->Finish());
    stopped_ = text_->stopped();
  }
  v1::Finished* f = response_.mutable_finished();
  v1::Usage* u = f->mutable_usage();
  u->set_prompt_tokens(e.usage.prompt_tokens);
  u->set_preemptions(e.usage.preemptions);
  u->set_cached_tokens(e.usage.cached_tokens);
  if (stopped_) {
    // The engine saw a cancel (or finished on its own): the stop string decides.
    f->set_reason(v1::FINISH_REASON_STOP);
    f->set_stop_string(text_->stop_string());
    f->set_stop_token_id(-1);
    u->set_completion_tokens(tokens_sent_);
    u->set_recursion_loops(e.usage.recursion_loops - dropped_loops_);
  } else {
    f->set_reason(ToProto(e.finish));
    f->set_stop_string(e.stop_string);
    const bool by_id =
        e.finish == FinishReason::kStop && e.stop_string.empty() && !e.tokens.empty();
    f->set_stop_token_id(by_id ? e.tokens.back().token : -1);
    if (!e.error.ok()) f->set_error(std::string(e.error.message()));
    if (e.finish == FinishReason::kError) error_ = ToGrpc(e.error);
    u->set_completion_tokens(e.usage.completion_tokens);
    u->set_recursion_loops(e.usage.recursion_loops);
  }
  u->set_total_tokens(u->prompt_tokens() + u->completion_tokens());
}

GenerateReactor::Next GenerateReactor::PrepareLocked() {
  if (finishing_ || writing_) return Next::kNothing;
  if (cancelled_) {
    finishing_ = true;
    return Next::kFinishCancelled;
  }
  response_.Clear();
  bool final = false;
  while (!final) {
    std::optional<RequestEvent> e = channel_->TryPop();
    if (!e) break;
    AppendEventLocked(*e);
    final = e->final();
  }
  const bool empty = response_.tokens().empty() && response_.text().empty();
  if (empty && !final) return Next::kNothing;
  if (final) {
    engine_done_ = true;
    finishing_ = true;
    // Nothing went out yet: the engine's error is the call's status.
    if (!error_.ok() && empty && !sent_first_) return Next::kFinishError;
  }
  response_.set_request_id(client_id_);
  if (!sent_first_) {
    sent_first_ = true;
    if (parsed_.echo) {
      response_.mutable_prompt_ids()->Assign(parsed_.request.prompt.begin(),
                                             parsed_.request.prompt.end());
      response_.set_prompt_text(parsed_.prompt_text);
    }
  }
  writing_ = true;
  return final ? Next::kWriteAndFinish : Next::kWrite;
}

void GenerateReactor::Pump() {
  Next next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    next = PrepareLocked();
  }
  switch (next) {
    case Next::kNothing:
      return;
    case Next::kWrite:
      return StartWrite(&response_);
    case Next::kWriteAndFinish:
      return StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
    case Next::kFinishCancelled:
      return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled"));
    case Next::kFinishError:
      return Finish(error_);
  }
}

void GenerateReactor::OnWriteDone(bool ok) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    // A failed write means the stream is gone; OnCancel follows or already ran.
    if (!ok) cancelled_ = true;
  }
  Pump();
}

void GenerateReactor::OnCancel() {
  bool finish_now = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    if (channel_ && !engine_done_) engine_->Cancel(engine_id_);
    if (!writing_ && !finishing_) finish_now = finishing_ = true;
  }
  if (finish_now) Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled"));
}

void GenerateReactor::OnDone() {
  if (channel_) {
    channel_->SetListener(nullptr);
    std::lock_guard<std::mutex> lock(mu_);
    if (!engine_done_) engine_->Cancel(engine_id_);  // e.g. the stream broke mid-write
  }
  if (state_->metrics) state_->metrics->OnStreamClosed();
  state_->open_streams.fetch_sub(1);
  self_.reset();  // may delete this: last statement
}

}  // namespace morserve
