// Model execution over mixed-depth rows (see model_executor.h).
#include "engine/runtime/model_executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>

#include "engine/core/check.h"
#include "engine/model/huginn_state.h"
#include "engine/runtime/layer_batch.h"
#include "engine/runtime/prompt_logprobs.h"
#include "engine/runtime/row_sampler.h"

namespace morserve {
namespace {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Max softmax probability of one row of logits (fp64, as the reference computes it).
double MaxProb(const float* logits, int vocab) {
  const double m = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(logits[i] - m);
  return 1.0 / sum;
}

}  // namespace

ModelExecutor::ModelExecutor(std::shared_ptr<const ModelWeights> weights, ModelRunner* runner,
                             KvBlockPool* pool)
    : weights_(std::move(weights)),
      cfg_(weights_->config),
      plan_(weights_->plan),
      runner_(runner),
      pool_(pool) {}

std::vector<int32_t> ModelExecutor::Slots(const std::vector<Row*>& rows, StateSlot Row::*state) {
  std::vector<int32_t> ids(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) ids[i] = (rows[i]->*state).id();
  return ids;
}

// Whether the row is its sequence's last known token: the one whose tail samples the next.
bool ModelExecutor::IsLastKnown(const Row& row) {
  return row.position == static_cast<int>(row.seq->tokens.size()) - 1;
}

void ModelExecutor::Write(const std::vector<Row*>& rows, const std::vector<float>& h) {
  if (!rows.empty())
    runner_->WriteStates(Slots(rows).data(), static_cast<int>(rows.size()), h.data());
}

// A new state for each row at `state`, a copy of its `from` state.
void ModelExecutor::CopyState(const std::vector<Row*>& rows, StateSlot Row::*from,
                              StateSlot Row::*state) {
  if (rows.empty()) return;
  for (Row* r : rows) r->*state = slots_.Acquire();
  runner_->CopyStates(Slots(rows, from).data(), Slots(rows, state).data(),
                      static_cast<int>(rows.size()));
}

// Write first (in row order: one request's rows are in position order), then attend to the
// entries at positions <= the row's own. Recurrent layers attend to earlier persistent
// pairs plus their temporary one, and write after the layer output exists.
// With `writes`, the rows' entries are new: each goes after its table's recorded entries and
// this call's earlier new ones, and is listed in *writes. Without, they are recorded already
// (the layers after the loop: DepthScheduler::Update records them before the tail runs).
LayerKvPlan ModelExecutor::PlanLayer(int segment, int k, const std::vector<Row*>& rows,
                                     std::vector<KvWrite>* writes) const {
  LayerKvPlan kv;
  kv.recurrent = cfg_.recursion.layer_kind == LayerKind::kRecurrent;
  const size_t n = rows.size();
  kv.write_slot.assign(n, -1);
  kv.kv_len.assign(n, 0);
  kv.table_indptr.assign(1, 0);
  std::vector<KvBlockTable*> tables(n);
  std::map<const KvBlockTable*, std::vector<int>> fresh;  // new positions per table, in order
  for (size_t i = 0; i < n; ++i) {
    const Row& r = *rows[i];
    const int slot = plan_.CacheSlot(segment, r.loop, k);
    KvBlockTable& table = r.seq->kv->slot(slot);
    tables[i] = &table;
    if (!plan_.WritesKv(segment, r.loop)) continue;
    int index = -1;
    const bool after_loop = plan_.looped_segment >= 0 && segment > plan_.looped_segment;
    if (writes == nullptr) {
      index = table.IndexOf(r.position);
      MORSERVE_CHECK(index >= 0, "a KV entry of the layers after the loop was not recorded");
    } else if (after_loop && (index = table.IndexOf(r.position)) >= 0) {
      // Huginn's exit check runs the coda again on a later recurrence's state: it rewrites the
      // token's recorded entry (the last write stays).
    } else {
      std::vector<int>& mine = fresh[&table];
      const int last = !mine.empty()            ? mine.back()
                       : table.num_tokens() > 0 ? table.positions().back()
                                                : -1;
      MORSERVE_CHECK(r.position > last, "KV entries of a slot must be written in position order");
      index = table.num_tokens() + static_cast<int>(mine.size());
      mine.push_back(r.position);
      writes->push_back({r.seq, slot, r.position});
    }
    MORSERVE_CHECK(index < table.capacity(), "KV entry was not reserved before the pass");
    kv.write_slot[i] = table.PhysicalSlot(index);
  }
  for (size_t i = 0; i < n; ++i) {
    // Entries at positions <= p: recorded ones plus this call's new ones.
    auto visible = [&](int p) {
      int count = tables[i]->NumVisible(p);
      if (auto it = fresh.find(tables[i]); it != fresh.end()) {
        count += static_cast<int>(std::upper_bound(it->second.begin(), it->second.end(), p) -
                                  it->second.begin());
      }
      return count;
    };
    const int pos = rows[i]->position;
    kv.kv_len[i] = !kv.recurrent ? visible(pos) : pos == 0 ? 0 : visible(pos - 1);
    for (int b : tables[i]->blocks()) kv.table_blocks.push_back(b);
    kv.table_indptr.push_back(static_cast<int32_t>(kv.table_blocks.size()));
  }
  if (kv.recurrent) kv.chunk_indptr = RecurrentChunks(tables, kv.write_slot);
  return kv;
}

// Runs of rows that append to the same cache slot of one request (rows arrive grouped by
// request and loop, in position order). Every slot must form one run: a chunk's rows see
// only the cached entries and the chunk's own earlier rows.
std::vector<int32_t> ModelExecutor::RecurrentChunks(const std::vector<KvBlockTable*>& tables,
                                                    const std::vector<int32_t>& write_slot) {
  std::vector<int32_t> indptr(1, 0);
  std::set<const KvBlockTable*> seen;
  const size_t n = tables.size();
  for (size_t i = 0; i < n; ++i) {
    const bool joins =
        i > 0 && tables[i] == tables[i - 1] && write_slot[i] >= 0 && write_slot[i - 1] >= 0;
    if (!joins) {
      if (i > 0) indptr.push_back(static_cast<int32_t>(i));
      MORSERVE_CHECK(write_slot[i] < 0 || seen.insert(tables[i]).second,
                     "a request's rows at one cache slot are split across a batch");
    }
  }
  if (n > 0) indptr.push_back(static_cast<int32_t>(n));
  return indptr;
}

// Copy-on-exit rows (Row::kv_copy_loop) of one layer: their entries in this layer's slot are
// copies of their exit loop's entries, which earlier passes wrote.
void ModelExecutor::CopyOnExitEntries(int segment, int k, const std::vector<Row*>& rows,
                                      const LayerKvPlan& kv, std::vector<KvCopy>* copies) const {
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = *rows[i];
    if (r.kv_copy_loop < 0) continue;
    const KvBlockTable& source = r.seq->kv->slot(plan_.CacheSlot(segment, r.kv_copy_loop, k));
    const int index = source.IndexOf(r.position);
    MORSERVE_CHECK(index >= 0 && kv.write_slot[i] >= 0, "copy on exit without its source entry");
    copies->push_back({source.PhysicalSlot(index), kv.write_slot[i], 1});
  }
}

