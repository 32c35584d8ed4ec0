// The engine loop (see engine.h).
#include "engine/runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_model_runner.h"
#include "engine/cpu/linear_kernels.h"
#include "engine/runtime/cuda_runner_registry.h"

namespace morserve {
namespace {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateRunner(
    const std::shared_ptr<const ModelWeights>& weights, const EngineConfig& config, int blocks) {
  if (config.device == Device::kCpu) return CreateCpuModelRunner(weights, config, blocks);
  // The CUDA runner is linked into the programs that serve --device cuda (see
  // cuda_runner_registry.h).
  if (CudaRunnerFactory cuda = RegisteredCudaRunner(); cuda != nullptr)
    return cuda(weights, config, blocks);
  return absl::FailedPreconditionError(
      "--device cuda: this build has no CUDA backend (configure with -DMORSERVE_CUDA=ON "
      "-DMORSERVE_CUDA_RUNNER=ON)");
}

}  // namespace

int64_t KvBlockBytes(const ModelConfig& config, int block_size) {
  return 2ll * block_size * config.kv_dim() * static_cast<int64_t>(sizeof(float));
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::shared_ptr<const ModelWeights> weights,
                                                       const EngineConfig& config) {
  if (config.max_batch_rows < 1) return absl::InvalidArgumentError("max_batch_rows: must be >= 1");
  if (config.block_size < 1) return absl::InvalidArgumentError("block_size: must be >= 1");
  int blocks = config.num_kv_blocks;
  // The CUDA pool holds bf16 entries: half the bytes of the CPU pool's fp32 per block.
  const int64_t block_bytes =
      KvBlockBytes(weights->config, config.block_size) / (config.device == Device::kCuda ? 2 : 1);
  if (blocks <= 0) blocks = static_cast<int>(config.kv_cache_bytes / block_bytes);
  if (blocks < 1) return absl::InvalidArgumentError("kv cache: room for no block");
  const RecursionConfig& rec = weights->config.recursion;
  if (rec.routing == Routing::kEarlyExit && rec.early_exit.exit_kv == ExitKv::kPropagate &&
      rec.layer_kind == LayerKind::kRecurrent) {
    // A recurrent layer writes its pair after the layer output exists; a K/V-only row has
    // no output. Refuse rather than serve numbers that differ from docs/models.md#early-exit.
    return absl::UnimplementedError(
        "recursion.early_exit.exit_kv: propagate is not served for layer_kind recurrent");
  }
  if (config.device == Device::kCuda && config.weights != CpuWeights::kAuto &&
      config.weights != CpuWeights::kBF16) {
    return absl::InvalidArgumentError(
        "--weights: the CUDA backend keeps bf16 weights; auto or bf16 with --device cuda");
  }
  if (config.device == Device::kCpu && config.weights == CpuWeights::kAmxBf16 &&
      AmxBf16BestLinearKernels() == nullptr) {
    return absl::FailedPreconditionError(
        "--weights amx-bf16: this CPU has neither a usable AMX-BF16 (Sapphire Rapids or later, "
        "and a Linux that grants the tile state) nor AVX-512 BF16 (AMD Zen 4 or later, Cooper "
        "Lake)");
  }
  if (config.device == Device::kCpu && config.weights == CpuWeights::kW8A8 &&
      W8A8BestLinearKernels() == nullptr) {
    return absl::FailedPreconditionError(
        "--weights w8a8: this CPU has neither AVX-512 VNNI nor AVX2; int8 reads the same weights "
        "with fp32 activations on any CPU");
  }
  auto runner = CreateRunner(weights, config, blocks);
  if (!runner.ok()) return runner.status();
  return std::unique_ptr<Engine>(
      new Engine(std::move(weights), config, std::move(*runner), blocks));
}

Engine::Engine(std::shared_ptr<const ModelWeights> weights, const EngineConfig& config,
               std::unique_ptr<ModelRunner> runner, int num_blocks)
    : weights_(std::move(weights)), config_(config), runner_(std::move(runner)) {
  pool_ = std::make_unique<KvBlockPool>(num_blocks, config_.block_size);
  host_pool_ = std::make_unique<ThreadPool>(config_.threads);
  row_sampler_ = std::make_unique<RowSampler>(host_pool_.get());
  executor_ = std::make_unique<ModelExecutor>(weights_, runner_.get(), pool_.get());
  scheduler_ = std::make_unique<DepthScheduler>(config_, weights_->plan, pool_.get());
  eos_ = weights_->config.eos_token_ids;
  const int loops = std::max(1, weights_->config.recursion.num_recursions);
  stats_.rows_per_loop.assign(loops, 0);
  stats_.exits_per_loop.assign(loops + 1, 0);
  stats_.kv_blocks_total = num_blocks;
}

Engine::~Engine() { Stop(); }

absl::Status Engine::Validate(const GenerateRequest& r) const {
  const ModelConfig& c = weights_->config;
  if (r.prompt.empty()) return absl::InvalidArgumentError("prompt: must not be empty");
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt: token id ", r.prompt[i], " at index ",
                                                     i, " is outside the vocabulary (",
                                                     c.vocab_size, ")"));
    }
  }
  const int context = c.max_position_embeddings;
  // A prompt scored without generating (max_tokens 0) may fill the context.
  const bool scoring_only = r.params.max_tokens == 0 && r.params.prompt_logprobs.has_value();
  if (static_cast<int>(r.prompt.size()) > context ||
      (!scoring_only && static_cast<int>(r.prompt.size()) == context)) {
    return absl::FailedPreconditionError(absl::StrCat("prompt: ", r.prompt.size(),
                                                      " tokens do not fit the context of ", context,
                                                      " tokens (one must remain for the output)"));
  }
  if (auto s = morserve::Validate(r.params, c.vocab_size, c.eos_token_ids); !s.ok()) return s;
  if (static_cast<int64_t>(r.prompt.size()) + r.params.max_tokens > context) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens: ", r.params.max_tokens, " plus the prompt's ", r.prompt.size(),
                     " tokens exceeds the context of ", context, " tokens"));
  }
  if (r.exit_threshold && !(*r.exit_threshold > 0.0f)) {
    return absl::InvalidArgumentError("exit_threshold: must be > 0");
  }
  const RecursionConfig& rc = c.recursion;
  if (r.loop_mode == LoopMode::kAdaptive && rc.exit_rule == LoopExitRule::kNone) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mode: adaptive needs a looped model with an exit rule (ouro, huginn_raven); model_type ",
        c.model_type, " runs full depth only"));
  }
  if ((r.num_steps || r.init_scale) && !c.huginn.enabled) {
    return absl::InvalidArgumentError(absl::StrCat(
        r.num_steps ? "num_steps" : "init_scale",
        ": only Huginn-0125 (model_type huginn_raven) takes it; model_type ", c.model_type));
  }
  if (r.num_steps && (*r.num_steps < 1 || *r.num_steps > rc.num_recursions)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_steps: ", *r.num_steps, " outside 1..", rc.num_recursions,
        " (the model's recurrences, looped.json's num_steps else mean_recurrence: the KV cache "
        "holds that many)"));
  }
  if (r.init_scale && !(*r.init_scale >= 0.0f && std::isfinite(*r.init_scale))) {
    return absl::InvalidArgumentError("init_scale: must be a finite number >= 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<EventChannel>> Engine::Submit(GenerateRequest request) {
  if (auto s = Validate(request); !s.ok()) return s;
  auto seq = std::make_unique<Sequence>();
  seq->channel = std::make_shared<EventChannel>();
  seq->seed = ResolveSeed(request.params);
  const ModelConfig& c = weights_->config;
  if (c.huginn.enabled && !request.init_scale && c.huginn.init_scale != 0.0f) {
    request.init_scale = c.huginn.init_scale;  // looped.json's: part of the prefix cache key
  }
  seq->tokens = request.prompt;
  seq->num_prompt = static_cast<int>(request.prompt.size());
  const RecursionConfig& rc = weights_->config.recursion;
  seq->adaptive_loops = rc.exit_rule != LoopExitRule::kNone &&
                        request.loop_mode.value_or(rc.default_loop_mode) == LoopMode::kAdaptive;
  seq->serial_generated = c.huginn.enabled && seq->adaptive_loops;
  seq->arrival_time = NowSeconds();
  seq->request = std::move(request);
  std::shared_ptr<EventChannel> channel = seq->channel;
  {
    std::lock_guard<std::mutex> lock(incoming_mu_);
    // The FIFO queue holds max_queue requests beyond those that can run at once.
    if (pending_ >= config_.max_queue + config_.max_running) {
      return absl::ResourceExhaustedError(absl::StrCat("the request queue is full: ", pending_,
                                                       " requests queued or running (max_queue ",
                                                       config_.max_queue, ")"));
    }
    seq->id = next_id_++;
    incoming_.push_back(std::move(seq));
    ++pending_;
  }
  incoming_cv_.notify_one();
  return channel;
}

void Engine::Cancel(const std::string& request_id, FinishReason reason) {
  {
    std::lock_guard<std::mutex> lock(incoming_mu_);
    cancels_.emplace_back(request_id, reason);
  }
  incoming_cv_.notify_one();
}

void Engine::DrainIncoming() {
  std::vector<std::unique_ptr<Sequence>> incoming;
  std::vector<std::pair<std::string, FinishReason>> cancels;
  {
    std::lock_guard<std::mutex> lock(incoming_mu_);
    incoming.swap(incoming_);
    cancels.swap(cancels_);
  }
  for (auto& seq : incoming) scheduler_->Add(std::move(seq));
  for (const auto& [id, reason] : cancels) scheduler_->Cancel(id, reason);
}

// Requests the scheduler let go (cancelled, or failed: the KV cache cannot hold them).
void Engine::FinishDropped(std::vector<Dropped>* dropped) {
  for (Dropped& d : *dropped) {
    RequestEvent e;
    e.finish = d.reason;
    e.error = std::move(d.status);
    Finish(*d.seq, std::move(e));
  }
  dropped->clear();
}

// Counts the pass's full rows by the loop they ran (K/V-only rows show in
// stats_.layer_rows).
void Engine::RecordPass(const RunOutput& out) {
  if (!out.ran_pass) return;
  std::lock_guard<std::mutex> lock(stats_mu_);
  ++stats_.passes;
  stats_.pass_row_capacity += config_.max_batch_rows;
  for (const Row& r : out.passed) {
    if (r.kv_only) continue;
    ++stats_.pass_rows;
    if (r.loop - 1 >= 0 && r.loop - 1 < static_cast<int>(stats_.rows_per_loop.size())) {
      ++stats_.rows_per_loop[r.loop - 1];  // loop already advanced by the pass
    }
  }
}

// First admission of each entering request (re-admissions after preemption keep theirs).
void Engine::NoteAdmitted(const std::vector<EnteringToken>& entering) {
  double now = 0;
  for (const EnteringToken& t : entering) {
    if (t.seq->admitted_time != 0) continue;
    if (now == 0) now = NowSeconds();
    t.seq->admitted_time = now;
    if (observer_) observer_->OnAdmitted(now - t.seq->arrival_time);
  }
}

void Engine::ReportStep(double start, const EngineStats& before, const StepPhaseSeconds& phases) {
  EngineStats after = stats();
  StepReport r;
  r.duration_seconds = NowSeconds() - start;
  r.passes = static_cast<int>(after.passes - before.passes);
  r.pass_rows = static_cast<int>(after.pass_rows - before.pass_rows);
  r.pass_row_capacity = static_cast<int>(after.pass_row_capacity - before.pass_row_capacity);
  r.rows_per_loop.resize(after.rows_per_loop.size());
  for (size_t i = 0; i < after.rows_per_loop.size(); ++i) {
    r.rows_per_loop[i] = after.rows_per_loop[i] - before.rows_per_loop[i];
  }
  r.exits_per_loop.resize(after.exits_per_loop.size());
  for (size_t i = 0; i < after.exits_per_loop.size(); ++i) {
    r.exits_per_loop[i] = after.exits_per_loop[i] - before.exits_per_loop[i];
  }
  r.tokens_generated = static_cast<int>(after.tokens_generated - before.tokens_generated);
  r.prompt_tokens = static_cast<int>(after.prompt_tokens - before.prompt_tokens);
  r.preemptions = static_cast<int>(after.preemptions - before.preemptions);
  r.running = after.running;
  r.waiting = after.waiting;
  r.kv_blocks_used = after.kv_blocks_used;
  r.kv_blocks_total = after.kv_blocks_total;
  r.prefix_cache_queries = after.prefix_cache_queries - before.prefix_cache_queries;
  r.prefix_cache_hits = after.prefix_cache_hits - before.prefix_cache_hits;
  r.prefix_cache_evictions = after.prefix_cache_evictions - before.prefix_cache_evictions;
  r.prefix_cache_blocks = after.prefix_cache_blocks;
  r.phases = phases;
  observer_->OnStep(r);
}

// Adds the seconds since the last lap to a phase.
class PhaseClock {
 public:
  explicit PhaseClock(double start) : mark_(start) {}
  void Lap(double* phase) {
    const double now = NowSeconds();
    *phase += now - mark_;
    mark_ = now;
  }

 private:
  double mark_;
};

// Schedule -> Run -> Update -> Complete (step_plan.h). Sequence-wise batching repeats
// Schedule/Run/Update until the loop is empty.
bool Engine::Step() {
  const double start = NowSeconds();
  const EngineStats before = observer_ ? stats() : EngineStats{};
  StepPhaseSeconds t;
  PhaseClock clock(start);
  DrainIncoming();
  StepPlan plan = scheduler_->Schedule();
  NoteAdmitted(plan.entering);
  const bool dropped = !plan.dropped.empty();
  FinishDropped(&plan.dropped);
  if (!plan.has_work() && !scheduler_->HasPendingTail()) {
    if (dropped) {  // cancellations freed blocks: let stats and metrics see it
      UpdateGauges();
      if (observer_) ReportStep(start, before, {});
    }
    return !scheduler_->idle();
  }
  clock.Lap(&t.schedule);
  std::vector<Row> tail;
  for (;;) {
    RunOutput out = executor_->Run(std::move(plan));
    clock.Lap(&t.pass);
    t.enter += out.enter_seconds;
    t.pass -= out.enter_seconds;
    RecordPass(out);
    tail = scheduler_->Update(std::move(out));
    if (config_.mode != BatchingMode::kSequenceWise || scheduler_->loop_rows().empty()) break;
    plan = scheduler_->Schedule();
    FinishDropped(&plan.dropped);
    clock.Lap(&t.schedule);
  }
  clock.Lap(&t.schedule);
  Complete(std::move(tail), &t, &clock);
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.steps;
  }
  UpdateGauges();
  if (observer_) ReportStep(start, before, t);
  clock.Lap(&t.report);
  AddPhases(t);
  return true;
}

