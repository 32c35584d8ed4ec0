// `morserve bench`: the decode-throughput protocol of docs/design.md#benchmark-protocol
// (after MoR Appendix D), engine only, no network. For every model x batch setting x
// batching mode, in one run: warm up, then submit N requests at once to the FIFO queue
// (short prompts, distinct per request, output lengths ~ N(mean, std) drawn from a fixed
// seed, greedy unless --temperature, EOS ignored) and step the engine
// until all finish. Reports tokens/s, shared-block rows/s, batch fill ratio, rows and
// exits per loop, layer rows by kind (full, K/V-only), KV blocks, preemptions; prints a table with
// side-by-side ratios and writes everything as JSON, rewritten after every batch setting
// ("complete": false until the last, so a run cut short keeps what it measured). With --repeats N
// the modes alternate N times and each keeps its fastest run (the machine this runs on is often
// shared). Weight bandwidth: the run first measures the machine's streaming read bandwidth
// (mem_bandwidth.h; --membw-mb, 0 skips it), or with --device cuda the GPU's device-to-device
// copy bandwidth, read + written (cuda_runner_registry.h), and each run reports the weight bytes
// its runner read (RunnerCounters::weight_bytes), their rate in GB/s (1e9 bytes/s) and that
// rate as a fraction of the measured bandwidth (with --device cuda: MBU). --prefill P also times,
// per model, the prefill of one P-token prompt (max_tokens 1) and reports prefill tokens/s.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/cpu/machine_limits.h"
#include "engine/cpu/mem_bandwidth.h"
#include "engine/cpu/thread_pool.h"
#include "engine/model/weights.h"
#include "engine/runtime/cuda_runner_registry.h"
#include "engine/runtime/engine.h"
#include "engine/tools/commands.h"
#include "engine/tools/engine_flags.h"
#include "nlohmann/json.hpp"

