// DepthScheduler on CPU bookkeeping alone: no model, no tensors. A small simulator plays the
// executor's and the engine's part of a step (Schedule -> Run -> Update -> Complete) with
// scripted per-token depths: Run's KV writes for the unique first layer and the pass, and
// the loop counter (exit when loop == the token's depth); the tail's use of the entries the
// scheduler recorded for the unique last layer; and sampling (a token pushed when the last
// known position leaves the tail). After every scheduler call it checks the invariants the
// engine relies on:
// FIFO admission without skipping, the row / token / running limits, the newest request
// preempted first, entries reserved before they are written, an in-order tail, exact
// recursion-wise KV contents at finish, and a pool whose used blocks are exactly those the
// running requests hold. The tests below add targeted, hand-computed scenarios.
#include "engine/runtime/depth_scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/model/config.h"
#include "engine/model/layer_plan.h"
#include "engine/runtime/engine_config.h"
#include "engine/runtime/kv_block_pool.h"
#include "engine/runtime/sequence.h"

namespace morserve {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr int kNr = 3;  // loops of the shared block in the test plan

// MoR middle_cycle over 8 layers: 1 unique + K=2 layers x Nr=3 loops + 1 unique.
// Cache slots: 0 (first layer), 1 + 2r + k (loop r, layer k), 7 (last layer).
LayerPlan MorPlan(KvMode kv = KvMode::kRecursionWise) {
  json c = {{"hidden_size", 64},
            {"num_hidden_layers", 8},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 2},
            {"intermediate_size", 128},
            {"vocab_size", 256},
            {"architectures", {"LlamaForCausalLM"}},
            {"eos_token_id", 2}};
  c["recursion"] = {{"num_recursions", kNr},
                    {"sharing", "middle_cycle"},
                    {"routing", "expert_choice"},
                    {"kv", kv == KvMode::kShared ? "shared" : "recursion_wise"}};
  auto m = ParseModelConfig(c, nullptr);
  if (!m.ok()) {
    ADD_FAILURE() << m.status();
    return {};
  }
  auto plan = BuildLayerPlan(*m);
  if (!plan.ok()) {
    ADD_FAILURE() << plan.status();
    return {};
  }
  return *plan;
}

// Loops of the shared block a token runs: 0 (routed out at entry) .. kNr.
using DepthFn = std::function<int(uint64_t id, int position)>;

uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

DepthFn RandomDepths(uint64_t salt) {
  return [salt](uint64_t id, int pos) {
    return 1 + static_cast<int>(Mix(salt ^ (id << 24) ^ static_cast<uint64_t>(pos)) % kNr);
  };
}

DepthFn ByPosition(std::vector<int> depths) {
  return [depths = std::move(depths)](uint64_t, int pos) { return depths.at(pos); };
}

// The token "sampled" after position p: a function of (id, p) only, so recomputation after
// preemption must reproduce it.
int SampledToken(uint64_t id, int position) {
  return 3 + static_cast<int>((id * 31 + static_cast<uint64_t>(position) * 17) % 250);
}

EngineConfig Config(BatchingMode mode, int max_batch_rows, int max_step_tokens, int max_running,
                    int block_size) {
  EngineConfig c;
  c.mode = mode;
  c.max_batch_rows = max_batch_rows;
  c.max_step_tokens = max_step_tokens;
  c.max_running = max_running;
  c.block_size = block_size;
  return c;
}

struct StepRecord {
  int continuing = 0;                              // rows in the loop when the step began
  std::vector<std::pair<uint64_t, int>> entering;  // (id, position)
  std::vector<int> pass_rows;                      // rows in each pass of the shared block
  std::vector<std::vector<int>> pass_loops;        // loop each row ran, per pass
  std::vector<std::vector<int>> pass_exits;        // loops run by rows that left, per pass
  std::vector<std::pair<uint64_t, int>> tail;      // (id, position) in the order handed out
  std::vector<uint64_t> admitted, preempted, finished, dropped;

  std::vector<int> Entering(uint64_t id) const {
    std::vector<int> out;
    for (auto [i, p] : entering) {
      if (i == id) out.push_back(p);
    }
    return out;
  }
};

struct Finished {
  int step = 0;
  std::vector<int> tokens;
  int preemptions = 0;
};

class SchedulerSim {
 public:
  SchedulerSim(const EngineConfig& config, LayerPlan plan, int num_blocks, DepthFn depth)
      : config_(config),
        plan_(std::move(plan)),
        pool_(num_blocks, config.block_size),
        depth_(std::move(depth)),
        sched_(config_, plan_, &pool_) {}

  uint64_t Add(int prompt_len, int max_tokens) {
    auto seq = std::make_unique<Sequence>();
    const uint64_t id = next_id_++;
    seq->id = id;
    seq->request.request_id = "r" + std::to_string(id);
    seq->request.params.max_tokens = max_tokens;
    for (int i = 0; i < prompt_len; ++i)
      seq->tokens.push_back(10 + static_cast<int>((id * 7 + i) % 200));
    seq->request.prompt = seq->tokens;
    seq->num_prompt = prompt_len;
    seq->channel = std::make_shared<EventChannel>();
    live_[id] = seq.get();
    arrival_step_[id] = steps_;
    sched_.Add(std::move(seq));
    return id;
  }

  // One engine step (Engine::Step with the executor's KV writes and the sampler simulated).
  StepRecord Step() {
    StepRecord rec;
    rec.continuing = static_cast<int>(sched_.loop_rows().size());
    std::map<uint64_t, State> before = Snap();
    StepPlan plan = sched_.Schedule();
    TakeDropped(&plan, &rec);
    CheckPreemptions(before, plan, &rec);
    CheckEntering(before, plan, &rec);
    std::vector<Row> tail;
    std::map<uint64_t, State> pass_before;
    for (;;) {
      pass_before = Snap();
      tail = sched_.Update(Run(std::move(plan), &rec));
      if (config_.mode != BatchingMode::kSequenceWise || sched_.loop_rows().empty()) break;
      EXPECT_THAT(tail, IsEmpty()) << "sequence-wise tail before the loop is empty";
      plan = sched_.Schedule();
      TakeDropped(&plan, &rec);
      CheckPreemptions(pass_before, plan, &rec);
      EXPECT_THAT(plan.entering, IsEmpty()) << "sequence-wise: tokens entered a busy loop";
    }
    if (config_.mode == BatchingMode::kSequenceWise) {
      EXPECT_TRUE(sched_.loop_rows().empty()) << "sequence-wise step ended with rows in the loop";
    }
    CheckTail(pass_before, tail);
    Tail(&tail, &rec);
    CheckPool();
    ++steps_;
    return rec;
  }

