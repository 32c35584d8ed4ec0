// Kernel micro-benchmark for a GPU session (not a test: speed is never asserted). Measures
// the device-to-device copy bandwidth (bytes read + written), says what cuBLASLt's heuristic
// offers per m and pins for each projection of a SmolLM-360M-shaped layer, then times those
// projections on the fixed-order GEMM and on pinned cuBLASLt (a shape cuBLASLt cannot pin has
// only the fixed row), paged attention (decode at several batch sizes and contexts, and a
// prefill chunk; SmolLM-360M heads, plus a decode and a prefill at Huginn-0125's 55 heads of
// 96; each with the CTA fold and with per-warp keys, and batch 1 also with chunks of 64 and
// 128 keys), and per-loop LoRA on its linears (the segmented shrink/expand kernels against the
// per-loop-group cuBLASLt loop they replaced), each as the median over repeats of event-timed
// runs that rotate over 8 input sets so the L2 cache does not serve them: "us" replays the
// runs captured in a CUDA graph (as the engine's decode step runs), "eager us" launches each
// call from the host (for small kernels, the host's launch rate). Prints each row as
// it finishes (and the LoRA speedups at the end) and rewrites the JSON after each row.
//   usage: kernel_bench [OUT.json] [lora]     ("lora": the copy bandwidth and LoRA only)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/fixed_gemm.cuh"
#include "kernels/gemm.cuh"
#include "kernels/lora_expand.cuh"
#include "kernels/lora_shrink.cuh"
#include "kernels/paged_attention.cuh"
#include "kernels/scale_add.cuh"

namespace morserve::kernels {
namespace {

#define BENCH_CHECK(expr)                                                                         \
  do {                                                                                            \
    const cudaError_t e_ = (expr);                                                                \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

constexpr int kRotate = 8;
constexpr int kIters = 20;
constexpr int kRepeats = 5;

template <typename T>
T* DeviceAlloc(size_t count) {
  void* p = nullptr;
  BENCH_CHECK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)));
  return static_cast<T*>(p);
}

// Fills n bf16 values with random numbers: one random slab from the host, then repeated on
// the device (fast even for gigabytes; the data is random, never zeros).
void FillRandomBf16(uint16_t* dst, size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> slab(std::min<size_t>(n, size_t{1} << 20));
  for (uint16_t& v : slab) v = F32ToBf16(dist(rng));
  BENCH_CHECK(cudaMemcpy(dst, slab.data(), slab.size() * 2, cudaMemcpyHostToDevice));
  for (size_t done = slab.size(); done < n;) {
    const size_t count = std::min(done, n - done);
    BENCH_CHECK(cudaMemcpy(dst + done, dst, count * 2, cudaMemcpyDeviceToDevice));
    done += count;
  }
}

// The stream every timed call runs on (created in Main: a graph capture needs one).
cudaStream_t g_stream = nullptr;

// Milliseconds per call of fn(iteration), each the median over kRepeats runs of kIters calls:
// `ms` with the kIters calls captured once in a CUDA graph and the graph replayed (the GPU's
// time with the gaps of the engine's graphed decode step: no host launch cost), `eager_ms`
// with every call launched from the host (a small kernel's figure is then the host's launch
// rate, not the GPU's time).
struct Timing {
  double ms;
  double eager_ms;
};

template <typename Run>
double MedianMs(Run run, cudaEvent_t start, cudaEvent_t stop) {
  std::vector<double> runs;
  for (int r = 0; r < kRepeats; ++r) {
    BENCH_CHECK(cudaEventRecord(start, g_stream));
    run();
    BENCH_CHECK(cudaEventRecord(stop, g_stream));
    BENCH_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CHECK(cudaEventElapsedTime(&ms, start, stop));
    runs.push_back(ms / kIters);
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

template <typename Fn>
Timing TimeMs(Fn fn) {
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) fn(i);  // warm-up (and any lazy set-up, before the capture)
  BENCH_CHECK(cudaStreamSynchronize(g_stream));
  Timing t;
  t.eager_ms = MedianMs(
      [&] {
        for (int i = 0; i < kIters; ++i) fn(i);
      },
      start, stop);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  BENCH_CHECK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kIters; ++i) fn(i);
  BENCH_CHECK(cudaStreamEndCapture(g_stream, &graph));
  BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  BENCH_CHECK(cudaGraphLaunch(exec, g_stream));  // warm-up (uploads the graph)
  BENCH_CHECK(cudaStreamSynchronize(g_stream));
  t.ms = MedianMs([&] { BENCH_CHECK(cudaGraphLaunch(exec, g_stream)); }, start, stop);
  BENCH_CHECK(cudaGetLastError());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return t;
}

