// Option parsing (see options.h).
#include "loadtest/options.h"

#include <cmath>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/tools/flags.h"

namespace morserve::loadtest {

const char* Usage() {
  return R"(usage: morserve-loadtest [run] TARGET [options]
       morserve-loadtest report --input LABEL=RUN.json[,LABEL=RUN.json...] --out-dir DIR [--title T]

Target (loopback only unless --allow-remote-host):
  --grpc HOST:PORT            morserve's gRPC Generate
  --url http://HOST:PORT/v1/completions | .../v1/chat/completions   any OpenAI-compatible server
  --model NAME                HTTP "model" (default: the first id of GET /v1/models)
  --api-key KEY               HTTP bearer token
  --logprobs N                HTTP: request logprobs (top N, 0..20) so each chunk's tokens are
                              counted exactly (default: off, one token per text chunk)
  --no-keep-alive             HTTP: a new connection per request (Connection: close); default:
                              keep-alive, idle connections reused (at most --max-concurrency)
Workload:
  --workload random|jsonl|decode|chat   (default random; decode = 1-token prompt, output ~
                              N(256, 64); chat = multi-turn conversations, below)
  --input-len D --output-len D     D: N | fixed:N | uniform:LO:HI | normal:MEAN:STD
  --dataset FILE.jsonl        {"prompt": "text" | [ids], "max_tokens": N} per line
  --vocab-size N              token ids for random prompts (gRPC: from the server)
  --seed N                    workload and arrival seed (default 0)
  --respect-eos               stop at EOS (default: ignore_eos, so output lengths are exact)
  --temperature T             (default 0)
Chat workload (gRPC or a /v1/chat/completions URL; loadtest/chat_workload.h):
  --conversations N           measured conversations (default 16); --warmup N conversations
  --turns N                   user turns per conversation (default 4); each resends the
                              conversation so far with the server's replies
  --system-prompt-words N     shared system prompt (default 750 words, ~1,000 demo tokens)
  --user-words D              words per user message (default uniform:20:60)
                              --output-len D is max_tokens per turn (default 32);
                              --request-rate is conversation starts per second
Traffic:
  --num-requests N            measured requests (default 100)
  --warmup N                  requests before the measured ones, excluded (default 0)
  --request-rate R            requests/s, or inf (default: inf, all at once)
  --burstiness B              gamma shape of the gaps; 1 = Poisson (default 1)
  --max-concurrency N         at most N in flight (default: unbounded)
  --duration S                stop after S seconds; open requests are cut (fail)
  --timeout S                 per-request timeout (default 600)
Report:
  --slo ttft:MS,tpot:MS,itl:MS,e2e:MS   goodput counts requests meeting all given limits
  --metrics-url URL           server's Prometheus /metrics to scrape during the run
  --scrape-interval-ms N      (default 500)
  --cpu-pid [NAME=]PID[,...]  CPU seconds of these processes over the measured phase, and
                              per output token (/proc/PID/stat utime + stime)
  --out FILE.json  --plots DIR  --label NAME  --no-progress
)";
}

