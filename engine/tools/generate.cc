// `morserve generate`: runs the engine on one prompt and prints the tokens with their loop
// counts and logprobs (text, or JSON with --json); --prompt-logprobs K scores the prompt too
// (JSON "prompt_logprobs": null for the first token, then {id, logprob, rank, top_logprobs}),
// and with it --max-tokens 0 scores without generating.
//
// Prompts are token ids (--prompt-ids 1,2,3). --prompt TEXT maps UTF-8 bytes to ids 0..255;
// it is only accepted for models without tokenizer.json and a vocabulary of at least 256
// (the tiny models of `morserve mkmodel`); tokenizer.json support is its own component.
#include <cstdio>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/model/weights.h"
#include "engine/runtime/engine.h"
#include "engine/tools/commands.h"
#include "engine/tools/engine_flags.h"
#include "nlohmann/json.hpp"

namespace morserve {
namespace {

constexpr char kUsage[] =
    "usage: morserve generate --model DIR (--prompt-ids 1,2,3 | --prompt TEXT)\n"
    "         [--max-tokens 16] [--temperature 0] [--top-k 0] [--top-p 1] [--min-p 0]\n"
    "         [--seed S] [--logprobs N] [--prompt-logprobs K] [--stop-ids a,b] [--ignore-eos]\n"
    "         [--min-tokens N] [--logit-bias ID:BIAS,...] [--allowed-ids a,b] [--json]\n"
    "         [--loop-mode full|adaptive] [--exit-threshold Q] (looped models with an exit rule)\n"
    "         [engine flags: --mode depth|sequence --weights auto|f32|bf16|f16|int8 --max-batch N "
    "...]\n";

absl::StatusOr<std::vector<int>> PromptFromFlags(const Flags& f, const ModelConfig& c,
                                                 const std::string& dir) {
  std::vector<int> ids;
  if (f.Has("prompt-ids")) {
    for (const std::string& s : f.GetList("prompt-ids")) {
      int v;
      if (!absl::SimpleAtoi(s, &v))
        return absl::InvalidArgumentError("--prompt-ids: not an integer: " + s);
      ids.push_back(v);
    }
    return ids;
  }
  if (!f.Has("prompt")) return absl::InvalidArgumentError("--prompt-ids or --prompt is required");
  if (std::filesystem::exists(dir + "/tokenizer.json") || c.vocab_size < 256) {
    return absl::UnimplementedError(
        "--prompt TEXT needs a tokenizer; this build reads only token ids (--prompt-ids)");
  }
  for (unsigned char ch : f.Get("prompt")) ids.push_back(ch);
  return ids;
}

// --min-tokens N, --logit-bias ID:BIAS,... and --allowed-ids a,b (ranges: the engine's
// Validate, so its errors name min_tokens / logit_bias / allowed_token_ids).
absl::Status ApplyTokenConstraints(const Flags& f, SamplingParams* p) {
  auto min_tokens = f.GetInt("min-tokens", 0);
  if (!min_tokens.ok()) return min_tokens.status();
  p->min_tokens = *min_tokens;
  for (const std::string& s : f.GetList("logit-bias")) {
    const size_t colon = s.find(':');
    int id;
    float bias;
    if (colon == std::string::npos || !absl::SimpleAtoi(s.substr(0, colon), &id) ||
        !absl::SimpleAtof(s.substr(colon + 1), &bias)) {
      return absl::InvalidArgumentError("--logit-bias: expected ID:BIAS, got " + s);
    }
    p->logit_bias.emplace_back(id, bias);
  }
  if (f.Has("allowed-ids")) {
    p->allowed_token_ids.emplace();
    for (const std::string& s : f.GetList("allowed-ids")) {
      int v;
      if (!absl::SimpleAtoi(s, &v))
        return absl::InvalidArgumentError("--allowed-ids: not an integer: " + s);
      p->allowed_token_ids->push_back(v);
    }
  }
  return absl::OkStatus();
}

absl::Status ApplySampling(const Flags& f, SamplingParams* p) {
  auto max_tokens = f.GetInt("max-tokens", 16);
  auto temperature = f.GetDouble("temperature", 0.0);
  auto top_k = f.GetInt("top-k", 0);
  auto top_p = f.GetDouble("top-p", 1.0);
  auto min_p = f.GetDouble("min-p", 0.0);
  auto logprobs = f.GetInt("logprobs", 0);
  for (const absl::Status& s : {max_tokens.status(), temperature.status(), top_k.status(),
                                top_p.status(), min_p.status(), logprobs.status()}) {
    if (!s.ok()) return s;
  }
  p->max_tokens = *max_tokens;
  p->temperature = static_cast<float>(*temperature);
  p->top_k = *top_k;
  p->top_p = static_cast<float>(*top_p);
  p->min_p = static_cast<float>(*min_p);
  p->logprobs = *logprobs;
  if (f.Has("prompt-logprobs")) {
    auto k = f.GetInt("prompt-logprobs", 0);
    if (!k.ok()) return k.status();
    p->prompt_logprobs = *k;
  }
  p->ignore_eos = f.Has("ignore-eos");
  if (f.Has("seed")) {
    uint64_t seed;
    if (!absl::SimpleAtoi(f.Get("seed"), &seed))
      return absl::InvalidArgumentError("--seed: not an integer");
    p->seed = seed;
  }
  for (const std::string& s : f.GetList("stop-ids")) {
    int v;
    if (!absl::SimpleAtoi(s, &v))
      return absl::InvalidArgumentError("--stop-ids: not an integer: " + s);
    p->stop_token_ids.push_back(v);
  }
  return ApplyTokenConstraints(f, p);
}

nlohmann::json EventsToJson(const std::vector<RequestEvent>& events,
                            const std::vector<int>& prompt) {
  nlohmann::json tokens = nlohmann::json::array();
  nlohmann::json out = {{"prompt_ids", prompt}};
  for (const RequestEvent& e : events) {
    if (e.prompt_logprobs) {
      nlohmann::json scored = nlohmann::json::array({nullptr});
      for (const PromptTokenLogprob& p : *e.prompt_logprobs) {
        nlohmann::json top = nlohmann::json::array();
        for (const TokenLogprob& lp : p.top_logprobs)
          top.push_back({{"id", lp.token}, {"logprob", lp.logprob}});
        scored.push_back(
            {{"id", p.token}, {"logprob", p.logprob}, {"rank", p.rank}, {"top_logprobs", top}});
      }
      out["prompt_logprobs"] = std::move(scored);
    }
    for (const TokenEvent& t : e.tokens) {
      nlohmann::json top = nlohmann::json::array();
      for (const TokenLogprob& lp : t.top_logprobs)
        top.push_back({{"id", lp.token}, {"logprob", lp.logprob}});
      tokens.push_back(
          {{"id", t.token}, {"logprob", t.logprob}, {"loops", t.loops}, {"top_logprobs", top}});
    }
    if (e.final()) {
      out["finish_reason"] = FinishReasonName(e.finish);
      if (!e.error.ok()) out["error"] = std::string(e.error.message());
      out["usage"] = {{"prompt_tokens", e.usage.prompt_tokens},
                      {"completion_tokens", e.usage.completion_tokens},
                      {"total_tokens", e.usage.prompt_tokens + e.usage.completion_tokens},
                      {"recursion_loops", e.usage.recursion_loops}};
    }
  }
  out["tokens"] = tokens;
  return out;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "morserve generate: %s\n", std::string(s.message()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

// --loop-mode and --exit-threshold: the request's looped-model parameters
// (docs/models.md#serving-looped-checkpoints; the engine refuses what the model cannot do).
absl::Status ApplyLoopFlags(const Flags& f, GenerateRequest* r) {
  if (f.Has("loop-mode")) {
    const std::string m = f.Get("loop-mode");
    if (m != "full" && m != "adaptive") {
      return absl::InvalidArgumentError("--loop-mode: expected full or adaptive, got '" + m + "'");
    }
    r->loop_mode = m == "adaptive" ? LoopMode::kAdaptive : LoopMode::kFull;
  }
  if (f.Has("exit-threshold")) {
    float q = 0;
    if (!absl::SimpleAtof(f.Get("exit-threshold"), &q)) {
      return absl::InvalidArgumentError("--exit-threshold: not a number: " +
                                        f.Get("exit-threshold"));
    }
    r->exit_threshold = q;
  }
  return absl::OkStatus();
}

}  // namespace

int GenerateCommand(const Args& args) {
  std::set<std::string> value_flags = {
      "model",      "prompt-ids", "prompt",      "max-tokens", "temperature",     "top-k",
      "top-p",      "min-p",      "seed",        "logprobs",   "prompt-logprobs", "stop-ids",
      "min-tokens", "logit-bias", "allowed-ids", "loop-mode",  "exit-threshold"};
  value_flags.insert(EngineFlagNames().begin(), EngineFlagNames().end());
  auto flags = Flags::Parse(args, value_flags, {"json", "ignore-eos", "help"});
  if (!flags.ok()) {
    std::fprintf(stderr, "morserve generate: %s\n%s", std::string(flags.status().message()).c_str(),
                 kUsage);
    return 2;
  }
  if (flags->Has("help") || !flags->Has("model")) {
    std::fputs(kUsage, flags->Has("help") ? stdout : stderr);
    return flags->Has("help") ? 0 : 2;
  }
  auto engine_config = EngineConfigFromFlags(*flags);
  if (!engine_config.ok()) return Fail(engine_config.status());
  const std::string dir = flags->Get("model");
  auto weights = LoadModel(dir);
  if (!weights.ok()) return Fail(weights.status());
  GenerateRequest request;
  request.request_id = "generate";
  auto prompt = PromptFromFlags(*flags, (*weights)->config, dir);
  if (!prompt.ok()) return Fail(prompt.status());
  request.prompt = *prompt;
  if (auto s = ApplySampling(*flags, &request.params); !s.ok()) return Fail(s);
  if (auto s = ApplyLoopFlags(*flags, &request); !s.ok()) return Fail(s);
  auto engine = Engine::Create(*weights, *engine_config);
  if (!engine.ok()) return Fail(engine.status());
  auto channel = (*engine)->Submit(request);
  if (!channel.ok()) return Fail(channel.status());
  (*engine)->RunUntilIdle();
  const std::vector<RequestEvent> events = (*channel)->DrainUntilFinal();
  const nlohmann::json out = EventsToJson(events, request.prompt);
  if (flags->Has("json")) {
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::string ids, loops;
    for (const auto& t : out["tokens"]) {
      absl::StrAppend(&ids, ids.empty() ? "" : " ", t["id"].get<int>());
      absl::StrAppend(&loops, loops.empty() ? "" : " ", t["loops"].get<int>());
    }
    std::printf("tokens: %s\nloops:  %s\nfinish: %s\n", ids.c_str(), loops.c_str(),
                out["finish_reason"].get<std::string>().c_str());
  }
  return out.contains("error") ? 1 : 0;
}

}  // namespace morserve