struct Result {
  std::string name;
  double ms;  // graph-replayed (Timing)
  double bytes;
  double flops;
  double eager_ms = std::nan("");
};

double CopyBandwidth() {
  const size_t bytes = size_t{1} << 30;
  auto* a = DeviceAlloc<uint8_t>(bytes);
  auto* b = DeviceAlloc<uint8_t>(bytes);
  BENCH_CHECK(cudaMemset(a, 1, bytes));
  const double ms = TimeMs([&](int) {
                      BENCH_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, g_stream));
                    }).eager_ms;
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / (ms * 1e-3);
}

// Attention head shapes: SmolLM-360M's (the default) and Huginn-0125's.
struct AttentionHeads {
  int n_heads, n_kv, hd;
  const char* label;  // appended to the result's name ("" for the default)
};
constexpr AttentionHeads kSmolHeads = {15, 5, 64, ""};
constexpr AttentionHeads kHuginnHeads = {55, 55, 96, " heads=55/55x96"};

// How an attention row walks its chunks: the fold and the chunk length (the engine's: the CTA
// fold, 256).
struct AttentionWalk {
  AttentionFold fold = AttentionFold::kCta;
  int chunk = 256;
};

// The result name's suffix for a walk other than the engine's default.
std::string WalkLabel(const AttentionWalk& w) {
  std::string label = w.fold == AttentionFold::kWarp ? " fold=warp" : "";
  if (w.chunk != 256) label += " chunk=" + std::to_string(w.chunk);
  return label;
}