  // Steps until the scheduler is idle; false if that takes more than max_steps.
  bool Run(int max_steps, std::vector<StepRecord>* records = nullptr) {
    for (int i = 0; i < max_steps && !sched_.idle(); ++i) {
      StepRecord r = Step();
      if (records != nullptr) records->push_back(std::move(r));
    }
    return sched_.idle();
  }

  // Tokens not yet entered over every live request (what could fill free rows).
  int ReadyTokens() const {
    int n = 0;
    for (auto [id, s] : live_) n += static_cast<int>(s->tokens.size()) - s->num_entered;
    return n;
  }

  DepthScheduler& sched() { return sched_; }
  KvBlockPool& pool() { return pool_; }
  int steps() const { return steps_; }
  Sequence* live(uint64_t id) { return live_.count(id) ? live_.at(id) : nullptr; }
  const std::map<uint64_t, Finished>& finished() const { return finished_; }
  const std::vector<Dropped>& dropped() const { return dropped_; }
  int arrival_step(uint64_t id) const { return arrival_step_.at(id); }
  int64_t preempted_in(const std::string& where) const {
    return preempted_in_.count(where) ? preempted_in_.at(where) : 0;
  }
  // Called with each request just before Finish (its KV is still held).
  std::function<void(const Sequence&)> on_finish;

  // What positions slot `slot` of a finished request must hold, from the depth script.
  std::vector<int> ExpectedSlot(const Sequence& s, int segment, int loop) const {
    std::vector<int> out;
    const bool looped = segment == plan_.looped_segment;
    const int reached = plan_.kv == KvMode::kShared ? 0 : loop;
    for (int p = 0; p < s.num_done; ++p) {
      if (!looped || depth_(s.id, p) > reached) out.push_back(p);
    }
    return out;
  }

 private:
  struct State {
    bool running = false;
    int num_entered = 0, num_done = 0, preemptions = 0;
  };

  std::map<uint64_t, State> Snap() const {
    std::map<uint64_t, State> m;
    for (auto [id, s] : live_)
      m[id] = {s->running, s->num_entered, s->num_done, s->usage.preemptions};
    return m;
  }

  std::set<uint64_t> RunningIds() const {
    std::set<uint64_t> ids;
    for (const auto& s : sched_.running()) ids.insert(s->id);
    return ids;
  }

  int LoopRowsOf(const Sequence* s) const {
    int n = 0;
    for (const Row& r : sched_.loop_rows()) n += r.seq == s;
    return n;
  }

  void TakeDropped(StepPlan* plan, StepRecord* rec) {
    for (Dropped& d : plan->dropped) {
      std::unique_ptr<Sequence>& s = d.seq;
      if (s->cancelled) {
        EXPECT_EQ(d.reason, s->cancel_reason);
        EXPECT_TRUE(d.status.ok());
      } else {
        EXPECT_EQ(d.reason, FinishReason::kError);
        EXPECT_FALSE(d.status.ok());
      }
      EXPECT_TRUE(s->channel->TryPop() == std::nullopt) << "the scheduler pushed an event";
      EXPECT_EQ(s->kv->num_blocks(), 0) << "dropped request " << s->id << " still holds blocks";
      EXPECT_EQ(LoopRowsOf(s.get()), 0) << "dropped request " << s->id << " still has loop rows";
      EXPECT_EQ(RunningIds().count(s->id), 0u);
      rec->dropped.push_back(s->id);
      live_.erase(s->id);
      dropped_.push_back(std::move(d));
    }
  }

  // Preemption takes the newest running requests first, never the oldest, and leaves each
  // preempted request with no blocks, no rows and no progress.
  void CheckPreemptions(const std::map<uint64_t, State>& before, const StepPlan& plan,
                        StepRecord* rec) {
    std::set<uint64_t> listed;
    for (const Preemption& p : plan.preempted) {
      listed.insert(p.id);
      preempted_in_[p.what == Preemption::For::kEntering ? "entering" : "pass"] += 1;
    }
    const std::string where = "Schedule";
    std::vector<uint64_t> running_before, preempted;
    for (auto [id, st] : before) {
      if (!st.running) {
        listed.erase(id);  // admitted by this Schedule() and preempted before it returned
        continue;
      }
      running_before.push_back(id);
      if (live_.count(id) && live_.at(id)->usage.preemptions > st.preemptions)
        preempted.push_back(id);
    }
    EXPECT_EQ(std::set<uint64_t>(preempted.begin(), preempted.end()), listed)
        << "the plan lists other preemptions than happened";
    if (preempted.empty()) return;
    const std::vector<uint64_t> newest(running_before.end() - preempted.size(),
                                       running_before.end());
    EXPECT_EQ(preempted, newest) << where << " did not preempt the newest running requests";
    EXPECT_NE(preempted.front(), running_before.front())
        << where << " preempted the oldest request";
    const std::set<uint64_t> running = RunningIds();
    for (uint64_t id : preempted) {
      rec->preempted.push_back(id);
      const Sequence* s = live_.at(id);
      if (running.count(id)) continue;  // readmitted in the same call (checked as entering)
      EXPECT_FALSE(s->running);
      EXPECT_EQ(s->num_entered, 0) << "preempted request " << id;
      EXPECT_EQ(s->num_done, 0) << "preempted request " << id;
      EXPECT_EQ(s->kv->num_blocks(), 0) << "preempted request " << id << " kept blocks";
      EXPECT_TRUE(s->pending_tail.empty());
      EXPECT_EQ(s->rows_in_loop, 0);
      EXPECT_EQ(LoopRowsOf(s), 0);
      for (const Row& r : plan.loop_rows) EXPECT_NE(r.seq, s) << "preempted request " << id;
      for (const EnteringToken& t : plan.entering)
        EXPECT_NE(t.seq, s) << "preempted request " << id;
    }
  }