// Every layer of `segment` over `rows`, whose states are slots[i] (updated in place): each
// layer's plan first, then the copy-on-exit entries of every layer in one copy (their sources
// are entries of earlier passes, so they may all precede the layers), then one runner call over
// the other rows, K/V-only rows first (each kind keeps the rows' order, so stays grouped by
// loop).
void ModelExecutor::RunLayers(int segment, std::vector<Row*>& rows,
                              const std::vector<int32_t>& slots, std::vector<KvWrite>* writes) {
  const int num_layers = plan_.segments[segment].num_layers;
  std::vector<LayerKvPlan> planned(num_layers);
  std::vector<KvCopy> copies;
  for (int k = 0; k < num_layers; ++k) {
    planned[k] = PlanLayer(segment, k, rows, writes);
    CopyOnExitEntries(segment, k, rows, planned[k], &copies);
  }
  if (!copies.empty()) runner_->CopyKv(copies.data(), static_cast<int>(copies.size()));
  std::vector<int> kv_only, full;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i]->kv_copy_loop < 0)
      (rows[i]->kv_only ? kv_only : full).push_back(static_cast<int>(i));
  }
  std::vector<int> order = kv_only;
  order.insert(order.end(), full.begin(), full.end());
  const int n = static_cast<int>(order.size()), nk = static_cast<int>(kv_only.size());
  if (n == 0) return;
  const bool in_place = nk == 0 && n == static_cast<int>(rows.size());  // order is the identity
  std::vector<int> loops(n), positions(n);
  std::vector<int32_t> ids(n);
  for (int j = 0; j < n; ++j) {
    loops[j] = rows[order[j]]->loop;
    positions[j] = rows[order[j]]->position;
    ids[j] = slots[order[j]];
  }
  std::vector<SegmentLayerKv> layers(num_layers);
  for (int k = 0; k < num_layers; ++k) {
    if (nk > 0) layers[k].kv_only = SelectPlanRows(planned[k], kv_only);
    layers[k].full = in_place ? std::move(planned[k]) : SelectPlanRows(planned[k], full);
  }
  SegmentBatch b;
  b.segment = segment;
  b.n = n;
  b.num_kv_only = nk;
  b.loops = loops.data();
  b.positions = positions.data();
  b.slots = ids.data();
  b.layers = layers;
  runner_->RunSegment(b);
}