// Paged attention over `rows` rows: decode (one row per request, context `ctx`) or a prefill
// chunk (`rows` rows of one request ending at context ctx).
Result Attention(int rows, int ctx, bool prefill, std::mt19937_64& rng,
                 const AttentionHeads& heads = kSmolHeads, const AttentionWalk& walk = {}) {
  const int n_heads = heads.n_heads, n_kv = heads.n_kv, hd = heads.hd, bs = 16, chunk = walk.chunk;
  const int requests = prefill ? 1 : rows;
  const int blocks_per_req = (ctx + bs - 1) / bs;
  const int num_blocks = requests * blocks_per_req * kRotate;
  const size_t kv_elems = static_cast<size_t>(num_blocks) * bs * n_kv * hd;
  uint16_t* k = DeviceAlloc<uint16_t>(kv_elems);
  uint16_t* v = DeviceAlloc<uint16_t>(kv_elems);
  FillRandomBf16(k, kv_elems, rng);
  FillRandomBf16(v, kv_elems, rng);
  uint16_t* q = DeviceAlloc<uint16_t>(static_cast<size_t>(rows) * n_heads * hd);
  FillRandomBf16(q, static_cast<size_t>(rows) * n_heads * hd, rng);
  uint16_t* out = DeviceAlloc<uint16_t>(static_cast<size_t>(rows) * n_heads * hd);
  const size_t ws_floats = PagedAttentionWorkspaceFloats(rows, n_heads, hd, ctx, false, chunk);
  float* ws = DeviceAlloc<float>(ws_floats);

  // kRotate table sets over disjoint shuffled blocks.
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t*> d_indptr(kRotate), d_blocks(kRotate);
  std::vector<int32_t> kv_len(rows), indptr(rows + 1);
  for (int r = 0; r < rows; ++r) kv_len[r] = prefill ? ctx - rows + r + 1 : ctx;
  int32_t* d_len = DeviceAlloc<int32_t>(rows);
  BENCH_CHECK(cudaMemcpy(d_len, kv_len.data(), rows * 4, cudaMemcpyHostToDevice));
  double kv_bytes = 0;
  for (int r = 0; r < rows; ++r) kv_bytes += 2.0 * kv_len[r] * n_kv * hd * 2;
  for (int s = 0; s < kRotate; ++s) {
    std::vector<int32_t> blocks;
    for (int r = 0; r < rows; ++r) {
      indptr[r] = static_cast<int32_t>(blocks.size());
      const int req = prefill ? 0 : r;
      const int base = (s * requests + req) * blocks_per_req;
      blocks.insert(blocks.end(), ids.begin() + base, ids.begin() + base + blocks_per_req);
    }
    indptr[rows] = static_cast<int32_t>(blocks.size());
    d_indptr[s] = DeviceAlloc<int32_t>(rows + 1);
    d_blocks[s] = DeviceAlloc<int32_t>(blocks.size());
    BENCH_CHECK(cudaMemcpy(d_indptr[s], indptr.data(), (rows + 1) * 4, cudaMemcpyHostToDevice));
    BENCH_CHECK(cudaMemcpy(d_blocks[s], blocks.data(), blocks.size() * 4, cudaMemcpyHostToDevice));
  }
  PagedAttentionParams p;
  p.q = q;
  p.k_cache = k;
  p.v_cache = v;
  p.kv_len = d_len;
  p.out = out;
  p.out_dtype = DType::kBF16;
  p.workspace = ws;
  p.rows = rows;
  p.n_heads = n_heads;
  p.n_kv_heads = n_kv;
  p.head_dim = hd;
  p.block_size = bs;
  p.num_blocks = num_blocks;
  p.max_kv_len = ctx;
  p.chunk_len = chunk;
  p.fold = walk.fold;
  p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const Timing ms = TimeMs([&](int i) {
    PagedAttentionParams a = p;
    a.table_indptr = d_indptr[i % kRotate];
    a.table_blocks = d_blocks[i % kRotate];
    BENCH_CHECK(paged_attention_forward(a, g_stream));
  });
  for (int s = 0; s < kRotate; ++s) {
    cudaFree(d_indptr[s]);
    cudaFree(d_blocks[s]);
  }
  cudaFree(k);
  cudaFree(v);
  cudaFree(q);
  cudaFree(out);
  cudaFree(ws);
  cudaFree(d_len);
  const std::string name =
      std::string(prefill ? "attention prefill rows=" : "attention decode rows=") +
      std::to_string(rows) + " ctx=" + std::to_string(ctx) + heads.label + WalkLabel(walk);
  const double flops = 4.0 * (kv_bytes / (2.0 * n_kv * hd * 2)) * n_heads * hd;
  return {name, ms.ms, kv_bytes, flops, ms.eager_ms};
}

// A GEMM benchmark's inputs: kRotate weight copies (past L2 together) and one x, random bf16.
struct GemmInputs {
  std::vector<uint16_t*> w;
  uint16_t* x = nullptr;
  GemmInputs(int m, int n, int k, std::mt19937_64& rng) : w(kRotate) {
    for (auto& p : w) {
      p = DeviceAlloc<uint16_t>(static_cast<size_t>(n) * k);
      FillRandomBf16(p, static_cast<size_t>(n) * k, rng);
    }
    x = DeviceAlloc<uint16_t>(static_cast<size_t>(m) * k);
    FillRandomBf16(x, static_cast<size_t>(m) * k, rng);
  }
  ~GemmInputs() {
    for (auto* p : w) cudaFree(p);
    cudaFree(x);
  }
  GemmInputs(const GemmInputs&) = delete;
  GemmInputs& operator=(const GemmInputs&) = delete;
};