  void CheckEntering(const std::map<uint64_t, State>& before, const StepPlan& plan,
                     StepRecord* rec) {
    const std::vector<EnteringToken>& entering = plan.entering;
    const int loop_rows = static_cast<int>(plan.loop_rows.size());
    EXPECT_LE(static_cast<int>(entering.size()), config_.max_step_tokens);
    EXPECT_LE(loop_rows + static_cast<int>(entering.size()), config_.max_batch_rows);
    EXPECT_LE(sched_.num_running(), config_.max_running);
    if (config_.mode == BatchingMode::kSequenceWise && loop_rows > 0) EXPECT_TRUE(entering.empty());
    const std::set<uint64_t> running = RunningIds();
    std::map<uint64_t, std::vector<int>> by_seq;
    for (const EnteringToken& t : entering) {
      rec->entering.push_back({t.seq->id, t.position});
      by_seq[t.seq->id].push_back(t.position);
      EXPECT_TRUE(running.count(t.seq->id))
          << "request " << t.seq->id << " enters but is not running";
    }
    for (auto& [id, positions] : by_seq) {
      const Sequence* s = live_.at(id);
      const State& b = before.at(id);
      if (s->usage.preemptions > b.preemptions || b.num_entered == 0) {
        // Admitted (or recomputed after a preemption): from 0, or from a cached prefix of
        // whole blocks (its own completed blocks, kept by the prefix cache;
        // prefix_cache_engine_test checks such a start bit for bit), never from its last token.
        EXPECT_EQ(positions.front() % config_.block_size, 0) << "request " << id;
        EXPECT_LT(positions.front(), static_cast<int>(s->tokens.size())) << "request " << id;
      } else {
        EXPECT_EQ(positions.front(), b.num_entered)
            << "request " << id << " skipped or repeated a position";
      }
      for (size_t i = 1; i < positions.size(); ++i) EXPECT_EQ(positions[i], positions[i - 1] + 1);
      EXPECT_EQ(positions.back() + 1, s->num_entered);
      EXPECT_LE(s->num_entered, static_cast<int>(s->tokens.size()));
    }
    // FIFO without skipping: nothing admitted while an older request still waits.
    for (uint64_t id : running) {
      const State& b = before.at(id);
      const bool admitted = !b.running || live_.at(id)->usage.preemptions > b.preemptions;
      if (!admitted) continue;
      rec->admitted.push_back(id);
      for (auto [w, s] : live_) {
        if (!running.count(w))
          EXPECT_GT(w, id) << "request " << id << " was admitted before older " << w;
      }
    }
  }

  // A KV entry the run writes: after the slot's recorded entries and this run's earlier ones,
  // inside reserved blocks; listed for the scheduler to record (Update).
  void WriteEntry(Sequence* seq, int slot, int position, const char* where, RunOutput* out) {
    const KvBlockTable& t = seq->kv->slot(slot);
    int written = 0, last = t.num_tokens() > 0 ? t.positions().back() : -1;
    for (const KvWrite& w : out->kv_writes) {
      if (w.seq != seq || w.slot != slot) continue;
      ++written;
      last = w.position;
    }
    if (last >= position) {
      ADD_FAILURE() << where << ": request " << seq->id << " slot " << slot << " position "
                    << position << " written after position " << last;
      return;
    }
    EXPECT_EQ(t.BlocksNeeded(written + 1), 0)
        << where << ": request " << seq->id << " slot " << slot << " position " << position
        << " was not reserved";
    out->kv_writes.push_back({seq, slot, position});
  }

  // Every loop of the segments in [first, last), for rows in order (RunSegment's writes).
  void WriteSegments(int first, int last, Sequence* seq, int position, const char* where,
                     RunOutput* out) {
    for (int s = first; s < last; ++s) {
      for (int r = 0; r < plan_.segments[s].loops; ++r) {
        if (!plan_.WritesKv(s, r)) continue;
        for (int k = 0; k < plan_.segments[s].num_layers; ++k) {
          WriteEntry(seq, plan_.CacheSlot(s, r, k), position, where, out);
        }
      }
    }
  }

  // ModelExecutor::Run: entering tokens enter (rows with scripted depth 0 skip the loop),
  // then one pass over the loop rows and the entered rows that joined them.
  RunOutput Run(StepPlan&& plan, StepRecord* rec) {
    RunOutput out;
    std::vector<Row> rows = std::move(plan.loop_rows);
    for (const EnteringToken& t : plan.entering) {
      WriteSegments(0, plan_.looped_segment, t.seq, t.position, "enter", &out);
      Row r;
      r.seq = t.seq;
      r.position = t.position;
      r.tc_depth = depth_(t.seq->id, t.position);
      r.exited = r.tc_depth == 0;
      (r.exited ? out.skipped : rows).push_back(std::move(r));
    }
    if (!rows.empty()) {
      Pass(&rows, &out, rec);
      out.ran_pass = true;
    }
    out.passed = std::move(rows);
    return out;
  }

