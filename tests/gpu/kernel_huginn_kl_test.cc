// huginn_kl_forward (Huginn's adaptive exit statistic) against the contract's math evaluated in
// long double, and against the host's HuginnNormalize and HuginnKl (engine/model/huginn_state.h,
// fp64 in index order): random logits at vocab 65536 (the real model's) and 1001 (odd, not a
// multiple of the CTA), several rows with kept rows in any order; the first check against the
// uniform distribution, then two chained checks that read the rows the previous call kept
// (logits bitwise, log_z), a row equal to its previous (KL ~0); a kept-row index outside the
// pool gives NaN and writes nothing; the launcher's validation.
// Tolerances. The kernel sums in a fixed fp64 tree order (a CTA's threads 256 terms each, then
// a tree), so it stays within |kl - exact| <= 1e-12 * |exact| + 1e-14 of the long-double value
// (and the same for log_z). The host's index-order sum is the less exact one: against the
// uniform distribution every term (a - x_i) / vocab shares a's low bits, so each add's rounding
// leans the same way; it is held to the recursive-summation bound, vocab * DBL_EPSILON times
// the sum of the terms' magnitudes (Higham, Accuracy and Stability, section 4.2).
// Also built as kernel_huginn_kl_emu_test: the same checks on the emulated kernels and CUDA
// runtime.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine/model/huginn_state.h"
#include "kernels/huginn_kl.cuh"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FreshSeed;

class HuginnKlTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

void ExpectClose(double got, double want, const std::string& what) {
  EXPECT_LE(std::fabs(got - want), 1e-12 * std::fabs(want) + 1e-14)
      << what << ": got " << got << ", exact " << want;
}

// The contract's log_z and KL in long double, with the sum of the KL terms' magnitudes (for the
// host's bound).
struct Exact {
  double log_z = 0;
  double kl = 0;
  double kl_abs_terms = 0;
};

long double ExactLogZ(const std::vector<float>& x) {
  const long double m = *std::max_element(x.begin(), x.end());
  long double sum = 0;
  for (float v : x) sum += std::exp(static_cast<long double>(v) - m);
  return m + std::log(sum);
}

// prev empty: against the uniform distribution.
Exact ExactKl(const std::vector<float>& prev, const std::vector<float>& x) {
  const long double lz = ExactLogZ(x);
  const long double n = static_cast<long double>(x.size());
  const long double prev_lz = prev.empty() ? 0 : ExactLogZ(prev);
  long double kl = 0, abs_terms = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const long double lp = static_cast<long double>(x[i]) - lz;
    long double term;
    if (prev.empty()) {
      term = (-std::log(n) - lp) / n;
    } else {
      const long double lq = static_cast<long double>(prev[i]) - prev_lz;
      term = std::exp(lq) * (lq - lp);
    }
    kl += term;
    abs_terms += std::fabs(term);
  }
  return {static_cast<double>(lz), static_cast<double>(kl), static_cast<double>(abs_terms)};
}

// The kernel against the exact value, and the host's HuginnKl within its summation bound.
void ExpectKl(double got, const std::vector<float>& prev, const HuginnLogits& prev_host,
              const HuginnLogits& cur_host, const std::string& what) {
  const Exact exact = ExactKl(prev, cur_host.logits);
  ExpectClose(got, exact.kl, what + " kl");
  const double host = HuginnKl(prev_host, cur_host);
  const double bound = static_cast<double>(cur_host.logits.size()) * DBL_EPSILON *
                       (exact.kl_abs_terms + std::fabs(exact.log_z));
  EXPECT_LE(std::fabs(got - host), bound) << what << " kl: got " << got << ", host " << host;
}

// Rows of logits around a random scale: a peaked row makes the KL terms' magnitudes vary.
std::vector<float> RandomLogits(int rows, int vocab, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> v(static_cast<size_t>(rows) * vocab);
  for (float& x : v) x = dist(rng);
  for (int r = 0; r < rows; ++r) v[static_cast<size_t>(r) * vocab + (r * 37) % vocab] += 12.0f;
  return v;
}

std::vector<float> Row(const std::vector<float>& v, int r, int vocab) {
  return {v.begin() + static_cast<size_t>(r) * vocab,
          v.begin() + static_cast<size_t>(r + 1) * vocab};
}