void Engine::AddPhases(const StepPhaseSeconds& t) {
  std::lock_guard<std::mutex> lock(stats_mu_);
  StepPhaseSeconds& p = stats_.phases;
  p.schedule += t.schedule;
  p.enter += t.enter;
  p.pass += t.pass;
  p.tail += t.tail;
  p.sample += t.sample;
  p.report += t.report;
}

void Engine::UpdateGauges() {
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.preemptions = scheduler_->num_preemptions();
  stats_.kv_blocks_used = pool_->num_used();
  stats_.max_kv_blocks_used = std::max(stats_.max_kv_blocks_used, pool_->num_used());
  stats_.running = scheduler_->num_running();
  stats_.waiting = scheduler_->num_waiting();
  stats_.layer_rows = runner_->counters();
  stats_.prefix_cache_queries = scheduler_->prefix_queries();
  stats_.prefix_cache_hits = scheduler_->prefix_hits();
  if (const PrefixCache* cache = scheduler_->prefix_cache()) {
    stats_.prefix_cache_evictions = cache->evicted_blocks();
    stats_.prefix_cache_blocks = cache->num_blocks();
  }
}

// Rows that finished the loop: the layers after it, then count their loops and emit the next
// token where the runner sampled it or logits were produced (the latter sampled here, every
// such row at once: a request has at most one, its last known token, so no row's draw reads a
// token another row of the step adds).
void Engine::Complete(std::vector<Row> tail, StepPhaseSeconds* t, PhaseClock* clock) {
  executor_->Tail(&tail);
  clock->Lap(&t->tail);
  std::vector<SampleInput> inputs;  // rows with logits; the runner sampled the others
  for (const Row& row : tail) {
    if (row.logits.empty()) continue;
    inputs.push_back(NextTokenInput(*row.seq, eos_));
    inputs.back().logits = row.logits;
  }
  std::vector<SampleResult> samples;
  row_sampler_->SampleRows(inputs, &samples);
  size_t next_sample = 0;
  std::vector<Sequence*> finished;
  for (Row& row : tail) {
    Sequence* seq = row.seq;
    seq->usage.recursion_loops += row.loop;
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      if (row.loop < static_cast<int>(stats_.exits_per_loop.size()))
        ++stats_.exits_per_loop[row.loop];
      if (row.position < seq->num_prompt) ++stats_.prompt_tokens;
    }
    if (row.prompt_logprob) KeepPromptLogprob(seq, row);
    if (row.sample || !row.logits.empty()) {
      SampleResult s = row.sample ? std::move(*row.sample) : std::move(samples[next_sample++]);
      if (Emit(seq, row, std::move(s))) finished.push_back(seq);
    } else if (seq->request.params.max_tokens == 0 && row.position + 1 == seq->num_prompt) {
      FinishScoredPrompt(seq);
      finished.push_back(seq);
    }
  }
  for (Sequence* seq : finished) scheduler_->Release(seq);
  clock->Lap(&t->sample);
}

