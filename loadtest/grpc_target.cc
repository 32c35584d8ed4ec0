// gRPC target (see grpc_target.h).
#include "loadtest/grpc_target.h"

#include <condition_variable>
#include <thread>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace morserve::loadtest {

const char* StatusCodeName(grpc::StatusCode code) {
  static const char* kNames[] = {"OK",
                                 "CANCELLED",
                                 "UNKNOWN",
                                 "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED",
                                 "NOT_FOUND",
                                 "ALREADY_EXISTS",
                                 "PERMISSION_DENIED",
                                 "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION",
                                 "ABORTED",
                                 "OUT_OF_RANGE",
                                 "UNIMPLEMENTED",
                                 "INTERNAL",
                                 "UNAVAILABLE",
                                 "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i < 17 ? kNames[i] : "UNKNOWN";
}

namespace {

const char* FinishName(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_CANCELLED:
      return "cancelled";
    case v1::FINISH_REASON_ERROR:
      return "error";
    default:
      return "unspecified";
  }
}

}  // namespace

// One Generate stream. Owns itself: deletes itself in OnDone after handing over its record.
class GenerateCall : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  GenerateCall(GrpcTarget* owner, RequestRecord record, Clock::time_point epoch, Target::Done done)
      : owner_(owner), record_(std::move(record)), epoch_(epoch), done_(std::move(done)) {}

  void Start(const RequestSpec& spec, const SendOptions& o) {
    request_.set_request_id(absl::StrCat("loadtest-", record_.index));
    if (!spec.messages.empty()) {
      for (const ChatMessage& m : spec.messages) {
        v1::ChatMessage* out = request_.mutable_chat()->add_messages();
        out->set_role(m.role);
        out->set_content(m.content);
      }
    } else if (spec.prompt_text.empty()) {
      for (int t : spec.prompt_ids) request_.mutable_token_ids()->add_ids(t);
    } else {
      request_.set_text(spec.prompt_text);
    }
    collect_text_ = o.collect_text;
    request_.mutable_sampling()->set_temperature(static_cast<float>(o.temperature));
    request_.set_max_tokens(spec.max_tokens);
    request_.set_ignore_eos(o.ignore_eos);
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(o.timeout_s));
    owner_->stub_->async()->Generate(&context_, &request_, this);
    sent_ = Clock::now();
    record_.send_s = SecondsSince(epoch_, sent_);
    StartRead(&response_);
    StartCall();
  }

  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows
    const int n = response_.tokens_size();
    if (n > 0) {
      record_.chunk_s.push_back(SecondsSince(sent_, Clock::now()));
      record_.chunk_tokens.push_back(n);
      record_.measured_tokens += n;
    }
    if (collect_text_) record_.output_text += response_.text();
    if (response_.has_finished()) {
      const v1::Finished& f = response_.finished();
      saw_finished_ = true;
      finish_ = f.reason();
      record_.finish_reason = FinishName(f.reason());
      if (f.has_usage()) {
        record_.usage_prompt_tokens = f.usage().prompt_tokens();
        record_.usage_completion_tokens = f.usage().completion_tokens();
        record_.usage_cached_tokens = f.usage().cached_tokens();
      }
    }
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    record_.end_s = SecondsSince(epoch_, Clock::now());
    if (!status.ok()) {
      record_.failure = StatusCodeName(status.error_code());
    } else if (!saw_finished_) {
      record_.failure = "no_finish_message";
    } else if (finish_ == v1::FINISH_REASON_ERROR) {
      record_.failure = "finish_error";
    } else if (finish_ == v1::FINISH_REASON_CANCELLED) {
      record_.failure = "CANCELLED";
    }
    record_.ok = record_.failure.empty();
    Target::Done done = std::move(done_);
    RequestRecord record = std::move(record_);
    owner_->Finished(this);  // after this the owner may be gone: touch nothing of it
    delete this;
    done(std::move(record));
  }

 private:
  GrpcTarget* owner_;
  RequestRecord record_;
  Clock::time_point epoch_, sent_;
  Target::Done done_;
  grpc::ClientContext context_;
  v1::GenerateRequest request_;
  v1::GenerateResponse response_;
  bool saw_finished_ = false, collect_text_ = false;
  v1::FinishReason finish_ = v1::FINISH_REASON_UNSPECIFIED;
};

GrpcTarget::GrpcTarget(const std::string& address, SendOptions options)
    : address_(address), options_(options) {
  grpc::ChannelArguments args;
  // One channel for all streams; no per-channel stream cap beyond the server's.
  args.SetMaxReceiveMessageSize(64 << 20);
  channel_ = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  stub_ = v1::Morserve::NewStub(channel_);
}

GrpcTarget::~GrpcTarget() {
  CancelAll();
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [&] { return open_.empty(); });
}

absl::StatusOr<v1::ModelInfo> GrpcTarget::ModelInfo(int timeout_s) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  const auto end = Clock::now() + std::chrono::seconds(timeout_s);
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    grpc::health::v1::HealthCheckResponse resp;
    const grpc::Status s = health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp);
    if (s.ok() && resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) break;
    if (Clock::now() > end) {
      return absl::UnavailableError(
          absl::StrCat(address_, ": not serving after ", timeout_s, " s (",
                       s.ok() ? "health: not SERVING" : s.error_message(), ")"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ModelInfo info;
  const grpc::Status s = stub_->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
  if (!s.ok())
    return absl::UnavailableError(absl::StrCat(address_, ": GetModelInfo: ", s.error_message()));
  return info;
}

void GrpcTarget::Send(const RequestSpec& spec, RequestRecord record, Clock::time_point epoch,
                      Done done) {
  auto* call = new GenerateCall(this, std::move(record), epoch, std::move(done));
  {
    std::lock_guard<std::mutex> lock(mu_);
    open_.insert(call);
  }
  call->Start(spec, options_);
}

void GrpcTarget::CancelAll() {
  std::lock_guard<std::mutex> lock(mu_);
  for (GenerateCall* call : open_) call->Cancel();
}

void GrpcTarget::Finished(GenerateCall* call) {
  std::lock_guard<std::mutex> lock(mu_);
  open_.erase(call);
  if (open_.empty()) idle_.notify_all();
}

}  // namespace morserve::loadtest