  // BlockPass: rows grouped by loop, one request's rows in position order; each writes its
  // loop's slots, advances one loop, and leaves when it has run its scripted depth.
  void Pass(std::vector<Row>* rows_in, RunOutput* out, StepRecord* rec) {
    std::vector<Row>& rows = *rows_in;
    EXPECT_LE(static_cast<int>(rows.size()), config_.max_batch_rows);
    std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
      if (a.loop != b.loop) return a.loop < b.loop;
      if (a.seq->id != b.seq->id) return a.seq->id < b.seq->id;
      return a.position < b.position;
    });
    const int s = plan_.looped_segment;
    std::vector<int> loops, exits;
    for (int k = 0; k < plan_.segments[s].num_layers; ++k) {
      for (const Row& r : rows) {
        if (plan_.WritesKv(s, r.loop))
          WriteEntry(r.seq, plan_.CacheSlot(s, r.loop, k), r.position, "pass", out);
      }
    }
    for (Row& r : rows) {
      EXPECT_FALSE(r.exited);
      EXPECT_LT(r.loop, r.tc_depth);
      loops.push_back(r.loop);
      if (++r.loop == r.tc_depth) {
        r.exited = true;
        exits.push_back(r.loop);
      }
    }
    rec->pass_rows.push_back(static_cast<int>(rows.size()));
    rec->pass_loops.push_back(std::move(loops));
    rec->pass_exits.push_back(std::move(exits));
  }

  // The tail gets, per request, the next positions in order, and only positions all of whose
  // predecessors left the loop.
  void CheckTail(const std::map<uint64_t, State>& before, const std::vector<Row>& tail) {
    std::map<uint64_t, std::vector<int>> by_seq;
    for (const Row& r : tail) by_seq[r.seq->id].push_back(r.position);
    for (auto& [id, positions] : by_seq) {
      EXPECT_EQ(positions.front(), before.at(id).num_done) << "request " << id;
      for (size_t i = 1; i < positions.size(); ++i) EXPECT_EQ(positions[i], positions[i - 1] + 1);
      EXPECT_EQ(positions.back() + 1, live_.at(id)->num_done);
    }
    for (const auto& s : sched_.running()) {
      EXPECT_GE(s->num_done, before.at(s->id).num_done) << "num_done went back";
      EXPECT_LE(s->num_done, s->num_entered);
      if (!s->pending_tail.empty()) {
        EXPECT_GT(s->pending_tail.begin()->first, s->num_done) << "a ready row was left behind";
      }
      for (const Row& r : sched_.loop_rows()) {
        if (r.seq == s.get())
          EXPECT_GE(r.position, s->num_done) << "a position passed an earlier one";
      }
    }
  }

  void Tail(std::vector<Row>* tail, StepRecord* rec) {
    const int segments = static_cast<int>(plan_.segments.size());
    std::vector<Sequence*> done;
    for (Row& r : *tail) {
      rec->tail.push_back({r.seq->id, r.position});
      EXPECT_EQ(r.loop, depth_(r.seq->id, r.position))
          << "request " << r.seq->id << " position " << r.position;
      ExpectRecorded(plan_.looped_segment + 1, segments, r.seq, r.position);
      Sequence* s = r.seq;
      if (r.position != static_cast<int>(s->tokens.size()) - 1) continue;
      s->tokens.push_back(SampledToken(s->id, r.position));
      if (s->num_generated() >= s->request.params.max_tokens) done.push_back(s);
    }
    for (Sequence* s : done) {
      CheckFinalKv(*s);
      if (on_finish) on_finish(*s);
      finished_[s->id] = {steps_, s->tokens, s->usage.preemptions};
      rec->finished.push_back(s->id);
      live_.erase(s->id);
      sched_.Release(s);
    }
  }

  // The entries the layers after the loop write are recorded before the tail runs.
  void ExpectRecorded(int first, int last, const Sequence* seq, int position) {
    for (int s = first; s < last; ++s) {
      for (int r = 0; r < plan_.segments[s].loops; ++r) {
        if (!plan_.WritesKv(s, r)) continue;
        for (int k = 0; k < plan_.segments[s].num_layers; ++k) {
          EXPECT_GE(seq->kv->slot(plan_.CacheSlot(s, r, k)).IndexOf(position), 0)
              << "request " << seq->id << " position " << position << " segment " << s;
        }
      }
    }
  }

  // Recursion-wise accounting: each slot holds exactly the positions that reached it, in
  // blocks that fit them (no reservation left over once every token is done).
  void CheckFinalKv(const Sequence& s) {
    EXPECT_EQ(s.num_done, s.num_entered);
    EXPECT_EQ(s.num_done, static_cast<int>(s.tokens.size()) - 1);
    for (int seg = 0; seg < static_cast<int>(plan_.segments.size()); ++seg) {
      for (int r = 0; r < plan_.segments[seg].loops; ++r) {
        for (int k = 0; k < plan_.segments[seg].num_layers; ++k) {
          const KvBlockTable& t = s.kv->slot(plan_.CacheSlot(seg, r, k));
          const std::vector<int> want = ExpectedSlot(s, seg, r);
          EXPECT_EQ(std::vector<int>(t.positions().begin(), t.positions().end()), want)
              << "request " << s.id << " segment " << seg << " loop " << r << " layer " << k;
          const int bs = config_.block_size;
          EXPECT_EQ(t.num_blocks(), (static_cast<int>(want.size()) + bs - 1) / bs)
              << "request " << s.id << " segment " << seg << " loop " << r << " layer " << k;
        }
      }
    }
  }

  // The pool's used blocks are exactly the running requests' blocks (a cached prefix's full
  // blocks may be shared by several); waiting ones hold none.
  void CheckPool() {
    std::set<int> held_ids;
    const std::set<uint64_t> running = RunningIds();
    for (auto [id, s] : live_) {
      if (running.count(id)) {
        for (int slot = 0; slot < s->kv->num_slots(); ++slot) {
          for (int b : s->kv->slot(slot).blocks()) held_ids.insert(b);
        }
      } else {
        EXPECT_EQ(s->kv->num_blocks(), 0) << "waiting request " << id << " holds blocks";
      }
    }
    EXPECT_EQ(static_cast<int>(held_ids.size()), pool_.num_used());
    EXPECT_EQ(sched_.num_running() + sched_.num_waiting(), static_cast<int>(live_.size()));
  }

  EngineConfig config_;
  LayerPlan plan_;
  KvBlockPool pool_;
  DepthFn depth_;
  DepthScheduler sched_;
  uint64_t next_id_ = 0;
  int steps_ = 0;
  std::map<uint64_t, Sequence*> live_;  // queued or running (owned by the scheduler)
  std::map<uint64_t, int> arrival_step_;
  std::map<uint64_t, Finished> finished_;
  std::vector<Dropped> dropped_;
  std::map<std::string, int64_t> preempted_in_;
};

std::vector<int> ExpectedTokens(uint64_t id, int prompt_len, int max_tokens) {
  std::vector<int> t;
  for (int i = 0; i < prompt_len; ++i) t.push_back(10 + static_cast<int>((id * 7 + i) % 200));
  for (int i = 0; i < max_tokens; ++i)
    t.push_back(SampledToken(id, static_cast<int>(t.size()) - 1));
  return t;
}

// ---------------------------------------------------------------------------------------
// FIFO admission

TEST(DepthSchedulerTest, AdmissionWaitsForBlocksWithoutSkipping) {
  // block_size 4, 40 blocks (watermark 1). A 32-token chunk needs 8 blocks in each of slots
  // 0, 7, and the two loop-0 slots: 32. After A (prompt 32) reserves slots 0 and 7 (16), 24
  // are free: B (prompt 32) does not fit, C (prompt 4, 4 blocks) would, but must not jump B.
  SchedulerSim sim(Config(BatchingMode::kDepthWise, 64, 64, 8, 4), MorPlan(), 40,
                   ByPosition(std::vector<int>(40, 1)));
  const uint64_t a = sim.Add(32, 2), b = sim.Add(32, 1), c = sim.Add(4, 1);
  StepRecord s1 = sim.Step();
  EXPECT_THAT(s1.admitted, ElementsAre(a));
  EXPECT_EQ(s1.entering.size(), 32u);
  EXPECT_EQ(sim.sched().num_waiting(), 2);
  // A now holds 32 blocks; its decode token takes 2 more; 6 free: still no room for B, so
  // C waits too.
  StepRecord s2 = sim.Step();
  EXPECT_THAT(s2.admitted, IsEmpty());
  EXPECT_THAT(s2.entering, ElementsAre(std::make_pair(a, 32)));
  EXPECT_THAT(s2.finished, ElementsAre(a));
  StepRecord s3 = sim.Step();
  EXPECT_THAT(s3.admitted, ElementsAre(b, c));
  EXPECT_EQ(s3.Entering(b).size(), 32u);
  EXPECT_THAT(s3.Entering(c), ElementsAre(0, 1, 2, 3));
  EXPECT_TRUE(sim.Run(10));
  EXPECT_EQ(sim.pool().num_free(), sim.pool().num_blocks());
}