// Every loop of a segment outside the routed loop (unique layers, or a plan without a single
// looped segment) on the states `slots` of `rows`; rows' `loop` is borrowed as the segment's
// loop counter.
void ModelExecutor::RunSegmentOn(int segment, std::vector<Row*>& rows,
                                 const std::vector<int32_t>& slots, std::vector<KvWrite>* writes) {
  std::vector<int> saved(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) saved[i] = rows[i]->loop;
  const Segment& seg = plan_.segments[segment];
  for (int r = 0; r < seg.loops; ++r) {
    for (Row* row : rows) row->loop = r;
    RunLayers(segment, rows, slots, writes);
  }
  for (size_t i = 0; i < rows.size(); ++i) rows[i]->loop = saved[i];
}

RunOutput ModelExecutor::Run(StepPlan&& plan) {
  RunOutput out;
  const double start = NowSeconds();
  if (!plan.kv_copies.empty()) {
    runner_->CopyKv(plan.kv_copies.data(), static_cast<int>(plan.kv_copies.size()));
  }
  std::vector<Row> rows = std::move(plan.loop_rows);
  for (Row& r : Enter(plan.entering, &out.kv_writes)) {
    (r.exited ? out.skipped : rows).push_back(std::move(r));
  }
  const double entered = NowSeconds();
  out.enter_seconds = entered - start;
  if (!rows.empty() && plan_.looped_segment >= 0) {
    BlockPass(&rows, &out.kv_only, &out.kv_writes);
    out.ran_pass = true;
  }
  out.passed = std::move(rows);
  out.pass_seconds = NowSeconds() - entered;
  return out;
}

std::vector<Row> ModelExecutor::Enter(const std::vector<EnteringToken>& tokens,
                                      std::vector<KvWrite>* writes) {
  const int n = static_cast<int>(tokens.size());
  std::vector<Row> rows(n);
  std::vector<int> ids(n);
  for (int i = 0; i < n; ++i) {
    rows[i].seq = tokens[i].seq;
    rows[i].position = tokens[i].position;
    rows[i].h = slots_.Acquire();
    ids[i] = tokens[i].seq->tokens[tokens[i].position];
  }
  if (n == 0) return rows;
  std::vector<Row*> ptrs;
  for (Row& r : rows) ptrs.push_back(&r);
  runner_->Embed(ids.data(), n, Slots(ptrs).data());
  const int looped = plan_.looped_segment;
  const int pre_end = looped < 0 ? static_cast<int>(plan_.segments.size()) : looped;
  for (int s = 0; s < pre_end; ++s) RunSegmentOn(s, ptrs, Slots(ptrs), writes);
  if (cfg_.huginn.input_injection) StartHuginnState(&rows);
  if (looped < 0) {  // no routed loop: the whole plan ran; report the loops it has
    bool any_loop = false;
    for (const Segment& seg : plan_.segments) any_loop |= seg.looped();
    for (Row& r : rows) {
      r.exited = true;
      r.loop = any_loop ? cfg_.recursion.num_recursions : 0;
    }
  } else {
    EntryRouting(ptrs);
  }
  return rows;
}

