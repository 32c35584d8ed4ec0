// Workload generation (see workload.h).
#include "loadtest/workload.h"

#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace morserve::loadtest {
namespace {

constexpr int kNoCap = 1 << 30;

int OutputCap(const WorkloadOptions& o, int prompt_len) {
  return o.context_length > 0 ? o.context_length - prompt_len : kNoCap;
}

absl::StatusOr<std::vector<RequestSpec>> Random(const WorkloadOptions& o, int count) {
  if (o.vocab_size < 2)
    return absl::InvalidArgumentError(
        "random workload: the vocabulary size is unknown (pass --vocab-size)");
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int> id(1, o.vocab_size - 1);
  std::vector<RequestSpec> out(count);
  const int input_cap = o.context_length > 1 ? o.context_length - 1 : kNoCap;
  for (RequestSpec& r : out) {
    const int n = o.input_len.Sample(rng, input_cap);
    for (int i = 0; i < n; ++i) r.prompt_ids.push_back(id(rng));
    r.max_tokens = o.output_len.Sample(rng, OutputCap(o, n));
  }
  return out;
}

absl::StatusOr<std::vector<RequestSpec>> Decode(const WorkloadOptions& o, int count) {
  std::mt19937_64 rng(o.seed);
  const LengthDistribution len =
      o.output_len_given ? o.output_len : LengthDistribution::Normal(256, 64);
  std::vector<RequestSpec> out(count);
  for (RequestSpec& r : out) {
    r.prompt_ids = {1};
    r.max_tokens = len.Sample(rng, OutputCap(o, 1));
  }
  return out;
}

absl::StatusOr<RequestSpec> JsonlLine(const WorkloadOptions& o, const std::string& line,
                                      std::mt19937_64& rng) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  if (!j.contains("prompt")) return absl::InvalidArgumentError("no \"prompt\"");
  RequestSpec r;
  const nlohmann::json& p = j["prompt"];
  if (p.is_string()) {
    r.prompt_text = p.get<std::string>();
    if (r.prompt_text.empty()) return absl::InvalidArgumentError("empty \"prompt\"");
  } else if (p.is_array() && !p.empty()) {
    for (const nlohmann::json& t : p) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0) {
        return absl::InvalidArgumentError("\"prompt\" array must hold token ids (integers >= 0)");
      }
      r.prompt_ids.push_back(t.get<int>());
    }
  } else {
    return absl::InvalidArgumentError(
        "\"prompt\" must be a string or a non-empty array of token ids");
  }
  if (j.contains("max_tokens")) {
    if (!j["max_tokens"].is_number_integer() || j["max_tokens"].get<int64_t>() < 1) {
      return absl::InvalidArgumentError("\"max_tokens\" must be an integer >= 1");
    }
    r.max_tokens = j["max_tokens"].get<int>();
  } else {
    r.max_tokens = o.output_len.Sample(rng, OutputCap(o, r.prompt_tokens()));
  }
  return r;
}

// Lines are read in order and reused cyclically when the run wants more requests.
absl::StatusOr<std::vector<RequestSpec>> Jsonl(const WorkloadOptions& o, int count) {
  std::ifstream in(o.dataset);
  if (!in) return absl::NotFoundError(absl::StrCat("--dataset ", o.dataset, ": cannot open"));
  std::mt19937_64 rng(o.seed);
  std::vector<RequestSpec> lines;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto r = JsonlLine(o, line, rng);
    if (!r.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(o.dataset, ":", n, ": ", r.status().message()));
    }
    lines.push_back(std::move(*r));
  }
  if (lines.empty()) return absl::InvalidArgumentError(absl::StrCat(o.dataset, ": no prompts"));
  std::vector<RequestSpec> out;
  for (int i = 0; i < count; ++i) out.push_back(lines[i % lines.size()]);
  return out;
}

}  // namespace

absl::StatusOr<std::vector<RequestSpec>> MakeWorkload(const WorkloadOptions& o, int count) {
  if (o.kind == "random") return Random(o, count);
  if (o.kind == "decode") return Decode(o, count);
  if (o.kind == "jsonl") return Jsonl(o, count);
  return absl::InvalidArgumentError(
      absl::StrCat("--workload ", o.kind, ": use random, jsonl or decode"));
}

}  // namespace morserve::loadtest