TEST(DepthSchedulerTest, AdmissionFillsRowsInArrivalOrderWithChunks) {
  // 8 rows: A's 6 prompt tokens, then 2 of B's 5 (a prefill chunk); C waits for a row.
  SchedulerSim sim(Config(BatchingMode::kDepthWise, 8, 64, 8, 4), MorPlan(), 1000,
                   ByPosition(std::vector<int>(8, 1)));
  const uint64_t a = sim.Add(6, 1), b = sim.Add(5, 1), c = sim.Add(1, 1);
  StepRecord s1 = sim.Step();
  EXPECT_THAT(s1.admitted, ElementsAre(a, b));
  EXPECT_THAT(s1.Entering(a), ElementsAre(0, 1, 2, 3, 4, 5));
  EXPECT_THAT(s1.Entering(b), ElementsAre(0, 1));
  EXPECT_THAT(s1.Entering(c), IsEmpty());
  EXPECT_THAT(s1.finished, ElementsAre(a));
  StepRecord s2 = sim.Step();
  EXPECT_THAT(s2.admitted, ElementsAre(c));
  EXPECT_THAT(s2.Entering(b), ElementsAre(2, 3, 4));
  EXPECT_THAT(s2.Entering(c), ElementsAre(0));
  EXPECT_THAT(s2.finished, ElementsAre(b, c));
  EXPECT_TRUE(sim.sched().idle());
}

TEST(DepthSchedulerTest, MaxRunningAdmitsOneAtATimeInOrder) {
  SchedulerSim sim(Config(BatchingMode::kDepthWise, 16, 64, 1, 4), MorPlan(), 1000,
                   RandomDepths(7));
  for (int i = 0; i < 5; ++i) sim.Add(3 + i, 2);
  std::vector<StepRecord> steps;
  ASSERT_TRUE(sim.Run(200, &steps));
  std::vector<uint64_t> order;
  for (const StepRecord& s : steps) {
    EXPECT_LE(s.admitted.size(), 1u);
    order.insert(order.end(), s.admitted.begin(), s.admitted.end());
  }
  EXPECT_THAT(order, ElementsAre(0, 1, 2, 3, 4));
  for (uint64_t id = 1; id < 5; ++id) {
    EXPECT_GT(sim.finished().at(id).step, sim.finished().at(id - 1).step);
  }
}

// ---------------------------------------------------------------------------------------
// Refill at every depth

TEST(DepthSchedulerTest, DepthWiseRefillsAFreedRowAtOnce) {
  // 2 rows, one request of 6 prompt tokens with depths 1 3 2 1 1 3. A row that leaves after
  // loop 1 is replaced in the next pass by the next token, which runs loop 0 beside the
  // continuing row at loop 1.
  SchedulerSim sim(Config(BatchingMode::kDepthWise, 2, 64, 8, 4), MorPlan(), 100,
                   ByPosition({1, 3, 2, 1, 1, 3}));
  const uint64_t a = sim.Add(6, 1);
  std::vector<StepRecord> steps;
  ASSERT_TRUE(sim.Run(20, &steps));
  ASSERT_EQ(steps.size(), 7u);
  std::vector<int> rows;
  for (const StepRecord& s : steps) rows.insert(rows.end(), s.pass_rows.begin(), s.pass_rows.end());
  EXPECT_THAT(rows, ElementsAre(2, 2, 2, 2, 1, 1, 1));
  EXPECT_THAT(steps[0].Entering(a), ElementsAre(0, 1));
  EXPECT_THAT(steps[0].pass_exits[0], ElementsAre(1));
  EXPECT_THAT(steps[1].Entering(a), ElementsAre(2));
  EXPECT_THAT(steps[1].pass_loops[0], ElementsAre(0, 1));
  EXPECT_THAT(steps[2].Entering(a), IsEmpty());
  EXPECT_THAT(steps[2].pass_loops[0], ElementsAre(1, 2));
  EXPECT_THAT(steps[2].pass_exits[0], ElementsAre(2, 3));
  EXPECT_THAT(steps[3].Entering(a), ElementsAre(3, 4));
  EXPECT_THAT(steps[4].Entering(a), ElementsAre(5));
  EXPECT_EQ(sim.finished().at(a).tokens, ExpectedTokens(a, 6, 1));
}

TEST(DepthSchedulerTest, SequenceWiseEntersOnlyWhenTheLoopIsEmpty) {
  // Same request: each step runs its rows through every loop; the pass shrinks as rows leave.
  SchedulerSim sim(Config(BatchingMode::kSequenceWise, 2, 64, 8, 4), MorPlan(), 100,
                   ByPosition({1, 3, 2, 1, 1, 3}));
  const uint64_t a = sim.Add(6, 1);
  std::vector<StepRecord> steps;
  ASSERT_TRUE(sim.Run(20, &steps));
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_THAT(steps[0].pass_rows, ElementsAre(2, 1, 1));
  EXPECT_THAT(steps[1].pass_rows, ElementsAre(2, 1));
  EXPECT_THAT(steps[2].pass_rows, ElementsAre(2, 1, 1));
  EXPECT_THAT(steps[1].Entering(a), ElementsAre(2, 3));
  EXPECT_EQ(sim.finished().at(a).tokens, ExpectedTokens(a, 6, 1));
}

std::unique_ptr<Sequence> NewSequence(uint64_t id, int prompt_len) {
  auto seq = std::make_unique<Sequence>();
  seq->id = id;
  seq->request.request_id = "r" + std::to_string(id);
  seq->tokens.assign(prompt_len, 5);
  seq->num_prompt = prompt_len;
  seq->channel = std::make_shared<EventChannel>();
  return seq;
}

TEST(DepthSchedulerTest, NothingEntersSequenceWiseWhileRowsAreInTheLoop) {
  for (BatchingMode mode : {BatchingMode::kSequenceWise, BatchingMode::kDepthWise}) {
    KvBlockPool pool(100, 4);
    DepthScheduler sched(Config(mode, 8, 64, 8, 4), MorPlan(), &pool);
    sched.Add(NewSequence(0, 3));
    StepPlan first = sched.Schedule();
    ASSERT_EQ(first.entering.size(), 3u);
    RunOutput out;  // the three ran loop 0 and stay in the loop
    for (const EnteringToken& t : first.entering) {
      Row r;
      r.seq = t.seq;
      r.position = t.position;
      r.loop = 1;
      out.passed.push_back(std::move(r));
    }
    out.ran_pass = true;
    EXPECT_THAT(sched.Update(std::move(out)), IsEmpty());
    sched.Add(NewSequence(1, 2));  // fits the 5 free rows
    const std::vector<EnteringToken> second = sched.Schedule().entering;
    if (mode == BatchingMode::kSequenceWise) {
      EXPECT_TRUE(second.empty());
      EXPECT_EQ(sched.num_waiting(), 1);
    } else {
      EXPECT_EQ(second.size(), 2u);
      EXPECT_EQ(sched.num_running(), 2);
    }
  }
}

DepthFn ConstantDepth(int d) {
  return [d](uint64_t, int) { return d; };
}