// Decides, for rows about to run loop `row->loop`, whether they run it (expert_choice).
void ModelExecutor::DecideExpert(std::vector<Row*>& rows) {
  if (rows.empty()) return;
  const RouterConfig& rc = cfg_.recursion.router;
  const int n = static_cast<int>(rows.size());
  std::vector<float> score(n), decide(n);
  std::vector<int> loops(n);
  for (int i = 0; i < n; ++i) loops[i] = rows[i]->loop;
  runner_->ExpertRouter(loops.data(), Slots(rows).data(), n, score.data(), decide.data());
  for (int i = 0; i < n; ++i) {
    const bool active = rc.capacity[loops[i]] >= 1.0f || decide[i] > rc.threshold;
    if (!active) {
      rows[i]->exited = true;
      continue;
    }
    const double act =
        rc.activation == RouterActivation::kTanh ? std::tanh(score[i]) : Sigmoid(score[i]);
    rows[i]->gate = static_cast<float>(rc.alpha * act);
  }
}

void ModelExecutor::EntryRouting(std::vector<Row*>& rows) {
  const Routing routing = cfg_.recursion.routing;
  if (routing == Routing::kExpertChoice) {
    DecideExpert(rows);
  } else if (routing == Routing::kTokenChoice) {
    const int nr = cfg_.recursion.num_recursions, n = static_cast<int>(rows.size());
    const RouterConfig& rc = cfg_.recursion.router;
    const std::vector<float>& bias = weights_->router.token_choice_bias;
    std::vector<float> scores(static_cast<size_t>(n) * nr);
    runner_->TokenChoiceRouter(Slots(rows).data(), n, scores.data());
    for (int i = 0; i < n; ++i) {
      const float* s = &scores[static_cast<size_t>(i) * nr];
      std::vector<double> p(nr);
      if (rc.activation == RouterActivation::kSigmoid) {
        for (int r = 0; r < nr; ++r) p[r] = rc.alpha * Sigmoid(s[r]);
      } else {
        const double m = *std::max_element(s, s + nr);
        double sum = 0;
        for (int r = 0; r < nr; ++r) sum += std::exp(s[r] - m);
        for (int r = 0; r < nr; ++r) p[r] = rc.alpha * std::exp(s[r] - m) / sum;
      }
      int best = 0;  // argmax of p + bias, lowest index on ties
      for (int r = 1; r < nr; ++r) {
        if (p[r] + (bias.empty() ? 0.0 : bias[r]) > p[best] + (bias.empty() ? 0.0 : bias[best]))
          best = r;
      }
      rows[i]->tc_depth = best + 1;
      rows[i]->tc_gate = static_cast<float>(p[best]);
    }
    CopyState(rows, &Row::h, &Row::x0);
  }
}

void ModelExecutor::ExitByConfidence(std::vector<Row*>& rows) {
  if (rows.empty()) return;
  const int n = static_cast<int>(rows.size()), vocab = cfg_.vocab_size;
  std::vector<float> logits(static_cast<size_t>(n) * vocab);
  runner_->Logits(Slots(rows).data(), n, logits.data());
  for (int i = 0; i < n; ++i) {
    const float threshold =
        rows[i]->seq->request.exit_threshold.value_or(cfg_.recursion.early_exit.threshold);
    if (MaxProb(&logits[static_cast<size_t>(i) * vocab], vocab) >= threshold)
      rows[i]->exited = true;
  }
}

// Only generated tokens of adaptive requests of an Ouro model ask its exit gate.
bool ModelExecutor::AsksOuroGate(const Row& row) const {
  return cfg_.recursion.exit_rule == LoopExitRule::kOuroGate && row.seq->adaptive_loops &&
         row.position >= row.seq->num_prompt;
}