// The pool of kept rows and one call over it.
struct KeptRows {
  KeptRows(int64_t capacity, int vocab)
      : capacity(capacity), vocab(vocab), logits(capacity * vocab), log_z(capacity) {
    EXPECT_EQ(logits.Poison(), cudaSuccess);
    EXPECT_EQ(log_z.Poison(), cudaSuccess);
  }
  std::vector<double> Check(const std::vector<float>& x, const std::vector<int32_t>& rows,
                            const std::vector<int32_t>& has_prev) {
    const int n = static_cast<int>(rows.size());
    DeviceBuffer<float> dx(x.size());
    DeviceBuffer<int32_t> drows(rows.size()), dhas(has_prev.size());
    DeviceBuffer<double> dkl(rows.size());
    EXPECT_EQ(dx.Upload(x), cudaSuccess);
    EXPECT_EQ(drows.Upload(rows), cudaSuccess);
    EXPECT_EQ(dhas.Upload(has_prev), cudaSuccess);
    EXPECT_EQ(dkl.Poison(), cudaSuccess);
    HuginnKlParams p;
    p.logits = dx.get();
    p.prev_logits = logits.get();
    p.prev_log_z = log_z.get();
    p.capacity = capacity;
    p.prev_rows = drows.get();
    p.has_prev = dhas.get();
    p.kl = dkl.get();
    p.n = n;
    p.vocab = vocab;
    EXPECT_EQ(huginn_kl_forward(p, nullptr), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<double> kl;
    EXPECT_EQ(dkl.Download(&kl), cudaSuccess);
    return kl;
  }
  int64_t capacity;
  int vocab;
  DeviceBuffer<float> logits;
  DeviceBuffer<double> log_z;
};

// Three checks of n rows kept at scattered pool rows: uniform first, then two against the
// kept rows; the last check's row 0 repeats its previous logits.
void CheckChain(int vocab, int n) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("vocab=" + std::to_string(vocab) + " n=" + std::to_string(n) +
               " seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t capacity = 2 * n + 1;
  KeptRows kept(capacity, vocab);
  std::vector<int32_t> rows(n);  // distinct, in reverse order, gaps between
  for (int i = 0; i < n; ++i) rows[i] = 2 * (n - i);
  std::vector<HuginnLogits> prev(n);  // empty: uniform
  for (int step = 0; step < 3; ++step) {
    std::vector<float> x = RandomLogits(n, vocab, rng);
    if (step == 2) std::copy(prev[0].logits.begin(), prev[0].logits.end(), x.begin());
    const std::vector<int32_t> has_prev(n, step == 0 ? 0 : 1);
    const std::vector<double> kl = kept.Check(x, rows, has_prev);
    ASSERT_EQ(kl.size(), static_cast<size_t>(n));
    std::vector<float> pool;
    std::vector<double> log_z;
    ASSERT_EQ(kept.logits.Download(&pool), cudaSuccess);
    ASSERT_EQ(kept.log_z.Download(&log_z), cudaSuccess);
    for (int i = 0; i < n; ++i) {
      const std::string what = "step " + std::to_string(step) + " row " + std::to_string(i);
      HuginnLogits cur = HuginnNormalize(Row(x, i, vocab));
      ExpectKl(kl[i], prev[i].logits, prev[i], cur, what);
      ExpectClose(log_z[rows[i]], static_cast<double>(ExactLogZ(cur.logits)), what + " log_z");
      ExpectClose(log_z[rows[i]], cur.log_z, what + " log_z against the host");
      EXPECT_EQ(Row(pool, rows[i], vocab), cur.logits) << what << ": the kept row";
      if (step == 0) EXPECT_GT(kl[i], 0.1) << what;  // far from uniform
      if (step == 2 && i == 0) EXPECT_LT(std::fabs(kl[i]), 1e-12) << what;
      prev[i] = std::move(cur);
    }
  }
}

TEST_F(HuginnKlTest, MatchesTheHostAtTheRealVocab) { CheckChain(65536, 3); }

TEST_F(HuginnKlTest, MatchesTheHostAtAnOddVocab) { CheckChain(1001, 5); }

TEST_F(HuginnKlTest, OutOfRangeKeptRowGivesNanAndWritesNothing) {
  std::mt19937_64 rng(FreshSeed());
  const int vocab = 300;
  KeptRows kept(2, vocab);
  const std::vector<float> x = RandomLogits(3, vocab, rng);
  const std::vector<double> kl = kept.Check(x, {1, -1, 2}, {0, 0, 0});
  ASSERT_EQ(kl.size(), 3u);
  ExpectKl(kl[0], {}, HuginnLogits{}, HuginnNormalize(Row(x, 0, vocab)), "row 0");
  EXPECT_TRUE(std::isnan(kl[1]));
  EXPECT_TRUE(std::isnan(kl[2]));
  std::vector<float> pool;
  ASSERT_EQ(kept.logits.Download(&pool), cudaSuccess);
  EXPECT_TRUE(std::isnan(pool[0]));  // pool row 0 still poisoned
  EXPECT_EQ(Row(pool, 1, vocab), Row(x, 0, vocab));
}

TEST_F(HuginnKlTest, ZeroRowsAndValidation) {
  HuginnKlParams p;
  p.vocab = 8;
  EXPECT_EQ(huginn_kl_forward(p, nullptr), cudaSuccess);  // n = 0: nothing, no pointer needed
  p.n = -1;
  EXPECT_EQ(huginn_kl_forward(p, nullptr), cudaErrorInvalidValue);
  p.n = 1;
  EXPECT_EQ(huginn_kl_forward(p, nullptr), cudaErrorInvalidValue);  // null pointers
  DeviceBuffer<float> x(8), pool(8);
  DeviceBuffer<double> log_z(1), kl(1);
  DeviceBuffer<int32_t> rows(1);
  p.logits = x.get();
  p.prev_logits = pool.get();
  p.prev_log_z = log_z.get();
  p.prev_rows = p.has_prev = rows.get();
  p.kl = kl.get();
  p.capacity = 0;
  EXPECT_EQ(huginn_kl_forward(p, nullptr), cudaErrorInvalidValue);
  p.capacity = 1;
  p.vocab = 0;
  EXPECT_EQ(huginn_kl_forward(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace morserve::kernels
