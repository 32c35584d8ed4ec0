// Implementation notes: each filter narrows `cand_` (candidate ids) in place; probabilities
// live in the dense `prob_` array indexed by id so that reordering `cand_` never has to
// carry a parallel array. Only the filters that need a ranking pay for one: top_k and the
// top-n logprobs scan once against a small heap (SelectBest), top_p probes the best 256 and
// otherwise binary-searches its cut with nth_element partitions (expected O(V)).
#include "engine/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <random>

#include "engine/core/check.h"
#include "engine/core/mix64.h"
#include "engine/cpu/logit_reductions.h"

namespace morserve {
namespace {

constexpr size_t kTopPProbe = 256;

// Moves the k best ids of *ids under `better` (a strict total order) to the front and drops the
// rest; the order among the k is unspecified. Small k scans once against a heap of the k best
// so far (one comparison per id in the common case); large k uses nth_element.
template <class Better>
void SelectBest(std::vector<int>* ids, size_t k, Better better) {
  if (k >= ids->size()) return;
  if (k == 0) {
    ids->clear();
    return;
  }
  if (k * 16 > ids->size()) {
    std::nth_element(ids->begin(), ids->begin() + (k - 1), ids->end(), better);
    ids->resize(k);
    return;
  }
  // A max-heap under `better` keeps the worst of the current k at the front.
  std::make_heap(ids->begin(), ids->begin() + k, better);
  for (size_t i = k; i < ids->size(); ++i) {
    if (better((*ids)[i], ids->front())) {
      std::pop_heap(ids->begin(), ids->begin() + k, better);
      std::swap((*ids)[k - 1], (*ids)[i]);
      std::push_heap(ids->begin(), ids->begin() + k, better);
    }
  }
  ids->resize(k);
}

}  // namespace

double LogSumExpGivenMax(absl::Span<const float> x, float m) {
  MORSERVE_CHECK(m > -std::numeric_limits<float>::infinity(), "every logit is -inf");
  const LogitReductionSet& k = BestLogitReductions();
  return static_cast<double>(m) + std::log(k.sum_exp(x.data(), static_cast<int64_t>(x.size()), m));
}

double LogSumExp(absl::Span<const float> x) {
  MORSERVE_CHECK(!x.empty(), "log-sum-exp of an empty row");
  return LogSumExpGivenMax(x, BestLogitReductions().max(x.data(), static_cast<int64_t>(x.size())));
}

void TopLogprobs(absl::Span<const float> logits, double log_z, int n, std::vector<int>* scratch,
                 std::vector<TokenLogprob>* out) {
  const int vocab = static_cast<int>(logits.size());
  n = std::min(n, vocab);
  std::vector<int>& order = *scratch;
  order.resize(vocab);
  std::iota(order.begin(), order.end(), 0);
  auto better = [&logits](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  SelectBest(&order, n, better);
  std::sort(order.begin(), order.end(), better);
  out->clear();
  for (int i = 0; i < n; ++i) {
    const int id = order[i];
    out->push_back({id, static_cast<float>(static_cast<double>(logits[id]) - log_z)});
  }
}

uint64_t DrawRandomSeed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

uint64_t ResolveSeed(const SamplingParams& params) {
  return params.seed.has_value() ? *params.seed : DrawRandomSeed();
}

double UniformForStep(uint64_t seed, uint64_t step) {
  const uint64_t bits = Mix64(Mix64(seed) ^ Mix64(step ^ 0x5bd1e9955bd1e995ULL));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

SampleResult Sampler::Sample(const SampleInput& in) {
  MORSERVE_CHECK(in.params != nullptr, "SampleInput.params is null");
  MORSERVE_CHECK(!in.logits.empty(), "empty logits row");
  const SamplingParams& p = *in.params;
  SampleResult result;
  const LogitReductionSet& k = BestLogitReductions();
  const float* x = in.logits.data();
  const int64_t n = static_cast<int64_t>(in.logits.size());
  const float m = k.max(x, n);  // of the raw logits: the logprob's normaliser needs it too
  if (p.greedy() && !ChangesLogits(in)) {
    result.token = static_cast<int>(ArgmaxGivenMax(k, x, n, m));  // argmax of an unchanged copy: no copy
  } else {
    ProcessLogits(in);
    result.token = p.greedy() ? Argmax() : SampleFiltered(p, UniformForStep(in.seed, in.output_ids.size()));
  }
  const double log_z = LogSumExpGivenMax(in.logits, m);
  result.logprob = static_cast<float>(static_cast<double>(in.logits[result.token]) - log_z);
  if (p.logprobs > 0) TopLogprobs(in.logits, log_z, p.logprobs, &order_, &result.top_logprobs);
  return result;
}

bool Sampler::ChangesLogits(const SampleInput& in) {
  const SamplingParams& p = *in.params;
  const bool bans_stops = static_cast<int64_t>(in.output_ids.size()) < p.min_tokens &&
                          (!in.eos_ids.empty() || !p.stop_token_ids.empty());
  return p.allowed_token_ids.has_value() || !p.logit_bias.empty() || bans_stops ||
         p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
}

absl::Span<const float> Sampler::ProcessLogits(const SampleInput& in) {
  work_.assign(in.logits.begin(), in.logits.end());
  Constrain(in);
  Penalize(in);
  return work_;
}

void Sampler::Constrain(const SampleInput& in) {
  const SamplingParams& p = *in.params;
  const int vocab = static_cast<int>(work_.size());
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  auto check = [vocab](int id, const char* what) { MORSERVE_CHECK(id >= 0 && id < vocab, what); };
  if (p.allowed_token_ids) {
    kept_.clear();
    for (int id : *p.allowed_token_ids) {
      check(id, "allowed token id outside the vocabulary");
      kept_.push_back(work_[id]);
    }
    std::fill(work_.begin(), work_.end(), kNegInf);
    for (size_t i = 0; i < kept_.size(); ++i) work_[(*p.allowed_token_ids)[i]] = kept_[i];
  }
  for (const auto& [id, bias] : p.logit_bias) {
    check(id, "logit_bias token id outside the vocabulary");
    work_[id] += bias;
  }
  if (static_cast<int64_t>(in.output_ids.size()) < p.min_tokens) {
    // A config's eos id outside the vocabulary can never be sampled: nothing to ban.
    for (int id : in.eos_ids) {
      if (id >= 0 && id < vocab) work_[id] = kNegInf;
    }
    for (int id : p.stop_token_ids) {
      check(id, "stop token id outside the vocabulary");
      work_[id] = kNegInf;
    }
  }
}

void Sampler::Penalize(const SampleInput& in) {
  const SamplingParams& p = *in.params;
  const int vocab = static_cast<int>(work_.size());
  const bool repetition = p.repetition_penalty != 1.0f;
  const bool output_only = p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
  if (!repetition && !output_only) return;
  if (static_cast<int>(seen_.size()) < vocab) {
    seen_.resize(vocab, 0);
    counts_.resize(vocab, 0);
  }
  auto mark = [&](int id) {
    MORSERVE_CHECK(id >= 0 && id < vocab, "history token id outside the vocabulary");
    if (!seen_[id]) touched_.push_back(id);
    seen_[id] = 1;
  };
  for (int id : in.output_ids) {
    mark(id);
    ++counts_[id];
  }
  if (repetition) {
    for (int id : in.prompt_ids) mark(id);
  }
  for (int id : touched_) {
    float x = work_[id];
    if (repetition) x = x > 0.0f ? x / p.repetition_penalty : x * p.repetition_penalty;
    x -= p.frequency_penalty * static_cast<float>(counts_[id]);
    if (counts_[id] > 0) x -= p.presence_penalty;
    work_[id] = x;
    seen_[id] = 0;
    counts_[id] = 0;
  }
  touched_.clear();
}

int Sampler::Argmax() const {
  return static_cast<int>(morserve::Argmax(BestLogitReductions(), work_.data(), static_cast<int64_t>(work_.size())));
}

int Sampler::SampleFiltered(const SamplingParams& p, double u) {
  const int vocab = static_cast<int>(work_.size());
  if (p.temperature != 1.0f) {
    for (float& x : work_) x /= p.temperature;
  }
  cand_.resize(vocab);
  std::iota(cand_.begin(), cand_.end(), 0);
  bool reordered = false;
  if (p.top_k > 0 && p.top_k < vocab) {
    TopK(p.top_k);
    reordered = true;
  }
  Softmax();
  if (p.top_p < 1.0f) {
    TopP(p.top_p);
    reordered = true;
  }
  if (p.min_p > 0.0f) MinP(p.min_p);
  if (reordered) std::sort(cand_.begin(), cand_.end());

  double total = 0.0;
  for (int id : cand_) total += prob_[id];
  const double target = u * total;
  double acc = 0.0;
  int last_positive = cand_.front();
  for (int id : cand_) {
    if (prob_[id] <= 0.0) continue;
    acc += prob_[id];
    last_positive = id;
    if (acc > target) return id;
  }
  return last_positive;  // only reached through rounding at u close to 1
}

void Sampler::TopK(int k) {
  const std::vector<float>& w = work_;
  SelectBest(&cand_, k, [&w](int a, int b) { return w[a] > w[b] || (w[a] == w[b] && a < b); });
}

void Sampler::Softmax() {
  if (prob_.size() < work_.size()) prob_.resize(work_.size());
  float m = -std::numeric_limits<float>::infinity();
  for (int id : cand_) m = std::max(m, work_[id]);
  MORSERVE_CHECK(m > -std::numeric_limits<float>::infinity(),
                         "every candidate logit is -inf");
  // Unnormalised: the filters below only compare ratios and the sampler renormalises.
  for (int id : cand_) prob_[id] = std::exp(work_[id] - m);
}

void Sampler::TopP(double top_p) {
  // Keeps the K best-ranked candidates, K the smallest count whose mass reaches top_p * total.
  const std::vector<double>& q = prob_;
  auto by_rank = [&q](int a, int b) { return q[a] > q[b] || (q[a] == q[b] && a < b); };
  double total = 0.0;
  for (int id : cand_) total += q[id];
  const double target = top_p * total;
  // Fast path for the peaked distributions language models produce: when the best
  // kTopPProbe tokens already hold the target mass, the nucleus lies among them.
  if (cand_.size() > 4 * kTopPProbe) {
    order_.assign(cand_.begin(), cand_.end());
    SelectBest(&order_, kTopPProbe, by_rank);
    double probe_mass = 0.0;
    for (int id : order_) probe_mass += q[id];
    if (probe_mass >= target) cand_.swap(order_);
  }
  // Binary search on K with nth_element: [0, lo) always holds the lo best (in some order) with
  // mass below the target, so each round partitions only [lo, hi): expected O(n) in all.
  size_t lo = 0;
  size_t hi = cand_.size();
  double mass_lo = 0.0;  // mass of the lo best
  while (hi - lo > 1) {
    const size_t mid = lo + (hi - lo) / 2;
    std::nth_element(cand_.begin() + lo, cand_.begin() + mid, cand_.begin() + hi, by_rank);
    double mass_mid = mass_lo;
    for (size_t i = lo; i < mid; ++i) mass_mid += q[cand_[i]];
    if (mass_mid >= target) {
      hi = mid;
    } else {
      lo = mid;
      mass_lo = mass_mid;
    }
  }
  cand_.resize(hi);  // K == hi, and [0, hi) holds the K best
}

void Sampler::MinP(double min_p) {
  double max_prob = 0.0;
  for (int id : cand_) max_prob = std::max(max_prob, prob_[id]);
  const double threshold = min_p * max_prob;
  std::erase_if(cand_, [&](int id) { return prob_[id] < threshold; });
}

}  // namespace morserve