// Ouro's exit rule (docs/models.md#serving-looped-checkpoints) after a loop that is not the
// last, on the gate's logit w . h_t + b over the normed state h_t (ModelRunner::NormBetweenLoops):
// lambda = sigmoid(logit), c += lambda * S, S *= 1 - lambda; exit iff c >= the threshold.
bool ModelExecutor::OuroGateExits(Row* row, double logit) const {
  const double lambda = Sigmoid(logit);
  row->exit_cumulative += lambda * row->exit_survive;
  row->exit_survive *= 1.0 - lambda;
  const double threshold =
      row->seq->request.exit_threshold.value_or(cfg_.recursion.loop_exit_threshold);
  return row->exit_cumulative >= threshold;
}

// docs/models.md#nanbeige42 and #ouro: the final norm between loops, by the runner into a new
// state of each row (no state leaves it). Ouro's gate reads the normed state: a row that exits
// keeps the state before the norm (the tail norms it once) and goes to `exited`; the others
// take the normed state. Only the gate's logits come back, when a row asks for them. `exited`
// may be null when no row can ask (Huginn's ln_f before the coda).
void ModelExecutor::NormAfterLoop(const std::vector<Row*>& rows, std::vector<Row*>* exited) {
  if (rows.empty()) return;
  const int n = static_cast<int>(rows.size());
  std::vector<StateSlot> normed(n);
  std::vector<int32_t> dst(n);
  bool gate = false;
  for (int i = 0; i < n; ++i) {
    normed[i] = slots_.Acquire();
    dst[i] = normed[i].id();
    gate = gate || AsksOuroGate(*rows[i]);
  }
  std::vector<double> logit(gate ? n : 0);
  runner_->NormBetweenLoops(Slots(rows).data(), dst.data(), n, gate ? logit.data() : nullptr);
  for (int i = 0; i < n; ++i) {
    Row& r = *rows[i];
    if (AsksOuroGate(r) && OuroGateExits(&r, logit[i])) {
      r.exited = true;
      exited->push_back(&r);
    } else {
      r.h = std::move(normed[i]);
    }
  }
}

// The loops row `row` runs: the plan's, or a Huginn request's num_steps.
int ModelExecutor::LoopsOf(const Row& row) const {
  const int nr = cfg_.recursion.num_recursions;
  return cfg_.huginn.enabled ? row.seq->request.num_steps.value_or(nr) : nr;
}

// Huginn (docs/models.md#huginn-0125): the prelude's output e is kept for the injections, and
// the recurrent state starts at s0 (zeros, or drawn from the request's seed and the position).
void ModelExecutor::StartHuginnState(std::vector<Row>* rows) {
  const size_t hs = static_cast<size_t>(cfg_.hidden_size);
  std::vector<Row*> ptrs;
  std::vector<float> s0(rows->size() * hs);
  for (Row& r : *rows) {
    const Sequence& s = *r.seq;
    r.inject = std::move(r.h);
    r.h = slots_.Acquire();
    const std::vector<float> init =
        HuginnInitialState(cfg_.hidden_size, s.request.init_scale.value_or(cfg_.huginn.init_scale),
                           s.seed, r.position);
    std::copy(init.begin(), init.end(), &s0[ptrs.size() * hs]);
    ptrs.push_back(&r);
  }
  Write(ptrs, s0);
}

// s = adapter . concat(s, e) on the full rows of a pass, before its first layer.
void ModelExecutor::InjectInput(std::vector<Row*>& rows) {
  std::vector<Row*> full;
  for (Row* r : rows)
    if (!r->kv_only) full.push_back(r);
  if (full.empty()) return;
  runner_->InjectInput(Slots(full).data(), Slots(full, &Row::inject).data(),
                       static_cast<int>(full.size()));
}

// After a pass, on the runner's states: expert choice's h = h_in + g * Block(h_in) (g = 1 with
// additive gating) on every full row, token choice's output x0 + p[d-1] * h on the rows whose
// last loop this was.
void ModelExecutor::GatedResiduals(const std::vector<Row*>& rows,
                                   const std::vector<StateSlot>& h_in) {
  const RecursionConfig& rc = cfg_.recursion;
  std::vector<int32_t> base, slots;
  std::vector<float> scale;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = *rows[i];
    if (r.kv_only) continue;
    if (rc.routing == Routing::kExpertChoice) {
      base.push_back(h_in[i].id());
      scale.push_back(rc.router.gating == Gating::kAdditive ? 1.0f : r.gate);
    } else if (rc.routing == Routing::kTokenChoice && r.loop + 1 == r.tc_depth) {
      base.push_back(r.x0.id());
      scale.push_back(r.tc_gate);
    } else {
      continue;
    }
    slots.push_back(r.h.id());
  }
  if (!slots.empty())
    runner_->GatedAdd(base.data(), slots.data(), scale.data(), static_cast<int>(slots.size()));
}