TEST(DepthSchedulerTest, DepthWisePassesStayFullWhileWorkRemains) {
  constexpr int kRows = 8;
  SchedulerSim sim(Config(BatchingMode::kDepthWise, kRows, 1024, 256, 4), MorPlan(), 100000,
                   RandomDepths(11));
  for (int i = 0; i < 12; ++i) sim.Add(5 + i % 7, 6);
  std::set<int> refilled_after;  // loops after which a freed row was refilled in the next pass
  std::vector<int> last_exits;
  int full = 0;
  while (!sim.sched().idle() && sim.steps() < 1000) {
    const int ready = sim.ReadyTokens();
    const int free_rows = kRows - static_cast<int>(sim.sched().loop_rows().size());
    StepRecord s = sim.Step();
    ASSERT_EQ(s.pass_rows.size(), 1u) << "step " << sim.steps();
    EXPECT_EQ(static_cast<int>(s.entering.size()), std::min(free_rows, ready))
        << "step " << sim.steps();
    if (ready >= free_rows) {
      EXPECT_EQ(s.pass_rows[0], kRows) << "step " << sim.steps();
      ++full;
      refilled_after.insert(last_exits.begin(), last_exits.end());
    }
    last_exits = s.pass_exits[0];
  }
  EXPECT_TRUE(sim.sched().idle());
  EXPECT_EQ(sim.finished().size(), 12u);
  EXPECT_THAT(refilled_after, ElementsAre(1, 2, 3));
  EXPECT_GT(full, 20);
}

// Mean rows per pass for one workload; depth-wise keeps the batch fuller.
double FillRatio(BatchingMode mode, int* passes) {
  constexpr int kRows = 8;
  SchedulerSim sim(Config(mode, kRows, 1024, 256, 4), MorPlan(), 100000, RandomDepths(21));
  for (int i = 0; i < 16; ++i) sim.Add(3 + i % 5, 8);
  std::vector<StepRecord> steps;
  EXPECT_TRUE(sim.Run(2000, &steps));
  EXPECT_EQ(sim.finished().size(), 16u);
  int64_t rows = 0;
  *passes = 0;
  for (const StepRecord& s : steps) {
    for (int i = 0; i + 1 < static_cast<int>(s.pass_rows.size()); ++i) {
      EXPECT_LE(s.pass_rows[i + 1], s.pass_rows[i]) << "a sequence-wise pass grew within a step";
    }
    for (int r : s.pass_rows) rows += r;
    *passes += static_cast<int>(s.pass_rows.size());
  }
  return static_cast<double>(rows) / (*passes * kRows);
}

TEST(DepthSchedulerTest, DepthWiseFillsPassesBetterThanSequenceWise) {
  int depth_passes = 0, seq_passes = 0;
  const double depth_fill = FillRatio(BatchingMode::kDepthWise, &depth_passes);
  const double seq_fill = FillRatio(BatchingMode::kSequenceWise, &seq_passes);
  EXPECT_GT(depth_fill, seq_fill);
  EXPECT_LT(depth_passes, seq_passes);
}

// ---------------------------------------------------------------------------------------
// Limits

class DepthSchedulerModeTest : public ::testing::TestWithParam<BatchingMode> {};

TEST_P(DepthSchedulerModeTest, RespectsLimitsAndChunksALongPrompt) {
  // 6 rows, 4 tokens entering per step, 2 running requests (the simulator checks each call).
  SchedulerSim sim(Config(GetParam(), 6, 4, 2, 4), MorPlan(), 100000, RandomDepths(3));
  const uint64_t first = sim.Add(10, 3);
  for (int i = 0; i < 6; ++i) sim.Add(1 + i, 3);
  std::vector<StepRecord> steps;
  int max_running = 0, max_entering = 0, max_rows = 0;
  while (!sim.sched().idle() && sim.steps() < 500) {
    steps.push_back(sim.Step());
    EXPECT_LE(sim.sched().num_running(), 2);
    max_running = std::max(max_running, sim.sched().num_running());
    max_entering = std::max(max_entering, static_cast<int>(steps.back().entering.size()));
    for (int r : steps.back().pass_rows) max_rows = std::max(max_rows, r);
  }
  ASSERT_TRUE(sim.sched().idle());
  EXPECT_EQ(sim.finished().size(), 7u);
  EXPECT_EQ(max_running, 2);
  EXPECT_EQ(max_entering, 4);
  EXPECT_LE(max_rows, 6);
  if (GetParam() == BatchingMode::kDepthWise) EXPECT_EQ(max_rows, 6);  // continuing rows + 4 new
  // The 10-token prompt enters in chunks of at most 4, in order, over at least 3 steps.
  std::vector<int> prompt;
  int chunks = 0;
  for (const StepRecord& s : steps) {
    std::vector<int> chunk;
    for (int p : s.Entering(first)) {
      if (p < 10) chunk.push_back(p);
    }
    if (chunk.empty()) continue;
    ++chunks;
    EXPECT_LE(chunk.size(), 4u);
    prompt.insert(prompt.end(), chunk.begin(), chunk.end());
  }
  EXPECT_GE(chunks, 3);
  EXPECT_THAT(prompt, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));
  EXPECT_EQ(sim.finished().at(first).tokens, ExpectedTokens(first, 10, 3));
}

// ---------------------------------------------------------------------------------------
// No starvation

TEST_P(DepthSchedulerModeTest, EveryRequestFinishesWithinABound) {
  constexpr int kRequests = 60;
  SchedulerSim sim(Config(GetParam(), 16, 32, 8, 4), MorPlan(), 100000, RandomDepths(99));
  std::vector<int> prompt(kRequests), gen(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    prompt[i] = 1 + static_cast<int>(Mix(1000 + i) % 24);
    gen[i] = 1 + static_cast<int>(Mix(2000 + i) % 10);
  }
  int added = 0;
  std::map<uint64_t, int> first_admitted;
  while ((added < kRequests || !sim.sched().idle()) && sim.steps() < 5000) {
    for (int k = 0; k < 3 && added < kRequests; ++k, ++added) sim.Add(prompt[added], gen[added]);
    StepRecord s = sim.Step();
    for (uint64_t id : s.admitted) first_admitted.emplace(id, sim.steps());
  }
  ASSERT_EQ(sim.finished().size(), static_cast<size_t>(kRequests));
  // A request waits at most for the work of those that came no later, each token of which
  // takes at most kNr + 1 steps (and as many again while newer rows hold the batch).
  int64_t work = 0;
  for (uint64_t id = 0; id < kRequests; ++id) {
    work += prompt[id] + gen[id];
    const Finished& f = sim.finished().at(id);
    EXPECT_EQ(f.tokens, ExpectedTokens(id, prompt[id], gen[id]));
    EXPECT_LE(f.step - sim.arrival_step(id), 2 * (kNr + 1) * work) << "request " << id;
    if (id > 0) EXPECT_GE(first_admitted.at(id), first_admitted.at(id - 1)) << "request " << id;
  }
  EXPECT_EQ(sim.pool().num_free(), sim.pool().num_blocks());
}