// The one end of every request, whatever the reason (stop, length, cancel, error, a scored
// prompt): usage, the observer, the final event (`last` may carry the last token), and the
// count of pending requests.
void Engine::Finish(Sequence& seq, RequestEvent last) {
  last.usage = seq.usage;
  last.usage.prompt_tokens = seq.num_prompt;
  last.usage.completion_tokens = seq.num_generated();
  if (observer_) observer_->OnFinished(last.finish, NowSeconds() - seq.arrival_time, last.usage);
  seq.channel->Push(std::move(last));
  std::lock_guard<std::mutex> lock(incoming_mu_);
  --pending_;
}

void Engine::KeepPromptLogprob(Sequence* seq, Row& row) {
  const size_t index = row.position;  // scores prompt token position + 1
  if (seq->prompt_logprobs.size() <= index) seq->prompt_logprobs.resize(index + 1);
  seq->prompt_logprobs[index] = std::move(*row.prompt_logprob);
  row.prompt_logprob.reset();
}

// Moves the gathered prompt logprobs onto `e` the first time (tail rows arrive in position
// order, so every prompt position has been scored when the last one completes).
void Engine::AttachPromptLogprobs(Sequence* seq, RequestEvent* e) {
  if (!seq->request.params.prompt_logprobs || seq->prompt_logprobs_sent) return;
  seq->prompt_logprobs.resize(std::max(0, seq->num_prompt - 1));
  e->prompt_logprobs = std::move(seq->prompt_logprobs);
  seq->prompt_logprobs.clear();
  seq->prompt_logprobs_sent = true;
}