// Huginn's exit rule after a recurrence that is not the token's last: ln_f, the coda (writing
// the token's coda entries, rewritten by later checks), the head; the token exits iff KL of the
// previous check's distribution (uniform at first) to this one is below its threshold. The
// runner keeps each row's logits from one check to the next (HuginnExitKl, in the row's
// previous-logits row) and returns only the statistic. An exiting row keeps its coda entries,
// and its coda output becomes its state, from which the tail only samples it (tail_done); it
// goes to `exited` to copy its entries into the later recurrences' slots. The last known
// token also keeps its previous-logits row: its check's logits are the ones the tail samples
// (ModelRunner::SampleKept), so no second final norm and LM head runs for it.
void ModelExecutor::HuginnKlExits(std::vector<Row*>& rows, std::vector<Row*>* exited,
                                  std::vector<KvWrite>* writes) {
  const int n = static_cast<int>(rows.size());
  std::vector<StateSlot> coda(n);  // the normed states the check runs the coda on
  std::vector<int32_t> coda_slots(n), prev(n), has_prev(n);
  for (int i = 0; i < n; ++i) {
    Row& r = *rows[i];
    coda[i] = slots_.Acquire();
    coda_slots[i] = coda[i].id();
    has_prev[i] = r.huginn_prev.id() >= 0 ? 1 : 0;
    if (!has_prev[i]) r.huginn_prev = huginn_rows_.Acquire();
    prev[i] = r.huginn_prev.id();
  }
  runner_->NormBetweenLoops(Slots(rows).data(), coda_slots.data(), n, nullptr);  // ln_f
  for (int s = plan_.looped_segment + 1; s < static_cast<int>(plan_.segments.size()); ++s)
    RunSegmentOn(s, rows, coda_slots, writes);
  std::vector<double> kl(n);
  runner_->HuginnExitKl(coda_slots.data(), prev.data(), has_prev.data(), n, kl.data());
  for (int i = 0; i < n; ++i) {
    Row& r = *rows[i];
    const double threshold =
        r.seq->request.exit_threshold.value_or(cfg_.recursion.loop_exit_threshold);
    if (kl[i] >= threshold) continue;
    r.exited = true;
    r.tail_done = true;
    r.h = std::move(coda[i]);
    if (!IsLastKnown(r)) r.huginn_prev.Reset();  // no token is sampled from this row
    exited->push_back(&r);
  }
}