namespace morserve {
namespace {

using nlohmann::json;

constexpr char kUsage[] =
    "usage: morserve bench --models DIR[,DIR...] [--requests 1000] [--mean-tokens 256]\n"
    "         [--std-tokens 64] [--prompt-len 1] [--batches 32,256] [--modes depth,sequence]\n"
    "         [--warmup 32] [--seed 1] [--repeats 1] [--out bench.json]\n"
    "         [--temperature T (0: greedy; > 0: each request samples with its own seed)]\n"
    "         [--repetition-penalty R (1: off; every request, over its prompt and output)]\n"
    "         [--membw-mb 1024 (read-bandwidth buffer; 0: skip)] [--membw-passes 5]\n"
    "         [--prefill P (time one P-token prompt's prefill per model)]\n"
    "         [engine flags: --device cpu|cuda --weights auto|f32|bf16|f16|int8\n"
    "          --kv-cache-mb N --block-size N --threads N --recurrent-prefill tiled|naive]\n";

// Request i: its own prompt (prompt_len ids drawn from the vocabulary), its output length, and
// with temperature > 0 its own sampling seed. Distinct prompts (and sampling) give every request
// its own tokens: with one shared prompt and greedy decoding every request would produce the
// same tokens, and models whose depth depends on the token (MoR, early exit) would take the
// same depths in every request, which hides what depth-wise batching does.
struct Workload {
  std::vector<std::vector<int>> prompts;
  std::vector<int> output_lengths;
  float temperature = 0.0f;
  float repetition_penalty = 1.0f;
  uint64_t seed = 0;
};

Workload MakeWorkload(int requests, double mean, double stddev, int prompt_len, int context,
                      int vocab, float temperature, uint64_t seed) {
  Workload w;
  w.temperature = temperature;
  w.seed = seed;
  std::mt19937_64 ids(seed ^ 0x9e3779b97f4a7c15ULL);
  for (int i = 0; i < requests; ++i) {
    std::vector<int> p(prompt_len);
    for (int& t : p)
      t = 1 + static_cast<int>(ids() % static_cast<uint64_t>(std::max(1, vocab - 1)));
    w.prompts.push_back(std::move(p));
  }
  std::mt19937_64 rng(seed);
  auto uniform = [&] { return (static_cast<double>(rng() >> 11) + 0.5) / 9007199254740992.0; };
  for (int i = 0; i < requests; ++i) {  // Box-Muller: same lengths with every libstdc++
    const double z = std::sqrt(-2.0 * std::log(uniform())) * std::cos(2.0 * M_PI * uniform());
    const int len = static_cast<int>(std::lround(mean + stddev * z));
    w.output_lengths.push_back(std::clamp(len, 1, context - prompt_len));
  }
  return w;
}

void RunRequests(Engine* engine, const Workload& w, int count, int fixed_length = 0) {
  std::vector<std::shared_ptr<EventChannel>> channels;
  for (int i = 0; i < count; ++i) {
    const int n = static_cast<int>(w.prompts.size());
    GenerateRequest r;
    r.prompt = w.prompts[i % n];
    r.params.temperature = w.temperature;
    r.params.repetition_penalty = w.repetition_penalty;
    r.params.seed = w.seed + i;
    r.params.max_tokens = fixed_length > 0 ? fixed_length : w.output_lengths[i % n];
    r.params.ignore_eos = true;
    auto ch = engine->Submit(r);
    if (ch.ok()) channels.push_back(*ch);
  }
  engine->RunUntilIdle();
}

// CPU seconds of every thread of this process (a shared machine slows the wall clock more
// than the work: CPU per token is the steadier figure).
double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

json PhasesDelta(const StepPhaseSeconds& a, const StepPhaseSeconds& b) {
  return {{"schedule", b.schedule - a.schedule},
          {"enter", b.enter - a.enter},
          {"pass", b.pass - a.pass},
          {"tail", b.tail - a.tail},
          {"sample", b.sample - a.sample},
          {"report", b.report - a.report}};
}

// Weight bytes the runner read between two stats, their rate (GB/s) and its fraction of the
// measured read bandwidth (null when it was not measured).
json WeightTraffic(const EngineStats& a, const EngineStats& b, double seconds, double read_gbs) {
  const int64_t bytes = b.layer_rows.weight_bytes - a.layer_rows.weight_bytes;
  const double gbs = seconds > 0 ? bytes / seconds / 1e9 : 0.0;
  return {{"weight_bytes_read", bytes},
          {"weight_gbs", gbs},
          {"weight_bw_fraction", read_gbs > 0 ? json(gbs / read_gbs) : json(nullptr)}};
}

// The CUDA runner's launches (direct, and CUDA graph launches), copies, synchronisations and
// allocations and fixed-order GEMMs (--cuda-gemm) between two stats, per engine step, and the
// graphs captured in between (all zero on the CPU).
json DevicePerStep(const EngineStats& a, const EngineStats& b) {
  const RunnerCounters::Device& x = a.layer_rows.device;
  const RunnerCounters::Device& y = b.layer_rows.device;
  const double steps = std::max<int64_t>(1, b.steps - a.steps);
  return {{"launches", (y.launches - x.launches) / steps},
          {"graph_launches", (y.graph_launches - x.graph_launches) / steps},
          {"graph_captures", y.graph_captures - x.graph_captures},
          {"h2d_copies", (y.h2d_copies - x.h2d_copies) / steps},
          {"h2d_bytes", (y.h2d_bytes - x.h2d_bytes) / steps},
          {"d2h_copies", (y.d2h_copies - x.d2h_copies) / steps},
          {"d2h_bytes", (y.d2h_bytes - x.d2h_bytes) / steps},
          {"syncs", (y.syncs - x.syncs) / steps},
          {"allocations", (y.allocations - x.allocations) / steps},
          {"fixed_gemm_calls", (y.fixed_gemm_calls - x.fixed_gemm_calls) / steps}};
}

json StatsDelta(const EngineStats& a, const EngineStats& b, double seconds, double cpu_seconds,
                int batch, double read_gbs) {
  auto diff = [](const std::vector<int64_t>& x, const std::vector<int64_t>& y) {
    std::vector<int64_t> d(y.size());
    for (size_t i = 0; i < y.size(); ++i) d[i] = y[i] - (i < x.size() ? x[i] : 0);
    return d;
  };
  const int64_t tokens = b.tokens_generated - a.tokens_generated;
  const int64_t rows = b.pass_rows - a.pass_rows;
  const int64_t capacity = b.pass_row_capacity - a.pass_row_capacity;
  json out = {{"seconds", seconds},
              {"tokens_generated", tokens},
              {"tokens_per_s", tokens / seconds},
              {"cpu_seconds", cpu_seconds},
              {"cpu_us_per_token", tokens ? 1e6 * cpu_seconds / tokens : 0.0},
              {"step_phase_seconds", PhasesDelta(a.phases, b.phases)},
              {"steps", b.steps - a.steps},
              {"shared_block_passes", b.passes - a.passes},
              {"shared_block_rows", rows},
              {"shared_block_rows_per_s", rows / seconds},
              {"batch_fill_ratio", capacity ? static_cast<double>(rows) / capacity : 0.0},
              {"mean_rows_per_pass",
               (b.passes - a.passes) ? static_cast<double>(rows) / (b.passes - a.passes) : 0.0},
              {"rows_per_loop", diff(a.rows_per_loop, b.rows_per_loop)},
              {"exits_per_loop", diff(a.exits_per_loop, b.exits_per_loop)},
              {"layer_rows_full", b.layer_rows.full_rows - a.layer_rows.full_rows},
              {"layer_rows_kv_only", b.layer_rows.kv_only_rows - a.layer_rows.kv_only_rows},
              {"runner_sampled_rows", b.layer_rows.sampled_rows - a.layer_rows.sampled_rows},
              {"device_per_step", DevicePerStep(a, b)},
              {"max_kv_blocks_used", b.max_kv_blocks_used},
              {"kv_blocks_total", b.kv_blocks_total},
              {"preemptions", b.preemptions - a.preemptions},
              {"max_batch_rows", batch}};
  out.update(WeightTraffic(a, b, seconds, read_gbs));
  return out;
}

json ModelInfo(const ModelWeights& w, const std::string& dir) {
  const RecursionConfig& r = w.config.recursion;
  return {{"dir", dir},
          {"layers_unrolled", w.plan.num_unrolled_layers()},
          {"hidden", w.config.hidden_size},
          {"sharing", SharingName(r.sharing)},
          {"routing", RoutingName(r.routing)},
          {"num_recursions", r.num_recursions},
          {"capacity", r.router.capacity},
          {"exit_threshold", r.early_exit.threshold},
          {"exit_kv", r.early_exit.exit_kv == ExitKv::kPropagate ? "propagate" : "skip"},
          {"model_type", w.config.model_type},
          {"loop_mode", LoopModeName(r.default_loop_mode)},
          {"loop_exit_threshold", r.loop_exit_threshold}};
}

void PrintRow(const json& run) {
  const json& s = run["stats"];
  const std::string fraction = s["weight_bw_fraction"].is_null()
                                   ? "-"
                                   : absl::StrFormat("%.3f", s["weight_bw_fraction"].get<double>());
  std::printf("%-28s %-8s %6d %10.1f %12.1f %7.3f %9.2f %6d %8.2f %7s  %s\n",
              run["model"]["dir"].get<std::string>().substr(0, 28).c_str(),
              run["mode"].get<std::string>().c_str(), s["max_batch_rows"].get<int>(),
              s["tokens_per_s"].get<double>(), s["shared_block_rows_per_s"].get<double>(),
              s["batch_fill_ratio"].get<double>(), s["mean_rows_per_pass"].get<double>(),
              s["preemptions"].get<int>(), s["weight_gbs"].get<double>(), fraction.c_str(),
              s["rows_per_loop"].dump().c_str());
}

// depth/sequence for each (model, batch); model/vanilla for each (mode, batch).
json Ratios(const json& runs) {
  json out = json::array();
  auto find = [&](const std::string& dir, const std::string& mode, int batch) -> const json* {
    for (const json& r : runs) {
      if (r["model"]["dir"] == dir && r["mode"] == mode && r["stats"]["max_batch_rows"] == batch)
        return &r;
    }
    return nullptr;
  };
  std::string vanilla;
  for (const json& r : runs) {
    if (r["model"]["num_recursions"] == 1 && vanilla.empty()) vanilla = r["model"]["dir"];
  }
  for (const json& r : runs) {
    const std::string dir = r["model"]["dir"];
    const int batch = r["stats"]["max_batch_rows"];
    const double tps = r["stats"]["tokens_per_s"];
    if (r["mode"] == "depth") {
      if (const json* seq = find(dir, "sequence", batch)) {
        out.push_back({{"model", dir},
                       {"batch", batch},
                       {"what", "depth-wise / sequence-wise"},
                       {"ratio", tps / (*seq)["stats"]["tokens_per_s"].get<double>()}});
      }
    }
    if (!vanilla.empty() && dir != vanilla) {
      if (const json* v = find(vanilla, r["mode"], batch)) {
        out.push_back({{"model", dir},
                       {"batch", batch},
                       {"mode", r["mode"]},
                       {"what", "model / vanilla (same mode)"},
                       {"ratio", tps / (*v)["stats"]["tokens_per_s"].get<double>()}});
      }
    }
  }
  return out;
}

// One measured run on a fresh engine: warm up, then the whole workload.
absl::StatusOr<json> RunOnce(std::shared_ptr<const ModelWeights> weights, const EngineConfig& cfg,
                             const Workload& w, int warmup, double read_gbs) {
  auto engine = Engine::Create(std::move(weights), cfg);
  if (!engine.ok()) return engine.status();
  RunRequests(engine->get(), w, warmup, /*fixed_length=*/16);
  const EngineStats before = (*engine)->stats();
  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = ProcessCpuSeconds();
  RunRequests(engine->get(), w, static_cast<int>(w.output_lengths.size()));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return StatsDelta(before, (*engine)->stats(), secs, ProcessCpuSeconds() - cpu0,
                    cfg.max_batch_rows, read_gbs);
}

// Prefill of one `prompt_len`-token prompt (ids spread over the vocabulary, max_tokens 1) on
// a fresh engine after a short warm-up request: prompt tokens per second of the whole request.
// Multiply-adds x 2 of the projections of one token through every unrolled layer (attention
// scores and the LM head not counted): the work a prefill token costs at any prompt length.
double LinearFlopsPerToken(const ModelWeights& w) {
  const ModelConfig& c = w.config;
  const double per_layer = static_cast<double>(c.hidden_size) * (c.q_dim() + 2 * c.kv_dim()) +
                           static_cast<double>(c.q_dim()) * c.hidden_size +
                           3.0 * c.hidden_size * c.intermediate_size;
  return 2.0 * per_layer * w.plan.num_unrolled_layers();
}

absl::StatusOr<json> RunPrefill(std::shared_ptr<const ModelWeights> weights,
                                const EngineConfig& cfg, int prompt_len, double read_gbs,
                                double fma_gflops, double bf16_dot_gflops) {
  const int vocab = weights->config.vocab_size;
  const double flops_per_token = LinearFlopsPerToken(*weights);
  if (prompt_len >= weights->config.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prefill: ", prompt_len, " tokens do not fit the model's ",
                     weights->config.max_position_embeddings, " positions"));
  }
  auto engine = Engine::Create(std::move(weights), cfg);
  if (!engine.ok()) return engine.status();
  Workload warm;
  warm.prompts = {{1, 2, 3, 4}};
  warm.output_lengths = {1};
  RunRequests(engine->get(), warm, 1);
  Workload one;
  one.prompts.assign(1, std::vector<int>(prompt_len));
  one.output_lengths = {1};
  std::vector<int>& prompt = one.prompts[0];
  for (int i = 0; i < prompt_len; ++i)
    prompt[i] = static_cast<int>((int64_t{i} * 7919 + 3) % vocab);
  const EngineStats before = (*engine)->stats();
  const auto t0 = std::chrono::steady_clock::now();
  RunRequests(engine->get(), one, 1);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const EngineStats after = (*engine)->stats();
  const double gflops = flops_per_token * prompt_len / secs / 1e9;
  json out = {
      {"prompt_tokens", prompt_len},
      {"seconds", secs},
      {"prefill_tokens_per_s", prompt_len / secs},
      {"linear_gflops", gflops},
      {"fma_fraction", fma_gflops > 0 ? json(gflops / fma_gflops) : json(nullptr)},
      {"bf16_dot_fraction", bf16_dot_gflops > 0 ? json(gflops / bf16_dot_gflops) : json(nullptr)},
      {"max_step_tokens", cfg.max_step_tokens}};
  out.update(WeightTraffic(before, after, secs, read_gbs));
  return out;
}

