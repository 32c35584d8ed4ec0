// Engine test helpers (see engine_harness.h).
#include "tests/engine_harness.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <random>

#include <gtest/gtest.h>

namespace morserve::testing {

std::shared_ptr<const ModelWeights> MakeModel(const TinyModelSpec& spec, TempDir* dir) {
  const std::string path = dir->File(spec.family);
  absl::Status s = WriteTinyModel(spec, path);
  if (!s.ok()) {
    ADD_FAILURE() << "mkmodel " << spec.family << ": " << s;
    return nullptr;
  }
  auto w = LoadModel(path);
  if (!w.ok()) {
    ADD_FAILURE() << "load " << spec.family << ": " << w.status();
    return nullptr;
  }
  return *w;
}

TinyModelSpec F32Spec(const std::string& family) {
  TinyModelSpec s;
  s.family = family;
  s.dtype = DType::kF32;
  return s;
}

std::vector<FamilyCase> EngineFamilies() {
  std::vector<FamilyCase> v;
  for (const char* f : {"vanilla", "recursive-cycle", "recursive-sequence", "recursive-middle-cycle",
                        "recursive-middle-sequence", "recursive-untied-attn", "mor-ec", "mor-tc"}) {
    v.push_back({f, F32Spec(f)});
  }
  TinyModelSpec ec_mlp = F32Spec("mor-ec");
  ec_mlp.router = "mlp";
  ec_mlp.activation = "tanh";
  v.push_back({"mor-ec-mlp-tanh", ec_mlp});
  TinyModelSpec ec_cycle = F32Spec("mor-ec");
  ec_cycle.sharing = "cycle";
  ec_cycle.aux_router = true;
  ec_cycle.gating = "additive";
  v.push_back({"mor-ec-cycle-aux-additive", ec_cycle});
  TinyModelSpec ec_shared = F32Spec("mor-ec");
  ec_shared.kv = "shared";
  v.push_back({"mor-ec-kv-shared", ec_shared});
  TinyModelSpec ec_low = F32Spec("mor-ec");
  ec_low.capacity = {0.5f, 0.5f, 0.5f};  // loop 0 decided by the router too: some run 0 loops
  v.push_back({"mor-ec-router-loop0", ec_low});
  TinyModelSpec tc_shared = F32Spec("mor-tc");
  tc_shared.kv = "shared";
  tc_shared.router_bias = 0.3f;
  v.push_back({"mor-tc-kv-shared", tc_shared});
  v.push_back({"relaxed-lora", F32Spec("relaxed-lora")});
  TinyModelSpec early = F32Spec("early-exit");
  early.exit_kv = "skip";
  early.exit_threshold = 0.2f;  // tiny models are unsure: this bar gives exits after 1, 2 and 3 loops
  v.push_back({"early-exit-skip", early});
  early.exit_kv = "propagate";
  v.push_back({"early-exit-propagate", early});
  // K/V-only rows through per-loop attention copies and LoRA on k and v.
  early.untied_attention = true;
  early.lora_rank = 4;
  early.lora_targets = {"q_proj", "k_proj", "v_proj"};
  v.push_back({"early-exit-propagate-untied-lora", early});
  v.push_back({"recurrent", F32Spec("recurrent")});
  TinyModelSpec recurrent_mor = F32Spec("mor-ec");
  recurrent_mor.layer_kind = "recurrent";
  v.push_back({"recurrent-mor-ec", recurrent_mor});
  TinyModelSpec cycle_shared = F32Spec("recursive-cycle");
  cycle_shared.kv = "shared";
  v.push_back({"recursive-cycle-kv-shared", cycle_shared});
  return v;
}

std::string CaseName(const FamilyCase& c) {
  std::string n = c.name;
  for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return n;
}

std::vector<std::vector<int>> MakePrompts(int count, int min_len, int max_len, int vocab,
                                          uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int>> out;
  for (int i = 0; i < count; ++i) {
    const int len = min_len + static_cast<int>(rng() % static_cast<uint64_t>(max_len - min_len + 1));
    std::vector<int> p(len);
    for (int& t : p) t = static_cast<int>(rng() % static_cast<uint64_t>(vocab));
    out.push_back(p);
  }
  return out;
}

RunResult Collect(EventChannel* channel) {
  RunResult r;
  for (RequestEvent& e : channel->DrainUntilFinal()) {
    for (TokenEvent& t : e.tokens) {
      r.tokens.push_back(t.token);
      r.logits.push_back(std::move(t.logits));
      r.loops.push_back(t.loops);
    }
    if (e.prompt_logprobs) {
      r.prompt_logprobs = std::move(e.prompt_logprobs);
      ++r.prompt_logprob_events;
    }
    if (e.final()) {
      r.finish = e.finish;
      r.usage = e.usage;
    }
  }
  return r;
}

std::vector<RunResult> RunStaggered(Engine* engine, const std::vector<GenerateRequest>& requests,
                                    const std::vector<int>& arrival_step) {
  std::vector<std::shared_ptr<EventChannel>> channels(requests.size());
  const int last = *std::max_element(arrival_step.begin(), arrival_step.end());
  for (int step = 0; step <= last; ++step) {
    for (size_t i = 0; i < requests.size(); ++i) {
      if (arrival_step[i] != step) continue;
      auto ch = engine->Submit(requests[i]);
      EXPECT_TRUE(ch.ok()) << ch.status();
      if (ch.ok()) channels[i] = *ch;
    }
    engine->Step();
  }
  engine->RunUntilIdle();
  std::vector<RunResult> out;
  for (auto& ch : channels) out.push_back(ch ? Collect(ch.get()) : RunResult{});
  return out;
}

GenerateRequest Greedy(const std::vector<int>& prompt, int max_tokens) {
  GenerateRequest r;
  r.prompt = prompt;
  r.params.temperature = 0.0f;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  r.return_logits = true;
  return r;
}

double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]) / std::max(1.0, std::fabs(static_cast<double>(b[i]))));
  }
  return m;
}

}  // namespace morserve::testing
