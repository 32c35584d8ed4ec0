// Model execution over mixed-depth rows (see model_executor.h).
#include "engine/runtime/model_executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>

#include "engine/core/check.h"
#include "engine/cpu/cpu_ops.h"
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
                             KvBlockPool* pool, ThreadPool* host_pool)
    : weights_(std::move(weights)),
      cfg_(weights_->config),
      plan_(weights_->plan),
      runner_(runner),
      pool_(pool),
      host_pool_(host_pool) {
  if (cfg_.recursion.norm_between_loops) loop_norm_ = weights_->final_norm.ToF32Vector();
  if (cfg_.recursion.exit_rule == LoopExitRule::kOuroGate) {
    exit_gate_w_ = weights_->exit_gate_w.ToF32Vector();
    exit_gate_b_ = weights_->exit_gate_b.ToF32Vector()[0];
  }
  if (cfg_.huginn.input_injection) ln_f_ = weights_->final_norm.ToF32Vector();
}

std::vector<float> ModelExecutor::Gather(const std::vector<Row*>& rows) const {
  const int hs = cfg_.hidden_size;
  std::vector<float> h(rows.size() * hs);
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy(rows[i]->h.begin(), rows[i]->h.end(), &h[i * hs]);
  return h;
}

void ModelExecutor::Scatter(const std::vector<float>& h, std::vector<Row*>& rows) const {
  const int hs = cfg_.hidden_size;
  for (size_t i = 0; i < rows.size(); ++i) rows[i]->h.assign(&h[i * hs], &h[(i + 1) * hs]);
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

// Every layer of `segment` over `rows` (h: their states [rows, H], updated): each layer's plan
// first, then the copy-on-exit entries of every layer in one copy (their sources are entries
// of earlier passes, so they may all precede the layers), then one runner call over the other
// rows, K/V-only rows first (each kind keeps the rows' order, so stays grouped by loop).
void ModelExecutor::RunLayers(int segment, std::vector<Row*>& rows, std::vector<float>* h,
                              std::vector<KvWrite>* writes) {
  const int num_layers = plan_.segments[segment].num_layers, hs = cfg_.hidden_size;
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
  std::vector<float> moved;
  for (int j = 0; j < n; ++j) {
    loops[j] = rows[order[j]]->loop;
    positions[j] = rows[order[j]]->position;
  }
  if (!in_place) {
    moved.resize(static_cast<size_t>(n) * hs);
    for (int j = 0; j < n; ++j)
      std::copy_n(&(*h)[static_cast<size_t>(order[j]) * hs], hs,
                  &moved[static_cast<size_t>(j) * hs]);
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
  b.h = in_place ? h->data() : moved.data();
  b.layers = layers;
  runner_->RunSegment(b);
  if (in_place) return;
  for (int j = nk; j < n; ++j)
    std::copy_n(&moved[static_cast<size_t>(j) * hs], hs, &(*h)[static_cast<size_t>(order[j]) * hs]);
}

// Every loop of a segment outside the routed loop (unique layers, or a plan without a single
// looped segment); rows' `loop` is borrowed as the segment's loop counter.
void ModelExecutor::RunSegment(int segment, std::vector<Row*>& rows, std::vector<KvWrite>* writes) {
  std::vector<float> h = Gather(rows);
  RunSegmentOn(segment, rows, &h, writes);
  Scatter(h, rows);
}

// The same on hidden states h [rows, H] given apart from the rows' own.
void ModelExecutor::RunSegmentOn(int segment, std::vector<Row*>& rows, std::vector<float>* h,
                                 std::vector<KvWrite>* writes) {
  std::vector<int> saved(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) saved[i] = rows[i]->loop;
  const Segment& seg = plan_.segments[segment];
  for (int r = 0; r < seg.loops; ++r) {
    for (Row* row : rows) row->loop = r;
    RunLayers(segment, rows, h, writes);
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
  std::vector<float> h(static_cast<size_t>(n) * cfg_.hidden_size);
  for (int i = 0; i < n; ++i) {
    rows[i].seq = tokens[i].seq;
    rows[i].position = tokens[i].position;
    ids[i] = tokens[i].seq->tokens[tokens[i].position];
  }
  if (n == 0) return rows;
  runner_->Embed(ids.data(), n, h.data());
  std::vector<Row*> ptrs;
  for (Row& r : rows) ptrs.push_back(&r);
  Scatter(h, ptrs);
  const int looped = plan_.looped_segment;
  const int pre_end = looped < 0 ? static_cast<int>(plan_.segments.size()) : looped;
  for (int s = 0; s < pre_end; ++s) RunSegment(s, ptrs, writes);
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
  std::vector<float> h = Gather(rows), score(n), decide(n);
  std::vector<int> loops(n);
  for (int i = 0; i < n; ++i) loops[i] = rows[i]->loop;
  runner_->ExpertRouter(loops.data(), h.data(), n, score.data(), decide.data());
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
    std::vector<float> h = Gather(rows), scores(static_cast<size_t>(n) * nr);
    runner_->TokenChoiceRouter(h.data(), n, scores.data());
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
      rows[i]->x0 = rows[i]->h;
    }
  }
}

void ModelExecutor::ExitByConfidence(std::vector<Row*>& rows) {
  if (rows.empty()) return;
  const int n = static_cast<int>(rows.size()), vocab = cfg_.vocab_size;
  std::vector<float> h = Gather(rows), logits(static_cast<size_t>(n) * vocab);
  runner_->Logits(h.data(), n, logits.data());
  for (int i = 0; i < n; ++i) {
    const float threshold =
        rows[i]->seq->request.exit_threshold.value_or(cfg_.recursion.early_exit.threshold);
    if (MaxProb(&logits[static_cast<size_t>(i) * vocab], vocab) >= threshold)
      rows[i]->exited = true;
  }
}

// Ouro's exit rule (docs/models.md#serving-looped-checkpoints) after a loop that is not the
// last, on the normed state h_t: lambda = sigmoid(w . h_t + b), c += lambda * S, S *= 1 -
// lambda; exit iff c >= the threshold. Only generated tokens of adaptive requests ask; the
// sums run in fp64 over the fp32 state, as the reference computes them.
bool ModelExecutor::OuroGateExits(Row* row, const float* normed) const {
  if (exit_gate_w_.empty() || !row->seq->adaptive_loops || row->position < row->seq->num_prompt)
    return false;
  double dot = exit_gate_b_;
  for (size_t i = 0; i < exit_gate_w_.size(); ++i)
    dot += static_cast<double>(exit_gate_w_[i]) * normed[i];
  const double lambda = Sigmoid(dot);
  row->exit_cumulative += lambda * row->exit_survive;
  row->exit_survive *= 1.0 - lambda;
  const double threshold =
      row->seq->request.exit_threshold.value_or(cfg_.recursion.loop_exit_threshold);
  return row->exit_cumulative >= threshold;
}

// The loops row `row` runs: the plan's, or a Huginn request's num_steps.
int ModelExecutor::LoopsOf(const Row& row) const {
  const int nr = cfg_.recursion.num_recursions;
  return cfg_.huginn.enabled ? row.seq->request.num_steps.value_or(nr) : nr;
}

// Huginn (docs/models.md#huginn-0125): the prelude's output e is kept for the injections, and
// the recurrent state starts at s0 (zeros, or drawn from the request's seed and the position).
void ModelExecutor::StartHuginnState(std::vector<Row>* rows) const {
  for (Row& r : *rows) {
    const Sequence& s = *r.seq;
    r.inject = std::move(r.h);
    r.h =
        HuginnInitialState(cfg_.hidden_size, s.request.init_scale.value_or(cfg_.huginn.init_scale),
                           s.seed, r.position);
  }
}

// s = adapter . concat(s, e) on the full rows of a pass, before its first layer.
void ModelExecutor::InjectInput(std::vector<Row*>& rows) {
  std::vector<Row*> full;
  for (Row* r : rows)
    if (!r->kv_only) full.push_back(r);
  if (full.empty()) return;
  const int n = static_cast<int>(full.size()), hs = cfg_.hidden_size;
  const std::vector<float> s = Gather(full);
  std::vector<float> e(s.size()), out(s.size());
  for (int i = 0; i < n; ++i)
    std::copy_n(full[i]->inject.data(), hs, &e[static_cast<size_t>(i) * hs]);
  runner_->InjectInput(s.data(), e.data(), n, out.data());
  Scatter(out, full);
}

// ln_f on states entering the coda (Huginn), in place.
void ModelExecutor::CodaInput(std::vector<float>* h, int n) const {
  RmsNormRows(h->data(), ln_f_.data(), n, cfg_.hidden_size, cfg_.rms_norm_eps, h->data());
}

// Huginn's exit rule after a recurrence that is not the token's last: ln_f, the coda (writing
// the token's coda entries, rewritten by later checks), the head; the token exits iff KL of the
// previous check's distribution (uniform at first) to this one is below its threshold. An
// exiting row keeps its coda entries and, if it is sampled next, these logits (tail_done), and
// goes to `exited` to copy its entries into the later recurrences' slots.
void ModelExecutor::HuginnKlExits(std::vector<Row*>& rows, std::vector<Row*>* exited,
                                  std::vector<KvWrite>* writes) {
  const int n = static_cast<int>(rows.size()), vocab = cfg_.vocab_size;
  std::vector<float> y = Gather(rows), logits(static_cast<size_t>(n) * vocab);
  CodaInput(&y, n);
  for (int s = plan_.looped_segment + 1; s < static_cast<int>(plan_.segments.size()); ++s)
    RunSegmentOn(s, rows, &y, writes);
  runner_->Logits(y.data(), n, logits.data());
  // Each row's statistic is computed whole by one task (the reference's order, whatever the
  // threads): two fp64 passes over the vocabulary, the costly part of a check on the host.
  std::vector<HuginnLogits> normalized(n);
  std::vector<double> kl(n);
  host_pool_->ParallelFor(n, [&](int64_t begin, int64_t end) {  // one row: on this thread
    for (int64_t i = begin; i < end; ++i) {
      normalized[i] =
          HuginnNormalize(std::vector<float>(&logits[i * vocab], &logits[(i + 1) * vocab]));
      kl[i] = HuginnKl(rows[i]->prev_logits, normalized[i]);
    }
  });
  for (int i = 0; i < n; ++i) {
    Row& r = *rows[i];
    HuginnLogits& row = normalized[i];
    const double threshold =
        r.seq->request.exit_threshold.value_or(cfg_.recursion.loop_exit_threshold);
    if (kl[i] < threshold) {
      r.exited = true;
      r.tail_done = true;
      // Sampled only if it is the last known token (a recomputed one's next token is known).
      if (r.position == static_cast<int>(r.seq->tokens.size()) - 1)
        r.logits = std::move(row.logits);
      r.prev_logits = HuginnLogits{};
      exited->push_back(&r);
    } else {
      r.prev_logits = std::move(row);
    }
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
  const std::vector<float> h_in = Gather(ptrs);
  std::vector<float> h = h_in;
  const int hs = cfg_.hidden_size;
  // K/V-only rows keep their exit state through every layer (the runner leaves their h
  // alone): it is the input of each skipped layer (docs/models.md#early-exit).
  RunLayers(looped, ptrs, &h, writes);

  const RecursionConfig& rc = cfg_.recursion;
  std::vector<Row*> undecided, copy_on_exit, kl_check;
  std::vector<float> normed(hs);
  for (size_t i = 0; i < ptrs.size(); ++i) {
    Row& r = *ptrs[i];
    float* out = &h[i * hs];
    if (r.kv_only) {
      r.exited = ++r.loop == LoopsOf(r);
      continue;
    }
    if (rc.routing == Routing::kExpertChoice) {  // h = h + g * Block(h)
      const double g = rc.router.gating == Gating::kAdditive ? 1.0 : r.gate;
      for (int d = 0; d < hs; ++d) out[d] = static_cast<float>(h_in[i * hs + d] + g * out[d]);
    }
    ++r.loop;
    if (rc.routing == Routing::kTokenChoice) {
      if (r.loop == r.tc_depth) {  // output x0 + p[d-1] * h
        for (int d = 0; d < hs; ++d)
          out[d] = static_cast<float>(r.x0[d] + static_cast<double>(r.tc_gate) * out[d]);
        r.exited = true;
      }
    } else if (r.loop == LoopsOf(r)) {
      r.exited = true;
    } else if (rc.routing == Routing::kExpertChoice || rc.routing == Routing::kEarlyExit) {
      undecided.push_back(&r);
    } else if (rc.exit_rule == LoopExitRule::kHuginnKl && r.seq->adaptive_loops &&
               r.position >= r.seq->num_prompt) {
      kl_check.push_back(&r);  // generated tokens of adaptive requests only
    }
    // docs/models.md#nanbeige42 and #ouro: the final norm between loops, on the host state
    // every backend hands back (the runners need no op for it). Ouro's gate reads the normed
    // state; a row that exits keeps the state before the norm (the tail norms it once).
    if (!loop_norm_.empty() && !r.exited) {
      RmsNormRows(out, loop_norm_.data(), 1, hs, cfg_.rms_norm_eps, normed.data());
      if (OuroGateExits(&r, normed.data())) {
        r.exited = true;
        copy_on_exit.push_back(&r);
      } else {
        std::copy(normed.begin(), normed.end(), out);
      }
    }
  }
  Scatter(h, ptrs);
  if (!kl_check.empty()) HuginnKlExits(kl_check, &copy_on_exit, writes);
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
      for (Row* r : undecided) {
        // Loops after loop 0 write no KV with kv sharing: nothing for a K/V-only row to do.
        if (!r->exited || !plan_.WritesKv(looped, r->loop)) continue;
        Row ghost;
        ghost.seq = r->seq;
        ghost.position = r->position;
        ghost.loop = r->loop;
        ghost.h = r->h;
        ghost.kv_only = true;
        kv_only->push_back(std::move(ghost));
      }
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
    std::vector<float> h = Gather(run);
    if (cfg_.huginn.input_injection) CodaInput(&h, static_cast<int>(run.size()));
    for (int s = looped + 1; s < static_cast<int>(plan_.segments.size()); ++s) {
      RunSegmentOn(s, run, &h, /*writes=*/nullptr);
    }
    Scatter(h, run);
  }
  std::vector<Row*> sampled, scored;
  for (Row* r : ptrs) {
    const Sequence& s = *r->seq;
    const bool last = r->position == static_cast<int>(s.tokens.size()) - 1;
    if (last && s.request.params.max_tokens > 0 && !r->tail_done) sampled.push_back(r);
    if (s.request.params.prompt_logprobs && !s.prompt_logprobs_sent &&
        r->position + 1 < s.num_prompt) {
      scored.push_back(r);
    }
  }
  ScorePrompt(scored);
  std::vector<Row*> with_logits, by_runner;
  for (Row* r : sampled) {
    const Sequence& s = *r->seq;
    const bool runner =
        !s.request.return_logits && RunnerSamples(s.request.params, s.num_generated());
    (runner ? by_runner : with_logits).push_back(r);
  }
  SampleOnRunner(by_runner);
  if (with_logits.empty()) return;
  const int vocab = cfg_.vocab_size, n = static_cast<int>(with_logits.size());
  std::vector<float> h = Gather(with_logits), logits(static_cast<size_t>(n) * vocab);
  runner_->Logits(h.data(), n, logits.data());
  for (int i = 0; i < n; ++i) {
    with_logits[i]->logits.assign(&logits[static_cast<size_t>(i) * vocab],
                                  &logits[static_cast<size_t>(i + 1) * vocab]);
  }
}

// Rows whose next token needs no logits on the host: the runner samples them where the logits
// are (on the GPU, only the results come back).
void ModelExecutor::SampleOnRunner(const std::vector<Row*>& rows) {
  if (rows.empty()) return;
  std::vector<SampleInput> inputs;
  for (const Row* r : rows) inputs.push_back(NextTokenInput(*r->seq, cfg_.eos_token_ids));
  std::vector<SampleResult> out(rows.size());
  const std::vector<float> h = Gather(rows);
  runner_->Sample(h.data(), inputs, out.data());
  for (size_t i = 0; i < rows.size(); ++i) rows[i]->sample = std::move(out[i]);
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
    const std::vector<float> h = Gather(part);
    logits.resize(static_cast<size_t>(n) * vocab);
    runner_->Logits(h.data(), n, logits.data());
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