// The pinned cuBLASLt GEMM, fp32 out as the runner uses it; nullopt (said on stderr) when
// cuBLASLt has no algorithm to pin for the shape.
std::optional<Result> Gemm(LtGemm& gemm, const char* what, int m, int n, int k,
                           std::mt19937_64& rng) {
  const cublasStatus_t prepared = gemm.Prepare(m, n, k, DType::kF32);
  if (prepared != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "gemm %s m=%d: no cuBLASLt algorithm pinned: %s\n", what, m,
                 GemmStatusString(prepared));
    return std::nullopt;
  }
  const GemmInputs in(m, n, k, rng);
  float* y = DeviceAlloc<float>(static_cast<size_t>(m) * n);
  const Timing ms = TimeMs([&](int i) {
    GemmParams p;
    p.x = in.x;
    p.w = in.w[i % kRotate];
    p.y = y;
    p.y_dtype = DType::kF32;
    p.m = m;
    p.n = n;
    p.k = k;
    const cublasStatus_t st = gemm.Run(p, g_stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "gemm: %s\n", GemmStatusString(st));
      std::exit(1);
    }
  });
  cudaFree(y);
  const double bytes =
      2.0 * (static_cast<double>(n) * k + static_cast<double>(m) * k) + 4.0 * m * n;
  return Result{std::string("gemm ") + what + " m=" + std::to_string(m) +
                    " n=" + std::to_string(n) + " k=" + std::to_string(k),
                ms.ms, bytes, 2.0 * m * n * k, ms.eager_ms};
}

// The fixed-order GEMM (--cuda-gemm fixed) on the same shapes, fp32 out as the runner uses it,
// with the workspace its split schedule wants.
Result FixedGemm(const char* what, int m, int n, int k, std::mt19937_64& rng) {
  const GemmInputs in(m, n, k, rng);
  float* y = DeviceAlloc<float>(static_cast<size_t>(m) * n);
  const size_t ws_bytes = FixedGemmWorkspaceBytes(m, n, k);
  float* ws = ws_bytes > 0 ? DeviceAlloc<float>(ws_bytes / sizeof(float)) : nullptr;
  const Timing ms = TimeMs([&](int i) {
    FixedGemmParams p;
    p.x = in.x;
    p.w = in.w[i % kRotate];
    p.y = y;
    p.m = m;
    p.n = n;
    p.k = k;
    p.workspace = ws;
    p.workspace_bytes = ws_bytes;
    BENCH_CHECK(fixed_gemm_forward(p, g_stream));
  });
  cudaFree(y);
  cudaFree(ws);
  const double bytes =
      2.0 * (static_cast<double>(n) * k + static_cast<double>(m) * k) + 4.0 * m * n;
  return {std::string("fixed-gemm ") + what + (ws_bytes > 0 ? " split" : "") +
              " m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k),
          ms.ms, bytes, 2.0 * m * n * k, ms.eager_ms};
}

struct LoraShape {
  const char* what;
  int in, out;
};