int Fail(const std::string& msg) {
  std::fprintf(stderr, "morserve bench: %s\n", msg.c_str());
  return 1;
}

}  // namespace

int BenchCommand(const Args& args) {
  std::set<std::string> value_flags = {
      "models",       "requests", "mean-tokens", "std-tokens",
      "prompt-len",   "batches",  "modes",       "warmup",
      "seed",         "out",      "repeats",     "membw-mb",
      "membw-passes", "prefill",  "temperature", "repetition-penalty"};
  value_flags.insert(EngineFlagNames().begin(), EngineFlagNames().end());
  auto flags = Flags::Parse(args, value_flags, {"help"});
  if (!flags.ok() || flags->Has("help") || !flags->Has("models")) {
    if (!flags.ok())
      std::fprintf(stderr, "morserve bench: %s\n", std::string(flags.status().message()).c_str());
    std::fputs(kUsage, stderr);
    return flags.ok() && flags->Has("help") ? 0 : 2;
  }
  auto requests = flags->GetInt("requests", 1000);
  auto mean = flags->GetDouble("mean-tokens", 256);
  auto stddev = flags->GetDouble("std-tokens", 64);
  auto prompt_len = flags->GetInt("prompt-len", 1);
  auto warmup = flags->GetInt("warmup", 32);
  auto seed = flags->GetInt("seed", 1);
  auto repeats = flags->GetInt("repeats", 1);
  auto membw_mb = flags->GetInt("membw-mb", 1024);
  auto membw_passes = flags->GetInt("membw-passes", 5);
  auto prefill = flags->GetInt("prefill", 0);
  float temperature = 0.0f;
  if (flags->Has("temperature") &&
      (!absl::SimpleAtof(flags->Get("temperature", "0"), &temperature) || temperature < 0)) {
    return Fail("--temperature: a number >= 0 (0: greedy)");
  }
  float repetition_penalty = 1.0f;
  if (flags->Has("repetition-penalty") &&
      (!absl::SimpleAtof(flags->Get("repetition-penalty", "1"), &repetition_penalty) ||
       !(repetition_penalty > 0))) {
    return Fail("--repetition-penalty: a number > 0 (1: off)");
  }
  for (const absl::Status& s :
       {requests.status(), mean.status(), stddev.status(), prompt_len.status(), warmup.status(),
        seed.status(), repeats.status(), membw_mb.status(), membw_passes.status(),
        prefill.status()}) {
    if (!s.ok()) return Fail(std::string(s.message()));
  }
  if (*repeats < 1) return Fail("--repeats: must be >= 1");
  if (*membw_mb < 0) return Fail("--membw-mb: must be >= 0 (0 skips the measurement)");
  if (*membw_passes < 1) return Fail("--membw-passes: must be >= 1");
  if (*prefill < 0) return Fail("--prefill: must be >= 0 (0: none)");
  std::vector<int> batches;
  for (const std::string& b : flags->GetList("batches").empty()
                                  ? std::vector<std::string>{"32", "256"}
                                  : flags->GetList("batches")) {
    int v;
    if (!absl::SimpleAtoi(b, &v) || v < 1) return Fail("--batches: positive integers");
    batches.push_back(v);
  }
  std::vector<BatchingMode> modes;
  for (const std::string& m : flags->GetList("modes").empty()
                                  ? std::vector<std::string>{"depth", "sequence"}
                                  : flags->GetList("modes")) {
    auto mode = ParseBatchingMode(m);
    if (!mode.ok()) return Fail(std::string(mode.status().message()));
    modes.push_back(*mode);
  }
  auto base = EngineConfigFromFlags(*flags);
  if (!base.ok()) return Fail(std::string(base.status().message()));
  if (!flags->Has("kv-cache-mb") && !flags->Has("kv-blocks")) base->kv_cache_bytes = 2048ll << 20;

  json bandwidth = nullptr;
  double read_gbs = 0, fma_gflops = 0, bf16_dot_gflops = 0;
  if (*membw_mb > 0 && base->device == Device::kCuda) {
    // The GPU's copy bandwidth (read + written) is the reference of the weight rate (MBU).
    const CudaCopyBandwidthFn copy_bandwidth = RegisteredCudaCopyBandwidth();
    if (copy_bandwidth == nullptr) {
      return Fail(
          "--device cuda: this build has no CUDA backend (--membw-mb 0 skips the copy "
          "bandwidth)");
    }
    auto bw = copy_bandwidth(*membw_mb, *membw_passes);
    if (!bw.ok()) return Fail(std::string(bw.status().message()));
    read_gbs = *bw / 1e9;
    bandwidth = {{"device_copy_bandwidth_gbs", read_gbs},
                 {"buffer_bytes", static_cast<int64_t>(*membw_mb) << 20},
                 {"passes", *membw_passes}};
    std::printf("device copy bandwidth: %.0f GB/s (read + written, 2 x %lld MiB, best of %lld)\n\n",
                read_gbs, static_cast<long long>(*membw_mb), static_cast<long long>(*membw_passes));
  } else if (*membw_mb > 0) {
    ThreadPool pool(base->threads);
    auto bw = MeasureReadBandwidth(*membw_mb, *membw_passes, &pool);
    if (!bw.ok()) return Fail(std::string(bw.status().message()));
    read_gbs = bw->gbs;
    fma_gflops = MeasureFmaPeak(&pool);
    std::printf("fp32 FMA peak: %.1f GFLOP/s (%d threads)\n", fma_gflops, pool.num_threads());
    bf16_dot_gflops = MeasureBf16DotPeak(&pool);
    if (bf16_dot_gflops > 0)
      std::printf("bf16 dot-product peak (VDPBF16PS): %.1f GFLOP/s\n", bf16_dot_gflops);
    bandwidth = {{"read_bandwidth_gbs", bw->gbs},
                 {"fma_gflops", fma_gflops},
                 {"bf16_dot_gflops", bf16_dot_gflops},
                 {"buffer_bytes", bw->bytes},
                 {"threads", bw->threads},
                 {"passes", bw->passes}};
    std::printf("read bandwidth: %.2f GB/s (%lld MiB buffer, %d threads, best of %d passes)\n\n",
                bw->gbs, static_cast<long long>(bw->bytes >> 20), bw->threads, bw->passes);
  }

  json runs = json::array();
  json prefills = json::array();
  // The report as it stands, rewritten after every batch and prefill (through a temporary file
  // renamed over --out): a run cut short (a time limit, a failure) leaves what it measured,
  // marked "complete": false.
  const std::string out = flags->Get("out", "bench.json");
  // False when the report cannot be written (a missing directory, no permission).
  auto write_report = [&](bool complete) -> bool {
    const json report = {
        {"protocol",
         {{"requests", *requests},
          {"mean_tokens", *mean},
          {"std_tokens", *stddev},
          {"prompt_len", *prompt_len},
          {"warmup", *warmup},
          {"seed", *seed},
          {"repeats", *repeats},
          {"prefill", *prefill},
          {"temperature", temperature},
          {"repetition_penalty", repetition_penalty},
          {"distinct_prompts", true},
          {"weights", CpuWeightsName(base->weights)},
          {"device", base->device == Device::kCuda ? "cuda" : "cpu"}}},
        {"complete", complete},
        {"read_bandwidth", bandwidth},
        {"read_bandwidth_gbs", bandwidth.is_null() ? json(nullptr) : json(read_gbs)},
        {"runs", runs},
        {"prefill", prefills},
        {"ratios", Ratios(runs)}};
    const std::string tmp = out + ".partial";
    std::ofstream file(tmp);
    file << report.dump(2) << "\n";
    file.close();
    return file.good() && std::rename(tmp.c_str(), out.c_str()) == 0;
  };
  const std::string cannot_write = "--out: cannot write " + out;
  // Written once before the runs, so a path that cannot hold the report fails now, not after them.
  if (!write_report(/*complete=*/false)) return Fail(cannot_write);
  std::printf("%-28s %-8s %6s %10s %12s %7s %9s %6s %8s %7s  %s\n", "model", "mode", "batch",
              "tok/s", "block rows/s", "fill", "rows/pass", "preempt", "wt GB/s", "bw frac",
              "rows per loop");
  for (const std::string& dir : flags->GetList("models")) {
    auto weights = LoadModel(dir);
    if (!weights.ok()) return Fail(std::string(weights.status().message()));
    Workload w = MakeWorkload(*requests, *mean, *stddev, *prompt_len,
                              (*weights)->config.max_position_embeddings,
                              (*weights)->config.vocab_size, temperature, *seed);
    w.repetition_penalty = repetition_penalty;
    for (int batch : batches) {
      // Modes alternate within each repeat, and each mode keeps its fastest repeat, so a
      // burst of load from other processes on a shared machine hits both sides alike.
      std::vector<json> best(modes.size());
      std::vector<std::vector<double>> all(modes.size());
      for (int rep = 0; rep < *repeats; ++rep) {
        for (size_t m = 0; m < modes.size(); ++m) {
          EngineConfig cfg = *base;
          cfg.mode = modes[m];
          cfg.max_batch_rows = batch;
          cfg.max_running = batch;
          cfg.max_queue = *requests + *warmup;
          auto stats = RunOnce(*weights, cfg, w, *warmup, read_gbs);
          if (!stats.ok()) return Fail(std::string(stats.status().message()));
          all[m].push_back((*stats)["tokens_per_s"].get<double>());
          if (best[m].is_null() || (*stats)["tokens_per_s"] > best[m]["tokens_per_s"])
            best[m] = *stats;
        }
      }
      for (size_t m = 0; m < modes.size(); ++m) {
        best[m]["tokens_per_s_all_repeats"] = all[m];
        json run = {{"model", ModelInfo(**weights, dir)},
                    {"mode", BatchingModeName(modes[m])},
                    {"stats", best[m]}};
        PrintRow(run);
        std::fflush(stdout);
        runs.push_back(run);
      }
      if (!write_report(/*complete=*/false)) return Fail(cannot_write);
    }
    if (*prefill > 0) {
      EngineConfig cfg = *base;
      cfg.mode = modes[0];
      json best;
      for (int rep = 0; rep < *repeats; ++rep) {
        auto p = RunPrefill(*weights, cfg, *prefill, read_gbs, fma_gflops, bf16_dot_gflops);
        if (!p.ok()) return Fail(std::string(p.status().message()));
        if (best.is_null() || (*p)["prefill_tokens_per_s"] > best["prefill_tokens_per_s"])
          best = *p;
      }
      best["model"] = dir;
      best["mode"] = BatchingModeName(modes[0]);
      std::printf(
          "prefill %-28s %d tokens: %.1f tok/s, weights %.2f GB/s, projections %.1f GFLOP/s\n",
          dir.substr(0, 28).c_str(), *prefill, best["prefill_tokens_per_s"].get<double>(),
          best["weight_gbs"].get<double>(), best["linear_gflops"].get<double>());
      std::fflush(stdout);
      prefills.push_back(best);
      if (!write_report(/*complete=*/false)) return Fail(cannot_write);
    }
  }
  if (!write_report(/*complete=*/true)) return Fail(cannot_write);
  const json ratios = Ratios(runs);
  std::printf("\nratios (tokens/s, measured side by side in this run):\n");
  for (const json& r : ratios) {
    std::printf("  %-28s batch %4d %-9s %-30s %.3f\n",
                r["model"].get<std::string>().substr(0, 28).c_str(), r["batch"].get<int>(),
                r.value("mode", "").c_str(), r["what"].get<std::string>().c_str(),
                r["ratio"].get<double>());
  }
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

}  // namespace morserve
