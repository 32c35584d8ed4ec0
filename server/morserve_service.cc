// The Morserve service (see morserve_service.h).
#include "server/morserve_service.h"

#include "absl/strings/str_cat.h"
#include "engine/tools/engine_flags.h"
#include "server/generate_reactor.h"

namespace morserve {
namespace {

grpc::Status NoTokenizer() {
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                      "model has no tokenizer (no tokenizer.json in the model directory)");
}

grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context, const grpc::Status& s) {
  grpc::ServerUnaryReactor* r = context->DefaultReactor();
  r->Finish(s);
  return r;
}

}  // namespace

const char* ModelFamilyName(const ModelConfig& c) {
  const RecursionConfig& r = c.recursion;
  if (r.layer_kind == LayerKind::kRecurrent) return "recurrent";
  if (!r.present) return "vanilla";
  switch (r.routing) {
    case Routing::kExpertChoice:
      return "mor-ec";
    case Routing::kTokenChoice:
      return "mor-tc";
    case Routing::kEarlyExit:
      return "early-exit";
    case Routing::kNone:
      break;
  }
  return r.lora.rank > 0 ? "relaxed" : "recursive";
}

grpc::ServerWriteReactor<v1::GenerateResponse>* MorserveService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  return GenerateReactor::Start(state_, *request);
}

grpc::ServerUnaryReactor* MorserveService::Tokenize(grpc::CallbackServerContext* context,
                                                    const v1::TokenizeRequest* request,
                                                    v1::TokenizeResponse* response) {
  if (state_->engine.load() == nullptr) {
    return FinishNow(context, grpc::Status(grpc::StatusCode::UNAVAILABLE, "the model is loading"));
  }
  const Tokenizer* tok = state_->text.tokenizer;
  if (tok == nullptr) return FinishNow(context, NoTokenizer());
  const bool chat = request->has_chat();
  const bool add_special =
      request->has_add_special_tokens() ? request->add_special_tokens() : !chat;
  std::string text = request->text();
  if (chat) {
    if (!text.empty()) {
      return FinishNow(context, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                             "text: must be empty when chat is set"));
    }
    if (state_->text.chat_template == nullptr) {
      return FinishNow(context, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                             "chat: model has no chat template"));
    }
    absl::StatusOr<std::string> rendered = RenderChat(request->chat(), *state_->text.chat_template);
    if (!rendered.ok()) {
      return FinishNow(context,
                       grpc::Status(static_cast<grpc::StatusCode>(rendered.status().code()),
                                    std::string(rendered.status().message())));
    }
    text = *std::move(rendered);
  }
  const std::vector<int> ids = tok->Encode(text, add_special);
  response->mutable_ids()->Assign(ids.begin(), ids.end());
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* MorserveService::Detokenize(grpc::CallbackServerContext* context,
                                                      const v1::DetokenizeRequest* request,
                                                      v1::DetokenizeResponse* response) {
  if (state_->engine.load() == nullptr) {
    return FinishNow(context, grpc::Status(grpc::StatusCode::UNAVAILABLE, "the model is loading"));
  }
  const Tokenizer* tok = state_->text.tokenizer;
  if (tok == nullptr) return FinishNow(context, NoTokenizer());
  for (int i = 0; i < request->ids_size(); ++i) {
    const int id = request->ids(i);
    if (id < 0 || id >= tok->vocab_size()) {
      return FinishNow(context,
                       grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                    absl::StrCat("ids: token id ", id, " at index ", i,
                                                 " is outside the tokenizer's vocabulary (",
                                                 tok->vocab_size(), ")")));
    }
  }
  const std::vector<int> ids(request->ids().begin(), request->ids().end());
  response->set_text(tok->Decode(ids, request->skip_special_tokens()));
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* MorserveService::GetModelInfo(grpc::CallbackServerContext* context,
                                                        const v1::GetModelInfoRequest* request,
                                                        v1::ModelInfo* out) {
  const Engine* engine = state_->engine.load();
  if (engine == nullptr) {
    return FinishNow(context, grpc::Status(grpc::StatusCode::UNAVAILABLE, "the model is loading"));
  }
  const ModelConfig& c = engine->weights().config;
  const EngineConfig& ec = engine->config();
  const EngineStats st = engine->stats();
  out->set_model_dir(state_->model_dir);
  out->set_family(ModelFamilyName(c));
  out->set_plan(engine->weights().plan.Describe());
  out->set_context_length(c.max_position_embeddings);
  out->set_vocab_size(c.vocab_size);
  out->set_num_recursions(c.recursion.present ? c.recursion.num_recursions : 1);
  out->set_kv_block_size(ec.block_size);
  out->set_kv_blocks_total(st.kv_blocks_total);
  out->set_kv_blocks_used(st.kv_blocks_used);
  out->set_has_tokenizer(state_->text.tokenizer != nullptr);
  out->set_has_chat_template(state_->text.chat_template != nullptr);
  out->set_batching_mode(BatchingModeName(ec.mode));
  out->set_max_batch_rows(ec.max_batch_rows);
  out->set_prefix_cache(ec.prefix_cache);
  out->set_requests_running(st.running);
  out->set_requests_waiting(st.waiting);
  out->mutable_eos_token_ids()->Assign(c.eos_token_ids.begin(), c.eos_token_ids.end());
  return FinishNow(context, grpc::Status::OK);
}

}  // namespace morserve