// Per-loop LoRA y += (x A_loop^T) B_loop^T on `rows` rows split evenly over `loops` loops (in
// loop order, as the executor sorts them), at every batch size of `batches`: the segmented
// kernels (2 launches, segment metadata in device memory) and the per-group cuBLASLt loop
// (per loop group: shrink GEMM to bf16 t, expand GEMM to fp32, gated add: 3 launches).
// Returns {segmented, gemm loop} pairs.
std::vector<Result> Lora(LtGemm& gemm, const LoraShape& sh, int rank, int loops,
                         const std::vector<int>& batches, std::mt19937_64& rng) {
  const size_t a_elems = static_cast<size_t>(loops) * rank * sh.in;
  const size_t b_elems = static_cast<size_t>(loops) * sh.out * rank;
  std::vector<uint16_t*> a(kRotate), b(kRotate);
  for (int s = 0; s < kRotate; ++s) {
    a[s] = DeviceAlloc<uint16_t>(a_elems);
    b[s] = DeviceAlloc<uint16_t>(b_elems);
    FillRandomBf16(a[s], a_elems, rng);
    FillRandomBf16(b[s], b_elems, rng);
  }
  const int max_rows = *std::max_element(batches.begin(), batches.end());
  uint16_t* x = DeviceAlloc<uint16_t>(static_cast<size_t>(max_rows) * sh.in);
  FillRandomBf16(x, static_cast<size_t>(max_rows) * sh.in, rng);
  float* y = DeviceAlloc<float>(static_cast<size_t>(max_rows) * sh.out);
  float* d = DeviceAlloc<float>(static_cast<size_t>(max_rows) * sh.out);
  float* t32 = DeviceAlloc<float>(static_cast<size_t>(max_rows) * rank);
  uint16_t* t16 = DeviceAlloc<uint16_t>(static_cast<size_t>(max_rows) * rank);
  int32_t* seg = DeviceAlloc<int32_t>(2 * static_cast<size_t>(loops) + 1);
  BENCH_CHECK(cudaMemset(y, 0, static_cast<size_t>(max_rows) * sh.out * sizeof(float)));
  std::vector<Result> out;
  for (int rows : batches) {
    std::vector<int32_t> indptr = {0}, seg_loop;  // empty loops (rows < loops) are skipped
    for (int l = 0; l < loops; ++l) {
      const int count = rows / loops + (l < rows % loops ? 1 : 0);
      if (count == 0) continue;
      indptr.push_back(indptr.back() + count);
      seg_loop.push_back(l);
    }
    const int segments = static_cast<int>(seg_loop.size());
    BENCH_CHECK(cudaMemcpy(seg, indptr.data(), indptr.size() * 4, cudaMemcpyHostToDevice));
    BENCH_CHECK(cudaMemcpy(seg + indptr.size(), seg_loop.data(), seg_loop.size() * 4,
                           cudaMemcpyHostToDevice));
    const Timing ms_segmented = TimeMs([&](int i) {
      LoraShrinkParams sp;
      sp.x = x;
      sp.a = a[i % kRotate];
      sp.t = t32;
      sp.seg_indptr = seg;
      sp.seg_loop = seg + indptr.size();
      sp.num_segments = segments;
      sp.rows = rows;
      sp.in = sh.in;
      sp.rank = rank;
      sp.num_loops = loops;
      BENCH_CHECK(lora_shrink_forward(sp, g_stream));
      LoraExpandParams ep;
      ep.t = t32;
      ep.b = b[i % kRotate];
      ep.y = y;
      ep.seg_indptr = sp.seg_indptr;
      ep.seg_loop = sp.seg_loop;
      ep.num_segments = segments;
      ep.rows = rows;
      ep.out = sh.out;
      ep.rank = rank;
      ep.num_loops = loops;
      BENCH_CHECK(lora_expand_forward(ep, g_stream));
    });
    auto run_gemm = [&](const uint16_t* gx, const uint16_t* gw, void* gy, DType dt, int m, int n,
                        int k) {
      GemmParams p;
      p.x = gx;
      p.w = gw;
      p.y = gy;
      p.y_dtype = dt;
      p.m = m;
      p.n = n;
      p.k = k;
      const cublasStatus_t st = gemm.Run(p, g_stream);
      if (st != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "lora gemm %d x %d x %d: %s\n", m, n, k, GemmStatusString(st));
        std::exit(1);
      }
    };
    // The loop's GEMMs need pinned cuBLASLt algorithms; without them only the segmented side.
    const bool loop_runs = gemm.Prepare(1, rank, sh.in, DType::kBF16) == CUBLAS_STATUS_SUCCESS &&
                           gemm.Prepare(1, sh.out, rank, DType::kF32) == CUBLAS_STATUS_SUCCESS;
    const Timing ms_loop = !loop_runs ? Timing{std::nan(""), std::nan("")} : TimeMs([&](int i) {
      for (int g = 0; g < segments; ++g) {
        const int begin = indptr[g], count = indptr[g + 1] - indptr[g], l = seg_loop[g];
        run_gemm(x + static_cast<size_t>(begin) * sh.in,
                 a[i % kRotate] + static_cast<size_t>(l) * rank * sh.in, t16, DType::kBF16, count,
                 rank, sh.in);
        run_gemm(t16, b[i % kRotate] + static_cast<size_t>(l) * sh.out * rank, d, DType::kF32,
                 count, sh.out, rank);
        ScaleAddParams add;
        add.h = y + static_cast<size_t>(begin) * sh.out;
        add.b = d;
        add.rows = count;
        add.dim = sh.out;
        add.b_dtype = DType::kF32;
        BENCH_CHECK(scale_add_forward(add, g_stream));
      }
    });
    // Adapters of the loops present, x, t written and read, y read and written.
    const double bytes = 2.0 * segments * rank * (sh.in + sh.out) + 2.0 * rows * sh.in +
                         8.0 * rows * rank + 8.0 * rows * sh.out;
    const double flops = 2.0 * rows * rank * (sh.in + sh.out);
    const std::string tag = std::string(sh.what) + " r" + std::to_string(rank) + " L" +
                            std::to_string(loops) + " m" + std::to_string(rows);
    out.push_back({"lora segmented " + tag, ms_segmented.ms, bytes, flops, ms_segmented.eager_ms});
    out.push_back({"lora gemm-loop " + tag, ms_loop.ms, bytes, flops, ms_loop.eager_ms});
  }
  for (int s = 0; s < kRotate; ++s) {
    cudaFree(a[s]);
    cudaFree(b[s]);
  }
  for (void* p : {static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(d),
                  static_cast<void*>(t32), static_cast<void*>(t16), static_cast<void*>(seg)}) {
    cudaFree(p);
  }
  return out;
}

