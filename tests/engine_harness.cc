// Engine test helpers (see engine_harness.h).
#include "tests/engine_harness.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <random>

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

TinyModelSpec NarrowSpec(const std::string& family) {
  TinyModelSpec s;
  s.family = family;
  s.hidden = 32;
  s.heads = 4;
  s.kv_heads = 2;
  s.intermediate = 64;
  s.vocab = 64;
  return s;
}

std::vector<FamilyCase> EngineFamilies(
    const std::function<TinyModelSpec(const std::string& family)>& spec) {
  std::vector<FamilyCase> v;
  for (const char* f :
       {"vanilla", "recursive-cycle", "recursive-sequence", "recursive-middle-cycle",
        "recursive-middle-sequence", "recursive-untied-attn", "mor-ec", "mor-tc"}) {
    v.push_back({f, spec(f)});
  }
  TinyModelSpec ec_mlp = spec("mor-ec");
  ec_mlp.router = "mlp";
  ec_mlp.activation = "tanh";
  v.push_back({"mor-ec-mlp-tanh", ec_mlp});
  TinyModelSpec ec_cycle = spec("mor-ec");
  ec_cycle.sharing = "cycle";
  ec_cycle.aux_router = true;
  ec_cycle.gating = "additive";
  v.push_back({"mor-ec-cycle-aux-additive", ec_cycle});
  TinyModelSpec ec_shared = spec("mor-ec");
  ec_shared.kv = "shared";
  v.push_back({"mor-ec-kv-shared", ec_shared});
  TinyModelSpec ec_low = spec("mor-ec");
  ec_low.capacity = {0.5f, 0.5f, 0.5f};  // loop 0 decided by the router too: some run 0 loops
  v.push_back({"mor-ec-router-loop0", ec_low});
  TinyModelSpec tc_shared = spec("mor-tc");
  tc_shared.kv = "shared";
  tc_shared.router_bias = 0.3f;
  v.push_back({"mor-tc-kv-shared", tc_shared});
  TinyModelSpec tc_mlp = spec("mor-tc");
  tc_mlp.router = "mlp";
  v.push_back({"mor-tc-mlp", tc_mlp});
  v.push_back({"relaxed-lora", spec("relaxed-lora")});
  // Tiny models are unsure: a 0.2 bar gives exits after 1, 2 and 3 loops.
  TinyModelSpec early = spec("early-exit");
  early.exit_kv = "skip";
  early.exit_threshold = 0.2f;
  v.push_back({"early-exit-skip", early});
  early.exit_kv = "propagate";
  v.push_back({"early-exit-propagate", early});
  // K/V-only rows through per-loop attention copies and LoRA on k and v.
  early.untied_attention = true;
  early.lora_rank = 4;
  early.lora_targets = {"q_proj", "k_proj", "v_proj"};
  v.push_back({"early-exit-propagate-untied-lora", early});
  v.push_back({"recurrent", spec("recurrent")});
  TinyModelSpec recurrent_mor = spec("mor-ec");
  recurrent_mor.layer_kind = "recurrent";
  v.push_back({"recurrent-mor-ec", recurrent_mor});
  TinyModelSpec cycle_shared = spec("recursive-cycle");
  cycle_shared.kv = "shared";
  v.push_back({"recursive-cycle-kv-shared", cycle_shared});
  TinyModelSpec tied = spec("vanilla");
  tied.tie_embeddings = true;
  v.push_back({"vanilla-tied-embeddings", tied});
  // Nanbeige4.2's layout: the whole stack looped with the final norm between loops, q/o not
  // square (head_dim twice hidden / heads, as released).
  TinyModelSpec nanbeige = spec("nanbeige");
  nanbeige.head_dim = 2 * nanbeige.hidden / nanbeige.heads;
  v.push_back({"nanbeige", nanbeige});
  // Ouro's layout: sandwich layers, the whole stack looped with the norm after every loop.
  // Full mode; then adaptive (looped.json), where decode tokens exit at the gate's cumulative
  // threshold (0.55 gives exits after 1, 2 and 3 loops) and copy their entries on exit.
  TinyModelSpec ouro = spec("ouro");
  ouro.exit_threshold = 0.55f;
  v.push_back({"ouro-full", ouro});
  ouro.loop_mode = "adaptive";
  v.push_back({"ouro-adaptive", ouro});
  // Huginn-0125's layout: prelude, 4 recurrences of a 2-layer core with input injection, coda;
  // full mode, then adaptive, where decode tokens exit by the KL rule (3.7 nats gives exits
  // after 1, 2 and 3 recurrences on these random weights) and copy their entries on exit.
  TinyModelSpec huginn = spec("huginn");
  huginn.prelude_layers = 1;
  huginn.coda_layers = 1;
  huginn.recursions = 4;
  huginn.layers = 1 + 2 * 4 + 1;
  huginn.exit_threshold = 3.7f;
  huginn.loop_mode = "full";
  v.push_back({"huginn-full", huginn});
  huginn.loop_mode = "adaptive";
  v.push_back({"huginn-adaptive", huginn});
  return v;
}