TEST_P(DepthSchedulerModeTest, EveryRequestFinishesUnderPreemption) {
  // block_size 2: a request of up to 24 + 10 tokens at depth 3 needs at most 136 blocks; 160
  // hold one of them but not the 8 that may run at once.
  constexpr int kRequests = 30;
  SchedulerSim sim(Config(GetParam(), 16, 32, 8, 2), MorPlan(), 160, RandomDepths(5));
  std::vector<int> prompt(kRequests), gen(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    prompt[i] = 1 + static_cast<int>(Mix(3000 + i) % 24);
    gen[i] = 1 + static_cast<int>(Mix(4000 + i) % 10);
    sim.Add(prompt[i], gen[i]);
  }
  ASSERT_TRUE(sim.Run(20000));
  EXPECT_GT(sim.sched().num_preemptions(), 0);
  ASSERT_EQ(sim.finished().size(), static_cast<size_t>(kRequests));
  for (uint64_t id = 0; id < kRequests; ++id) {
    EXPECT_EQ(sim.finished().at(id).tokens, ExpectedTokens(id, prompt[id], gen[id]));
  }
  EXPECT_EQ(sim.finished().at(0).preemptions, 0);
  EXPECT_THAT(sim.dropped(), IsEmpty());
  EXPECT_EQ(sim.pool().num_free(), sim.pool().num_blocks());
}

INSTANTIATE_TEST_SUITE_P(Modes, DepthSchedulerModeTest,
                         ::testing::Values(BatchingMode::kDepthWise, BatchingMode::kSequenceWise),
                         [](const auto& info) {
                           return info.param == BatchingMode::kDepthWise ? "DepthWise"
                                                                         : "SequenceWise";
                         });

// ---------------------------------------------------------------------------------------
// Preemption

TEST(DepthSchedulerTest, PreemptsTheNewestAndRecomputesIt) {
  // block_size 2, every token runs all 3 loops: a request of 4 + 8 tokens ends holding 48
  // blocks (6 in each of 8 slots); 64 blocks cannot hold two of them.
  SchedulerSim sim(Config(BatchingMode::kDepthWise, 16, 64, 8, 2), MorPlan(), 64, ConstantDepth(3));
  const uint64_t a = sim.Add(4, 8), b = sim.Add(4, 8), c = sim.Add(4, 8);
  std::vector<StepRecord> steps;
  bool seen = false;
  while (!sim.sched().idle() && sim.steps() < 500) {
    steps.push_back(sim.Step());
    const StepRecord& s = steps.back();
    if (seen || s.preempted.empty()) continue;
    seen = true;
    // The first preemption takes the newest request (C), older ones keep running.
    EXPECT_EQ(s.preempted.front(), c);
    const Sequence* sc = sim.live(c);
    ASSERT_NE(sc, nullptr);
    EXPECT_FALSE(sc->running);
    EXPECT_EQ(sc->num_entered, 0);
    EXPECT_EQ(sc->kv->num_blocks(), 0);
    EXPECT_GE(sim.sched().num_waiting(), 1);
    ASSERT_FALSE(sim.sched().running().empty());
    EXPECT_EQ(sim.sched().running().front()->id, a);
  }
  ASSERT_TRUE(sim.sched().idle());
  EXPECT_TRUE(seen);
  EXPECT_GT(sim.sched().num_preemptions(), 0);
  EXPECT_EQ(sim.finished().at(a).preemptions, 0);
  EXPECT_GT(sim.finished().at(c).preemptions, 0);
  EXPECT_LT(sim.finished().at(a).step, sim.finished().at(b).step);
  for (uint64_t id : {a, b, c}) EXPECT_EQ(sim.finished().at(id).tokens, ExpectedTokens(id, 4, 8));
  EXPECT_EQ(sim.pool().num_free(), sim.pool().num_blocks());
}

TEST(DepthSchedulerTest, PreemptsAtEntryAndAtThePass) {
  // Entry slots fill first when tokens leave at loop 1 (block_size 1: 2 entry blocks and 2
  // loop blocks per token), loop slots when they run all 3 loops: both paths make room by
  // preempting the newest.
  int64_t at_entry = 0, at_pass = 0;
  // A request of 2 + 6 tokens ends holding 28 blocks at depth 1, 56 at depth 3.
  for (auto [depth, blocks] : {std::pair{1, 40}, std::pair{3, 60}}) {
    SchedulerSim sim(Config(BatchingMode::kDepthWise, 8, 64, 8, 1), MorPlan(), blocks,
                     ConstantDepth(depth));
    for (int i = 0; i < 4; ++i) sim.Add(2, 6);
    ASSERT_TRUE(sim.Run(500)) << "depth " << depth;
    EXPECT_EQ(sim.finished().size(), 4u);
    EXPECT_EQ(sim.pool().num_free(), sim.pool().num_blocks());
    at_entry += sim.preempted_in("entering");
    at_pass += sim.preempted_in("pass");
  }
  EXPECT_GT(at_entry, 0);
  EXPECT_GT(at_pass, 0);
}