// Prints each result as it finishes and rewrites the JSON file after each, so a run cut short
// (the device call's limit) still leaves every row measured so far.
class Report {
 public:
  Report(const char* path, std::string device, double copy_bw)
      : path_(path), device_(std::move(device)), copy_bw_(copy_bw) {
    std::printf("device: %s, copy bandwidth %.0f GB/s (read + write)\n", device_.c_str(),
                copy_bw_ / 1e9);
    std::printf("%-44s %10s %10s %8s %10s %10s\n", "kernel", "us", "GB/s", "of copy", "TFLOP/s",
                "eager us");
    Write();
  }
  void Add(const Result& r) {
    const double bw = r.bytes / (r.ms * 1e-3);
    std::printf("%-44s %10.1f %10.0f %7.0f%% %10.2f %10.1f\n", r.name.c_str(), r.ms * 1e3, bw / 1e9,
                100.0 * bw / copy_bw_, r.flops / (r.ms * 1e-3) / 1e12, r.eager_ms * 1e3);
    std::fflush(stdout);
    results_.push_back(r);
    Write();
  }
  void Add(const std::optional<Result>& r) {
    if (r.has_value()) Add(*r);
  }
  void Note(const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    notes_.push_back(line);
    Write();
  }

 private:
  static std::string Number(double v) { return std::isnan(v) ? "null" : std::to_string(v); }
  void Write() const {
    if (path_ == nullptr) return;
    std::string json = "{\"device\": \"" + device_ +
                       "\", \"copy_bytes_per_s\": " + std::to_string(copy_bw_) + ", \"notes\": [";
    for (size_t i = 0; i < notes_.size(); ++i) {
      json += std::string(i ? ", " : "") + "\"" + notes_[i] + "\"";
    }
    json += "], \"results\": [";
    for (size_t i = 0; i < results_.size(); ++i) {
      const Result& r = results_[i];
      json += std::string(i ? ", " : "") + "{\"name\": \"" + r.name +
              "\", \"ms\": " + Number(r.ms) + ", \"eager_ms\": " + Number(r.eager_ms) +
              ", \"bytes\": " + std::to_string(r.bytes) +
              ", \"flops\": " + std::to_string(r.flops) + "}";
    }
    json += "]}\n";
    FILE* f = std::fopen(path_, "w");
    if (f == nullptr) {
      std::perror(path_);
      std::exit(1);
    }
    std::fputs(json.c_str(), f);
    std::fclose(f);
  }