namespace {

// Unset flags keep *out (which may be below `min`, e.g. 0 = unbounded).
absl::Status IntFlag(const Flags& f, const char* name, int min, int* out) {
  if (!f.Has(name)) return absl::OkStatus();
  auto v = f.GetInt(name, *out);
  if (!v.ok()) return v.status();
  if (*v < min)
    return absl::InvalidArgumentError(absl::StrCat("--", name, " ", *v, ": must be >= ", min));
  *out = *v;
  return absl::OkStatus();
}

absl::Status DoubleFlag(const Flags& f, const char* name, double* out) {
  if (!f.Has(name)) return absl::OkStatus();
  const std::string s = f.Get(name);
  if (s == "inf" || s == "infinity") {
    *out = std::numeric_limits<double>::infinity();
    return absl::OkStatus();
  }
  double v;
  if (!absl::SimpleAtod(s, &v) || std::isnan(v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " '", s, "': not a number"));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status ParseTarget(const Flags& f, LoadTestOptions* o) {
  o->grpc = f.Get("grpc");
  o->url = f.Get("url");
  if (o->grpc.empty() == o->url.empty())
    return absl::InvalidArgumentError(
        "give exactly one target: --grpc HOST:PORT or --url http://HOST:PORT/v1/completions");
  auto endpoint = o->grpc.empty() ? ParseHttpUrl(o->url) : ParseHostPort(o->grpc);
  if (!endpoint.ok()) return endpoint.status();
  o->endpoint = *endpoint;
  if (auto s = CheckHostAllowed(o->endpoint.host, o->allow_remote_host); !s.ok()) return s;
  if (!o->url.empty() && o->endpoint.target.find("/completions") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--url ", o->url, ": expected a /v1/completions or /v1/chat/completions endpoint"));
  }
  o->send.keep_alive = !f.Has("no-keep-alive");
  if (!o->send.keep_alive && o->url.empty())
    return absl::InvalidArgumentError("--no-keep-alive: only for an HTTP target (--url)");
  if (f.Has("metrics-url")) {
    o->metrics_url = f.Get("metrics-url");
    auto m = ParseHttpUrl(o->metrics_url);
    if (!m.ok()) return m.status();
    if (auto s = CheckHostAllowed(m->host, o->allow_remote_host); !s.ok()) return s;
    o->metrics = *m;
  }
  return absl::OkStatus();
}

// --workload chat: its own sizes; --num-requests follows from them.
absl::Status ParseChat(const Flags& f, LoadTestOptions* o) {
  ChatWorkloadOptions& c = o->chat;
  if (f.Has("num-requests")) {
    return absl::InvalidArgumentError(
        "--num-requests: not with --workload chat (use --conversations and --turns)");
  }
  if (f.Has("input-len")) {
    return absl::InvalidArgumentError(
        "--input-len: not with --workload chat (use --system-prompt-words and --user-words)");
  }
  if (auto s = IntFlag(f, "conversations", 1, &c.conversations); !s.ok()) return s;
  if (auto s = IntFlag(f, "turns", 1, &c.turns); !s.ok()) return s;
  if (auto s = IntFlag(f, "system-prompt-words", 0, &c.system_prompt_words); !s.ok()) return s;
  if (f.Has("user-words")) {
    auto d = LengthDistribution::Parse(f.Get("user-words"));
    if (!d.ok()) return d.status();
    c.user_words = *d;
  }
  if (o->workload.output_len_given) c.output_len = o->workload.output_len;
  c.seed = o->workload.seed;
  o->send.collect_text = true;  // the replies go back in the next turn
  return absl::OkStatus();
}

absl::Status ParseWorkload(const Flags& f, LoadTestOptions* o) {
  WorkloadOptions& w = o->workload;
  w.kind = f.Get("workload", "random");
  w.dataset = f.Get("dataset");
  if (w.kind != "random" && w.kind != "jsonl" && w.kind != "decode" && w.kind != "chat") {
    return absl::InvalidArgumentError(
        absl::StrCat("--workload ", w.kind, ": use random, jsonl, decode or chat"));
  }
  for (const char* name : {"conversations", "turns", "system-prompt-words", "user-words"}) {
    if (f.Has(name) && w.kind != "chat") {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": only with --workload chat"));
    }
  }
  if (w.kind == "jsonl" && w.dataset.empty())
    return absl::InvalidArgumentError("--workload jsonl needs --dataset FILE");
  if (f.Has("input-len")) {
    auto d = LengthDistribution::Parse(f.Get("input-len"));
    if (!d.ok()) return d.status();
    w.input_len = *d;
  }
  if (f.Has("output-len")) {
    auto d = LengthDistribution::Parse(f.Get("output-len"));
    if (!d.ok()) return d.status();
    w.output_len = *d;
    w.output_len_given = true;
  }
  if (auto s = IntFlag(f, "vocab-size", 0, &w.vocab_size); !s.ok()) return s;
  int seed = 0;
  if (auto s = IntFlag(f, "seed", 0, &seed); !s.ok()) return s;
  w.seed = seed;
  if (w.kind == "chat") {
    if (auto s = ParseChat(f, o); !s.ok()) return s;
  }
  o->run.seed = static_cast<uint64_t>(seed) * 7919 + 1;  // arrivals independent of lengths
  return absl::OkStatus();
}

absl::Status ParseTraffic(const Flags& f, LoadTestOptions* o) {
  if (auto s = IntFlag(f, "num-requests", 1, &o->num_requests); !s.ok()) return s;
  if (o->is_chat()) o->num_requests = o->chat.conversations * o->chat.turns;
  if (auto s = IntFlag(f, "warmup", 0, &o->run.warmup); !s.ok()) return s;
  if (auto s = IntFlag(f, "max-concurrency", 1, &o->run.max_concurrency); !s.ok()) return s;
  if (auto s = IntFlag(f, "timeout", 1, &o->send.timeout_s); !s.ok()) return s;
  if (auto s = DoubleFlag(f, "request-rate", &o->run.request_rate); !s.ok()) return s;
  if (!(o->run.request_rate > 0))
    return absl::InvalidArgumentError("--request-rate: must be > 0 (or inf)");
  if (auto s = DoubleFlag(f, "burstiness", &o->run.burstiness); !s.ok()) return s;
  if (!(o->run.burstiness > 0) || std::isinf(o->run.burstiness))
    return absl::InvalidArgumentError("--burstiness: must be a finite number > 0");
  if (auto s = DoubleFlag(f, "duration", &o->run.duration_s); !s.ok()) return s;
  if (f.Has("duration") && (!(o->run.duration_s > 0) || std::isinf(o->run.duration_s))) {
    return absl::InvalidArgumentError("--duration: must be a finite number of seconds > 0");
  }
  if (auto s = DoubleFlag(f, "temperature", &o->send.temperature); !s.ok()) return s;
  if (o->send.temperature < 0 || std::isinf(o->send.temperature))
    return absl::InvalidArgumentError("--temperature: must be >= 0");
  o->send.ignore_eos = !f.Has("respect-eos");
  if (auto s = IntFlag(f, "logprobs", 0, &o->send.logprobs); !s.ok()) return s;
  if (o->send.logprobs > 20) return absl::InvalidArgumentError("--logprobs: 0..20");
  return absl::OkStatus();
}