// max_tokens 0: the prompt is scored and nothing is generated.
void Engine::FinishScoredPrompt(Sequence* seq) {
  RequestEvent e;
  AttachPromptLogprobs(seq, &e);
  e.finish = FinishReason::kLength;
  Finish(*seq, std::move(e));
}

// Adds the sampled token `s`; returns true when the request finished.
bool Engine::Emit(Sequence* seq, const Row& row, SampleResult s) {
  const SamplingParams& p = seq->request.params;
  seq->tokens.push_back(s.token);
  const double now = NowSeconds();
  const bool first = seq->num_generated() == 1;
  if (observer_) {
    observer_->OnToken(first, now - (first ? seq->arrival_time : seq->last_token_time),
                       seq->token_loops[row.position]);
  }
  if (first) seq->first_token_time = now;
  seq->last_token_time = now;
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.tokens_generated;
  }
  RequestEvent e;
  AttachPromptLogprobs(seq, &e);
  e.tokens.push_back({s.token, s.logprob, std::move(s.top_logprobs), seq->token_loops[row.position],
                      seq->request.return_logits ? row.logits : std::vector<float>{}});
  const bool is_eos = !p.ignore_eos && std::find(eos_.begin(), eos_.end(), s.token) != eos_.end();
  const bool is_stop = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), s.token) !=
                       p.stop_token_ids.end();
  if (is_eos || is_stop) {
    e.finish = FinishReason::kStop;
  } else if (seq->num_generated() >= p.max_tokens ||
             static_cast<int>(seq->tokens.size()) >= weights_->config.max_position_embeddings) {
    e.finish = FinishReason::kLength;
  }
  if (!e.final()) {
    seq->channel->Push(std::move(e));
    return false;
  }
  Finish(*seq, std::move(e));
  return true;
}

void Engine::RunUntilIdle() {
  for (;;) {
    Step();
    std::lock_guard<std::mutex> lock(incoming_mu_);
    if (pending_ == 0 && incoming_.empty()) return;
  }
}

void Engine::Start() {
  stop_ = false;
  thread_ = std::thread([this] {
    while (!stop_) {
      heartbeat_.fetch_add(1, std::memory_order_relaxed);
      if (Step()) continue;
      std::unique_lock<std::mutex> lock(incoming_mu_);
      incoming_cv_.wait_for(lock, std::chrono::milliseconds(50),
                            [&] { return stop_ || !incoming_.empty() || !cancels_.empty(); });
    }
  });
}

void Engine::Stop() {
  stop_ = true;
  incoming_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

}  // namespace morserve