  const char* path_;
  std::string device_;
  double copy_bw_;
  std::vector<Result> results_;
  std::vector<std::string> notes_;
};

int Main(int argc, char** argv) {
  cudaDeviceProp prop;
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  BENCH_CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  std::mt19937_64 rng(42);
  const bool lora_only = argc > 2 && std::string(argv[2]) == "lora";
  Report report(argc > 1 ? argv[1] : nullptr, prop.name, CopyBandwidth());
  LtGemm gemm;
  if (gemm.Init() != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cuBLASLt init failed\n");
    return 1;
  }
  struct Shape {
    const char* what;
    int n, k;
  };
  constexpr Shape kShapes[] = {{"qkv", 1600, 960},
                               {"o", 960, 960},
                               {"gate_up", 5120, 960},
                               {"down", 960, 2560},
                               {"lm_head", 49152, 960}};
  if (!lora_only) {
    // What the heuristic offers per m and the algorithm pinned, shape by shape (the runner's
    // fp32-out GEMMs).
    for (const Shape& sh : kShapes) report.Note(gemm.Describe(sh.n, sh.k, DType::kF32));
    // The projections first: the fixed-order GEMM beside pinned cuBLASLt at each m.
    for (int m : {1, 32, 128, 1024}) {
      for (const Shape& sh : kShapes) {
        report.Add(FixedGemm(sh.what, m, sh.n, sh.k, rng));
        report.Add(Gemm(gemm, sh.what, m, sh.n, sh.k, rng));
      }
    }
    // Each attention case with both folds, side by side (--cuda-attention-fold).
    const AttentionWalk warp{AttentionFold::kWarp, 256};
    for (int rows : {1, 32, 128}) {
      for (int ctx : {1024, 4096}) {
        report.Add(Attention(rows, ctx, false, rng));
        report.Add(Attention(rows, ctx, false, rng, kSmolHeads, warp));
      }
    }
    // Batch 1 with shorter chunks (more CTAs, a shorter walk each, more partials to combine).
    for (int ctx : {1024, 4096}) {
      for (int chunk : {64, 128}) {
        for (AttentionFold fold : {AttentionFold::kCta, AttentionFold::kWarp}) {
          report.Add(Attention(1, ctx, false, rng, kSmolHeads, {fold, chunk}));
        }
      }
    }
    report.Add(Attention(512, 2048, true, rng));
    report.Add(Attention(512, 2048, true, rng, kSmolHeads, warp));
    report.Add(Attention(8, 4096, false, rng, kHuginnHeads));  // head_dim 96
    report.Add(Attention(8, 4096, false, rng, kHuginnHeads, warp));
    report.Add(Attention(512, 2048, true, rng, kHuginnHeads));
  }
  std::vector<Result> lora;
  for (const LoraShape& sh : {LoraShape{"qkv", 960, 1600}, LoraShape{"gate_up", 960, 5120},
                              LoraShape{"down", 2560, 960}}) {
    for (int rank : {8, 32, 64}) {
      for (int loops : {3, 4}) {
        for (Result& r : Lora(gemm, sh, rank, loops, {1, 32, 256}, rng)) {
          if (!std::isnan(r.ms)) report.Add(r);
          lora.push_back(r);
        }
      }
    }
  }
  std::printf("\nper-loop LoRA: segmented kernels vs per-group cuBLASLt loop\n");
  std::printf("%-32s %14s %14s %8s\n", "linear rank loops rows", "segmented us", "gemm-loop us",
              "speedup");
  for (size_t i = 0; i + 1 < lora.size(); i += 2) {
    std::printf("%-32s %14.1f %14.1f %7.2fx\n", lora[i].name.c_str() + 15, lora[i].ms * 1e3,
                lora[i + 1].ms * 1e3, lora[i + 1].ms / lora[i].ms);
  }
  return 0;
}

}  // namespace
}  // namespace morserve::kernels

int main(int argc, char** argv) { return morserve::kernels::Main(argc, argv); }