// A request alone that outgrows the pool can never be served: it must fail with
// RESOURCE_EXHAUSTED, not stall the engine (nothing would ever free its blocks).
void ExpectFailedAlone(SchedulerSim* sim, uint64_t id) {
  EXPECT_TRUE(sim->Run(100)) << "the request neither finished nor failed";
  ASSERT_EQ(sim->dropped().size(), 1u);
  const Dropped& d = sim->dropped()[0];
  EXPECT_EQ(d.seq->id, id);
  EXPECT_EQ(d.reason, FinishReason::kError);
  EXPECT_EQ(d.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(sim->pool().num_free(), sim->pool().num_blocks());
}

TEST(DepthSchedulerTest, FailsARequestAloneThatOutgrowsThePoolAtThePass) {
  // block_size 1, depth 1: 2 entry blocks and 2 loop blocks per token. 10 blocks: the
  // 2-token prompt takes 8; the next token's entry takes the last 2; its pass finds none.
  SchedulerSim sim(Config(BatchingMode::kDepthWise, 8, 64, 8, 1), MorPlan(), 10, ConstantDepth(1));
  ExpectFailedAlone(&sim, sim.Add(2, 5));
}

TEST(DepthSchedulerTest, FailsARequestAloneThatOutgrowsThePoolAtEntry) {
  // 9 blocks: the prompt takes 8; the next token's entry needs 2 with 1 free.
  SchedulerSim sim(Config(BatchingMode::kDepthWise, 8, 64, 8, 1), MorPlan(), 9, ConstantDepth(1));
  ExpectFailedAlone(&sim, sim.Add(2, 5));
}

TEST(DepthSchedulerTest, FailsAChunkedPromptAloneThatOutgrowsThePool) {
  // 2-token prefill chunks: the first fits (8 of 11 blocks); the second's entry needs 4 with
  // 3 free.
  SchedulerSim sim(Config(BatchingMode::kDepthWise, 8, 2, 8, 1), MorPlan(), 11, ConstantDepth(1));
  ExpectFailedAlone(&sim, sim.Add(12, 1));
}

// ---------------------------------------------------------------------------------------
// Cancel

TEST(DepthSchedulerTest, CancelDropsRunningAndWaitingRequestsAtTheNextSchedule) {
  SchedulerSim sim(Config(BatchingMode::kDepthWise, 16, 64, 2, 4), MorPlan(), 1000,
                   ConstantDepth(3));
  const uint64_t a = sim.Add(8, 5), b = sim.Add(8, 5), c = sim.Add(8, 5);
  sim.Step();
  sim.Step();
  const Sequence* sb = sim.live(b);
  ASSERT_NE(sb, nullptr);
  ASSERT_TRUE(sb->running);
  EXPECT_GT(sb->kv->num_blocks(), 0);
  EXPECT_GT(sb->rows_in_loop, 0);
  EXPECT_EQ(sim.sched().num_waiting(), 1);  // c: max_running 2
  const int used = sim.pool().num_used();
  EXPECT_TRUE(sim.sched().Cancel("r1"));
  EXPECT_TRUE(sim.sched().Cancel("r2"));
  EXPECT_FALSE(sim.sched().Cancel("unknown"));
  EXPECT_EQ(sim.pool().num_used(), used);  // nothing happens before the next schedule
  StepRecord s = sim.Step();
  EXPECT_THAT(s.dropped, ElementsAre(b, c));
  EXPECT_THAT(s.Entering(b), IsEmpty());
  EXPECT_THAT(s.Entering(c), IsEmpty());
  EXPECT_EQ(sim.sched().num_running(), 1);
  EXPECT_EQ(sim.sched().num_waiting(), 0);
  for (const auto& d : sim.dropped()) {
    EXPECT_TRUE(d.seq->cancelled);
    EXPECT_EQ(d.seq->kv->num_blocks(), 0);
  }
  EXPECT_TRUE(sim.Run(100));
  EXPECT_EQ(sim.finished().size(), 1u);
  EXPECT_EQ(sim.finished().at(a).tokens, ExpectedTokens(a, 8, 5));
  EXPECT_EQ(sim.dropped().size(), 2u);  // reported once
  EXPECT_EQ(sim.pool().num_free(), sim.pool().num_blocks());
}

// ---------------------------------------------------------------------------------------
// In-order tail

std::vector<int> PendingTail(const Sequence* s) {
  std::vector<int> keys;
  for (const auto& [pos, row] : s->pending_tail) keys.push_back(pos);
  return keys;
}

TEST(DepthSchedulerTest, EarlyExitsWaitForEveryEarlierPosition) {
  // Depths 3 1 0 2 1: position 2 skips the loop, 1 and 4 leave after loop 1, 3 after loop 2;
  // all wait for position 0, which leaves after loop 3.
  SchedulerSim sim(Config(BatchingMode::kDepthWise, 8, 64, 8, 4), MorPlan(), 100,
                   ByPosition({3, 1, 0, 2, 1}));
  const uint64_t a = sim.Add(5, 1);
  StepRecord s1 = sim.Step();
  EXPECT_THAT(s1.Entering(a), ElementsAre(0, 1, 2, 3, 4));
  EXPECT_THAT(s1.pass_rows, ElementsAre(4));
  EXPECT_THAT(s1.tail, IsEmpty());
  EXPECT_THAT(PendingTail(sim.live(a)), ElementsAre(1, 2, 4));
  EXPECT_EQ(sim.live(a)->num_done, 0);
  EXPECT_EQ(sim.live(a)->rows_in_loop, 2);
  EXPECT_FALSE(sim.sched().HasPendingTail());
  StepRecord s2 = sim.Step();
  EXPECT_THAT(s2.pass_loops[0], ElementsAre(1, 1));
  EXPECT_THAT(s2.tail, IsEmpty());
  EXPECT_THAT(PendingTail(sim.live(a)), ElementsAre(1, 2, 3, 4));
  StepRecord s3 = sim.Step();
  EXPECT_THAT(s3.tail, ElementsAre(std::make_pair(a, 0), std::make_pair(a, 1), std::make_pair(a, 2),
                                   std::make_pair(a, 3), std::make_pair(a, 4)));
  EXPECT_THAT(s3.finished, ElementsAre(a));
  EXPECT_EQ(sim.finished().at(a).tokens, ExpectedTokens(a, 5, 1));
}

// ---------------------------------------------------------------------------------------
// Recursion-wise accounting

TEST(DepthSchedulerTest, SlotsHoldExactlyTheTokensThatReachedTheirLoop) {
  // 6 prompt tokens + 1 generated token enter, with depths 1 2 3 1 2 3 3.
  for (KvMode kv : {KvMode::kRecursionWise, KvMode::kShared}) {
    SchedulerSim sim(Config(BatchingMode::kDepthWise, 4, 64, 8, 2), MorPlan(kv), 100,
                     ByPosition({1, 2, 3, 1, 2, 3, 3}));
    sim.Add(6, 2);
    std::vector<int> counts;
    int blocks = -1;
    sim.on_finish = [&](const Sequence& s) {
      for (int slot = 0; slot < s.kv->num_slots(); ++slot)
        counts.push_back(s.kv->slot(slot).num_tokens());
      blocks = s.kv->num_blocks();
    };
    ASSERT_TRUE(sim.Run(50));
    if (kv == KvMode::kRecursionWise) {
      // first layer; loop 0 (2 layers): 7; loop 1: 5; loop 2: 3; last layer.
      EXPECT_THAT(counts, ElementsAre(7, 7, 7, 5, 5, 3, 3, 7));
      EXPECT_EQ(blocks, 4 + 4 + 4 + 3 + 3 + 2 + 2 + 4);
    } else {
      // Shared: loops 1 and 2 read loop 0's slots and write nothing.
      EXPECT_THAT(counts, ElementsAre(7, 7, 7, 7));
      EXPECT_EQ(blocks, 16);
    }
    EXPECT_EQ(sim.pool().num_free(), sim.pool().num_blocks());
  }
}

}  // namespace
}  // namespace morserve