void ModelExecutor::BlockPass(std::vector<Row>* rows, std::vector<Row>* kv_only,
                              std::vector<KvWrite>* writes) {
  const int looped = plan_.looped_segment;
  if (rows->empty() || looped < 0) return;
  // Rows grouped by loop (per-loop weights run per group), one request's rows in order.
  std::sort(rows->begin(), rows->end(), [](const Row& a, const Row& b) {
    if (a.loop != b.loop) return a.loop < b.loop;
    if (a.seq->id != b.seq->id) return a.seq->id < b.seq->id;
    return a.position < b.position;
  });
  std::vector<Row*> ptrs;
  for (Row& r : *rows) ptrs.push_back(&r);
  if (cfg_.huginn.input_injection) InjectInput(ptrs);
  const RecursionConfig& rc = cfg_.recursion;
  // Expert choice keeps the states before the pass for the gated residual.
  std::vector<StateSlot> h_in(rc.routing == Routing::kExpertChoice ? ptrs.size() : 0);
  std::vector<int32_t> from, to;
  for (size_t i = 0; i < h_in.size(); ++i) {
    if (ptrs[i]->kv_only) continue;
    h_in[i] = slots_.Acquire();
    from.push_back(ptrs[i]->h.id());
    to.push_back(h_in[i].id());
  }
  if (!from.empty()) runner_->CopyStates(from.data(), to.data(), static_cast<int>(from.size()));
  // K/V-only rows keep their exit state through every layer (the runner leaves their h
  // alone): it is the input of each skipped layer (docs/models.md#early-exit).
  RunLayers(looped, ptrs, Slots(ptrs), writes);
  GatedResiduals(ptrs, h_in);
  std::vector<Row*> undecided, copy_on_exit, kl_check, norm;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    Row& r = *ptrs[i];
    if (r.kv_only) {
      r.exited = ++r.loop == LoopsOf(r);
      continue;
    }
    ++r.loop;
    if (rc.routing == Routing::kTokenChoice) {
      r.exited = r.loop == r.tc_depth;  // its output is x0 + p[d-1] * h (GatedResiduals)
    } else if (r.loop == LoopsOf(r)) {
      r.exited = true;
    } else if (rc.routing == Routing::kExpertChoice || rc.routing == Routing::kEarlyExit) {
      undecided.push_back(&r);
    } else if (rc.exit_rule == LoopExitRule::kHuginnKl && r.seq->adaptive_loops &&
               r.position >= r.seq->num_prompt) {
      kl_check.push_back(&r);  // generated tokens of adaptive requests only
    }
    if (rc.norm_between_loops && !r.exited) norm.push_back(&r);
  }
  NormAfterLoop(norm, &copy_on_exit);
  if (!kl_check.empty()) HuginnKlExits(kl_check, &copy_on_exit, writes);
  for (Row* r : ptrs)  // a row that left the loop checks no more (an exit check's keeps its logits)
    if (r->exited && !r->tail_done) r->huginn_prev.Reset();
  for (Row* r : copy_on_exit) {  // rides the later loops, copying its exit loop's entries
    Row ghost;
    ghost.seq = r->seq;
    ghost.position = r->position;
    ghost.loop = r->loop;
    ghost.kv_only = true;
    ghost.kv_copy_loop = r->loop - 1;
    kv_only->push_back(std::move(ghost));
  }
  if (rc.routing == Routing::kExpertChoice) DecideExpert(undecided);
  if (rc.routing == Routing::kEarlyExit) {
    ExitByConfidence(undecided);
    if (rc.early_exit.exit_kv == ExitKv::kPropagate) {
      std::vector<int32_t> from, to;  // each ghost's state: a copy of its row's exit state
      for (Row* r : undecided) {
        // Loops after loop 0 write no KV with kv sharing: nothing for a K/V-only row to do.
        if (!r->exited || !plan_.WritesKv(looped, r->loop)) continue;
        Row ghost;
        ghost.seq = r->seq;
        ghost.position = r->position;
        ghost.loop = r->loop;
        ghost.h = slots_.Acquire();
        ghost.kv_only = true;
        from.push_back(r->h.id());
        to.push_back(ghost.h.id());
        kv_only->push_back(std::move(ghost));
      }
      if (!from.empty()) runner_->CopyStates(from.data(), to.data(), static_cast<int>(from.size()));
    }
  }
}

void ModelExecutor::Tail(std::vector<Row>* rows) {
  if (rows->empty()) return;
  std::vector<Row*> ptrs, run;  // run: all but Huginn rows whose exit check did the tail
  for (Row& r : *rows) {
    ptrs.push_back(&r);
    if (!r.tail_done) run.push_back(&r);
  }
  const int looped = plan_.looped_segment;
  if (looped >= 0 && !run.empty()) {
    // Huginn's ln_f (the final norm) on the states entering the coda: no gate, so no row exits.
    if (cfg_.huginn.input_injection) NormAfterLoop(run, /*exited=*/nullptr);
    for (int s = looped + 1; s < static_cast<int>(plan_.segments.size()); ++s) {
      RunSegmentOn(s, run, Slots(run), /*writes=*/nullptr);
    }
  }
  std::vector<Row*> sampled, scored;
  for (Row* r : ptrs) {
    const Sequence& s = *r->seq;
    if (IsLastKnown(*r) && s.request.params.max_tokens > 0) sampled.push_back(r);
    if (s.request.params.prompt_logprobs && !s.prompt_logprobs_sent &&
        r->position + 1 < s.num_prompt) {
      scored.push_back(r);
    }
  }
  ScorePrompt(scored);
  // Each kind of sampled row twice over: from its state (the LM head runs) or from the logits
  // its Huginn exit check kept (HuginnKlExits).
  std::vector<Row*> with_logits[2], by_runner[2];
  for (Row* r : sampled) {
    const Sequence& s = *r->seq;
    const bool runner = !s.request.return_logits && RunnerSamples(s.request.params);
    const bool kept = r->huginn_prev.id() >= 0;
    (runner ? by_runner : with_logits)[kept].push_back(r);
  }
  for (bool kept : {false, true}) {
    SampleOnRunner(by_runner[kept], kept);
    HostLogits(with_logits[kept], kept);
  }
  for (Row* r : ptrs) r->huginn_prev.Reset();
}