absl::Status ParseReport(const Flags& f, LoadTestOptions* o) {
  auto slo = ParseSlo(f.GetList("slo"));
  if (!slo.ok()) return slo.status();
  o->slo = *slo;
  if (auto s = IntFlag(f, "scrape-interval-ms", 10, &o->scrape_interval_ms); !s.ok()) return s;
  for (const std::string& item : f.GetList("cpu-pid")) {
    // NAME=PID or PID (named by its number).
    const size_t eq = item.find('=');
    const std::string name = eq == std::string::npos ? item : item.substr(0, eq);
    const std::string p = eq == std::string::npos ? item : item.substr(eq + 1);
    int pid;
    if (name.empty() || !absl::SimpleAtoi(p, &pid) || pid <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cpu-pid '", item, "': expected PID or NAME=PID"));
    }
    o->cpu_pids.push_back(pid);
    o->cpu_names.push_back(name);
  }
  o->out_json = f.Get("out");
  o->plots_dir = f.Get("plots");
  o->label = f.Get("label", "run");
  o->no_progress = f.Has("no-progress");
  o->model = f.Get("model");
  o->api_key = f.Get("api-key");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LoadTestOptions> ParseLoadTestOptions(const std::vector<std::string>& args) {
  auto f = Flags::Parse(args,
                        {"grpc",
                         "url",
                         "model",
                         "api-key",
                         "workload",
                         "dataset",
                         "input-len",
                         "output-len",
                         "vocab-size",
                         "seed",
                         "num-requests",
                         "warmup",
                         "request-rate",
                         "burstiness",
                         "max-concurrency",
                         "duration",
                         "timeout",
                         "temperature",
                         "slo",
                         "metrics-url",
                         "scrape-interval-ms",
                         "cpu-pid",
                         "out",
                         "plots",
                         "label",
                         "logprobs",
                         "conversations",
                         "turns",
                         "system-prompt-words",
                         "user-words"},
                        {"allow-remote-host", "respect-eos", "no-progress", "no-keep-alive"});
  if (!f.ok()) return f.status();
  LoadTestOptions o;
  o.allow_remote_host = f->Has("allow-remote-host");
  for (auto parse : {ParseTarget, ParseWorkload, ParseTraffic, ParseReport}) {
    if (absl::Status s = parse(*f, &o); !s.ok()) return s;
  }
  return o;
}

nlohmann::json ConfigJson(const LoadTestOptions& o) {
  const WorkloadOptions& w = o.workload;
  nlohmann::json j = {
      {"workload", w.kind},
      {"num_requests", o.num_requests},
      {"warmup", o.run.warmup},
      {"request_rate",
       std::isinf(o.run.request_rate) ? nlohmann::json("inf") : nlohmann::json(o.run.request_rate)},
      {"burstiness", o.run.burstiness},
      {"max_concurrency", o.run.max_concurrency},
      {"duration_s", o.run.duration_s},
      {"ignore_eos", o.send.ignore_eos},
      {"temperature", o.send.temperature},
      {"logprobs", o.send.logprobs},
      {"keep_alive", o.send.keep_alive},
      {"seed", w.seed}};
  if (w.kind == "random") j["input_len"] = w.input_len.Describe();
  if (w.kind != "decode" || w.output_len_given) j["output_len"] = w.output_len.Describe();
  if (w.kind == "decode" && !w.output_len_given) j["output_len"] = "normal:256:64";
  if (w.kind == "jsonl") j["dataset"] = w.dataset;
  if (o.is_chat()) {
    j["conversations"] = o.chat.conversations;
    j["turns"] = o.chat.turns;
    j["system_prompt_words"] = o.chat.system_prompt_words;
    j["user_words"] = o.chat.user_words.Describe();
    j["output_len"] = o.chat.output_len.Describe();
    j["request_rate_unit"] = "conversations/s";
  }
  return j;
}

}  // namespace morserve::loadtest