void PrintTo(const FamilyCase& c, std::ostream* os) { *os << c.name; }

std::string FamilyCaseName(const ::testing::TestParamInfo<FamilyCase>& info) {
  std::string n = info.param.name;
  for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return n;
}

std::vector<std::vector<int>> MakePrompts(int count, int min_len, int max_len, int vocab,
                                          uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int>> out;
  for (int i = 0; i < count; ++i) {
    const int len =
        min_len + static_cast<int>(rng() % static_cast<uint64_t>(max_len - min_len + 1));
    std::vector<int> p(len);
    for (int& t : p) t = static_cast<int>(rng() % static_cast<uint64_t>(vocab));
    out.push_back(p);
  }
  return out;
}

Workload MakeWorkload(int vocab, int count) {
  Workload w;
  auto prompts = MakePrompts(count, 1, 24, vocab, 7);
  for (int i = 0; i < count; ++i) {
    w.requests.push_back(Greedy(prompts[i], 6 + i % 5));
    w.arrivals.push_back((i * 3) % 11);
  }
  return w;
}

RefLogprob ReferenceLogprob(const std::vector<float>& logits, int token) {
  RefLogprob r;
  double m = -INFINITY, z = 0;
  for (float x : logits) {
    m = std::max(m, static_cast<double>(x));
    r.scale = std::max(r.scale, std::fabs(static_cast<double>(x)));
  }
  for (float x : logits) z += std::exp(x - m);
  r.logprob = logits[token] - m - std::log(z);
  return r;
}

RunResult RunAlone(const std::shared_ptr<const ModelWeights>& weights,
                   const GenerateRequest& request) {
  auto engine = Engine::Create(weights, EngineConfig());
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return RunResult();
  auto ch = (*engine)->Submit(request);
  EXPECT_TRUE(ch.ok()) << ch.status();
  if (!ch.ok()) return RunResult();
  (*engine)->RunUntilIdle();
  return Collect(ch->get());
}

RunResult Collect(EventChannel* channel) {
  RunResult r;
  for (RequestEvent& e : channel->DrainUntilFinal()) {
    for (TokenEvent& t : e.tokens) {
      r.tokens.push_back(t.token);
      r.logprobs.push_back(t.logprob);
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
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]) /
                        std::max(1.0, std::fabs(static_cast<double>(b[i]))));
  }
  return m;
}

double MaxScaledDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double scale = 1, m = 0;
  for (float v : b) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  for (size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m / scale;
}

TinyModelSpec GpuModelSpec(const std::string& family) {
  TinyModelSpec s;
  s.family = family;
  s.dtype = DType::kBF16;
  s.hidden = 256;
  s.heads = 4;
  s.kv_heads = 2;
  s.intermediate = 256;
  return s;
}

double Margin(const std::vector<float>& l) {
  float a = -INFINITY, b = -INFINITY;
  for (float v : l) {
    if (v > a) {
      b = a;
      a = v;
    } else if (v > b) {
      b = v;
    }
  }
  return (static_cast<double>(a) - b) / std::max(1.0, std::abs(static_cast<double>(a)));
}

std::vector<RefRun> ReferenceRuns(std::shared_ptr<const ModelWeights> weights,
                                  const std::vector<GenerateRequest>& requests) {
  const double threshold = weights->config.recursion.early_exit.threshold;
  ReferenceModel ref(std::move(weights));
  std::vector<RefRun> runs(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    runs[i].tokens =
        ref.GenerateGreedy(requests[i].prompt, requests[i].params.max_tokens, &runs[i].outs);
    for (size_t p = 0; p + 1 < requests[i].prompt.size(); ++p) {
      for (double c : runs[i].outs[p].trace.exit_confidence)
        runs[i].unclear_prompt = runs[i].unclear_prompt || std::fabs(c - threshold) <= kGpuMargin;
    }
  }
  return runs;
}