// The rows' ids for the runner: their state slots, or their kept previous-logits rows.
std::vector<int32_t> ModelExecutor::LogitIds(const std::vector<Row*>& rows, bool kept) {
  return kept ? Slots(rows, &Row::huginn_prev) : Slots(rows);
}

// Rows whose next token needs no logits on the host: the runner samples them where the logits
// are (on the GPU, only the results come back).
void ModelExecutor::SampleOnRunner(const std::vector<Row*>& rows, bool kept) {
  if (rows.empty()) return;
  std::vector<SampleInput> inputs;
  for (const Row* r : rows) inputs.push_back(NextTokenInput(*r->seq, cfg_.eos_token_ids));
  std::vector<SampleResult> out(rows.size());
  const std::vector<int32_t> ids = LogitIds(rows, kept);
  if (kept) {
    runner_->SampleKept(ids.data(), inputs, out.data());
  } else {
    runner_->Sample(ids.data(), inputs, out.data());
  }
  for (size_t i = 0; i < rows.size(); ++i) rows[i]->sample = std::move(out[i]);
}

// Rows sampled on the host (their requests return logits or ask for top-n alternatives): their
// logits come back.
void ModelExecutor::HostLogits(const std::vector<Row*>& rows, bool kept) {
  if (rows.empty()) return;
  const int vocab = cfg_.vocab_size, n = static_cast<int>(rows.size());
  std::vector<float> logits(static_cast<size_t>(n) * vocab);
  const std::vector<int32_t> ids = LogitIds(rows, kept);
  if (kept) {
    runner_->KeptLogits(ids.data(), n, logits.data());
  } else {
    runner_->Logits(ids.data(), n, logits.data());
  }
  for (int i = 0; i < n; ++i) {
    rows[i]->logits.assign(&logits[static_cast<size_t>(i) * vocab],
                           &logits[static_cast<size_t>(i + 1) * vocab]);
  }
}

// Final norm and lm_head over prompt rows, a bounded number of rows at a time (the logits
// buffer is rows x vocab), each row reduced at once to the next prompt token's score. The
// runner computes each row alone, so the values do not depend on which rows share a call.
void ModelExecutor::ScorePrompt(const std::vector<Row*>& rows) {
  constexpr size_t kRowsPerCall = 64;
  const int vocab = cfg_.vocab_size;
  std::vector<float> logits;
  std::vector<int> scratch;
  for (size_t begin = 0; begin < rows.size(); begin += kRowsPerCall) {
    const size_t end = std::min(rows.size(), begin + kRowsPerCall);
    const std::vector<Row*> part(rows.begin() + begin, rows.begin() + end);
    const int n = static_cast<int>(part.size());
    logits.resize(static_cast<size_t>(n) * vocab);
    runner_->Logits(Slots(part).data(), n, logits.data());
    for (int i = 0; i < n; ++i) {
      Row& r = *part[i];
      const Sequence& s = *r.seq;
      r.prompt_logprob =
          ScorePromptToken(absl::MakeConstSpan(&logits[static_cast<size_t>(i) * vocab], vocab),
                           s.tokens[r.position + 1], *s.request.params.prompt_logprobs, &scratch);
    }
  }
}

}  // namespace morserve