void CompareWithReference(const std::vector<RefRun>& refs,
                          const std::vector<GenerateRequest>& requests,
                          const std::vector<RunResult>& got, const std::string& label,
                          Tally* tally) {
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerateRequest& r = requests[i];
    const std::vector<int>& want = refs[i].tokens;
    const std::vector<StepOutput>& outs = refs[i].outs;
    ASSERT_EQ(got[i].tokens.size(), want.size()) << label << " request " << i;
    ASSERT_EQ(got[i].logits.size(), want.size()) << label << " request " << i;
    tally->generated += static_cast<int>(want.size());
    if (refs[i].unclear_prompt) continue;
    for (size_t t = 0; t < want.size(); ++t) {
      const StepOutput& o = outs[r.prompt.size() - 1 + t];
      if (Margin(o.logits) <= kGpuMargin) break;
      if (got[i].loops[t] != o.trace.loops) {
        ++tally->loop_flips;
        break;
      }
      ++tally->compared;
      ASSERT_EQ(got[i].tokens[t], want[t]) << label << " request " << i << " token " << t;
      EXPECT_LE(MaxScaledDiff(got[i].logits[t], o.logits), kGpuLogitTolerance)
          << label << " request " << i << " token " << t;
    }
  }
}

int ExpectLoopSlotsMatchReference(const Engine& engine, const Sequence& seq, ReferenceModel& ref,
                                  const std::string& label) {
  const ModelWeights& w = engine.weights();
  const LayerPlan& plan = w.plan;
  std::vector<int> loops;
  for (int t = 0; t < seq.num_done; ++t)
    loops.push_back(ref.Step(seq.tokens[t], t < seq.num_prompt).trace.loops);
  const int kvd = w.config.kv_dim();
  auto read = [&](int slot, int position, std::vector<float>* k, std::vector<float>* v) {
    const KvBlockTable& table = seq.kv->slot(slot);
    const int index = table.IndexOf(position);
    if (index < 0) return false;
    k->resize(kvd);
    v->resize(kvd);
    engine.runner().ReadKv(table.PhysicalSlot(index), k->data(), v->data());
    return true;
  };
  const int looped = plan.looped_segment;
  int copies = 0;
  for (int loop = 0; loop < plan.segments[looped].loops; ++loop) {
    for (int k = 0; k < plan.segments[looped].num_layers; ++k) {
      const int slot = plan.CacheSlot(looped, loop, k);
      const auto& want = ref.SlotContents(slot);
      if (static_cast<int>(want.size()) != seq.num_done) {
        ADD_FAILURE() << label << ": the reference slot holds " << want.size() << " entries";
        return copies;
      }
      for (int p = 0; p < seq.num_done; ++p) {
        const std::string where = label + " loop " + std::to_string(loop) + " layer " +
                                  std::to_string(k) + " position " + std::to_string(p);
        std::vector<float> key, value;
        if (!read(slot, p, &key, &value)) {
          // Copies still to come ride the loop as K/V-only rows.
          bool owed = false;
          for (const Row& row : engine.scheduler().loop_rows()) {
            owed =
                owed || (row.seq == &seq && row.position == p && row.kv_only && row.loop <= loop);
          }
          EXPECT_TRUE(owed) << where << ": no entry and none owed";
          continue;
        }
        EXPECT_LE(MaxRelDiff(key, want[p].k), 1e-4) << where << " K";
        EXPECT_LE(MaxRelDiff(value, want[p].v), 1e-4) << where << " V";
        const int exit_loop = loops[p] - 1;
        if (loop <= exit_loop) continue;
        std::vector<float> src_k, src_v;
        if (!read(plan.CacheSlot(looped, exit_loop, k), p, &src_k, &src_v)) {
          ADD_FAILURE() << where << ": no exit-loop entry";
          continue;
        }
        EXPECT_EQ(key, src_k) << where << ": a copy on exit must equal the exit loop's entry";
        EXPECT_EQ(value, src_v) << where;
        ++copies;
      }
    }
  }
  return copies;
}

}  // namespace morserve::testing
