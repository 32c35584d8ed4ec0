// Kernel micro-benchmark for a GPU session (not a test: speed is never asserted). Measures
// the device-to-device copy bandwidth (bytes read + written), then paged attention (decode
// at several batch sizes and contexts, and a prefill chunk) and the cuBLASLt GEMMs of a
// SmolLM-360M-shaped layer, each as the median over repeats of event-timed runs that rotate
// over 8 input sets so the L2 cache does not serve them. Prints a table and writes JSON.
//   usage: kernel_bench [OUT.json]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/gemm.cuh"
#include "kernels/paged_attention.cuh"

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

// Median milliseconds per call of fn(iteration) over kRepeats runs of kIters calls.
template <typename Fn>
double TimeMs(Fn fn) {
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) fn(i);  // warm-up
  BENCH_CHECK(cudaDeviceSynchronize());
  std::vector<double> runs;
  for (int r = 0; r < kRepeats; ++r) {
    BENCH_CHECK(cudaEventRecord(start));
    for (int i = 0; i < kIters; ++i) fn(i);
    BENCH_CHECK(cudaEventRecord(stop));
    BENCH_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CHECK(cudaEventElapsedTime(&ms, start, stop));
    runs.push_back(ms / kIters);
  }
  BENCH_CHECK(cudaGetLastError());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

struct Result {
  std::string name;
  double ms;
  double bytes;
  double flops;
};

double CopyBandwidth() {
  const size_t bytes = size_t{1} << 30;
  auto* a = DeviceAlloc<uint8_t>(bytes);
  auto* b = DeviceAlloc<uint8_t>(bytes);
  BENCH_CHECK(cudaMemset(a, 1, bytes));
  const double ms =
      TimeMs([&](int) { BENCH_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); });
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / (ms * 1e-3);
}

// Paged attention over `rows` rows: decode (one row per request, context `ctx`) or a prefill
// chunk (`rows` rows of one request ending at context ctx).
Result Attention(int rows, int ctx, bool prefill, std::mt19937_64& rng) {
  const int n_heads = 15, n_kv = 5, hd = 64, bs = 16, chunk = 256;
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
  p.scale = 0.125f;
  const double ms = TimeMs([&](int i) {
    PagedAttentionParams a = p;
    a.table_indptr = d_indptr[i % kRotate];
    a.table_blocks = d_blocks[i % kRotate];
    BENCH_CHECK(paged_attention_forward(a, nullptr));
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
      std::to_string(rows) + " ctx=" + std::to_string(ctx);
  const double flops = 4.0 * (kv_bytes / (2.0 * n_kv * hd * 2)) * n_heads * hd;
  return {name, ms, kv_bytes, flops};
}

Result Gemm(LtGemm& gemm, const char* what, int m, int n, int k, std::mt19937_64& rng) {
  std::vector<uint16_t*> w(kRotate);
  for (auto& p : w) {
    p = DeviceAlloc<uint16_t>(static_cast<size_t>(n) * k);
    FillRandomBf16(p, static_cast<size_t>(n) * k, rng);
  }
  uint16_t* x = DeviceAlloc<uint16_t>(static_cast<size_t>(m) * k);
  FillRandomBf16(x, static_cast<size_t>(m) * k, rng);
  uint16_t* y = DeviceAlloc<uint16_t>(static_cast<size_t>(m) * n);
  if (gemm.Prepare(m, n, k, DType::kBF16) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "no cuBLASLt algorithm for %d x %d x %d\n", m, n, k);
    std::exit(1);
  }
  const double ms = TimeMs([&](int i) {
    GemmParams p;
    p.x = x;
    p.w = w[i % kRotate];
    p.y = y;
    p.m = m;
    p.n = n;
    p.k = k;
    const cublasStatus_t st = gemm.Run(p, nullptr);
    if (st != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "gemm: %s\n", GemmStatusString(st));
      std::exit(1);
    }
  });
  for (auto* p : w) cudaFree(p);
  cudaFree(x);
  cudaFree(y);
  const double bytes =
      2.0 * (static_cast<double>(n) * k + static_cast<double>(m) * k + static_cast<double>(m) * n);
  return {std::string("gemm ") + what + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
              " k=" + std::to_string(k),
          ms, bytes, 2.0 * m * n * k};
}

int Main(int argc, char** argv) {
  cudaDeviceProp prop;
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::mt19937_64 rng(42);
  const double copy_bw = CopyBandwidth();
  std::vector<Result> results;
  for (int rows : {1, 32, 128}) {
    for (int ctx : {1024, 4096}) results.push_back(Attention(rows, ctx, false, rng));
  }
  results.push_back(Attention(512, 2048, true, rng));
  LtGemm gemm;
  if (gemm.Init() != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cuBLASLt init failed\n");
    return 1;
  }
  for (int m : {1, 32, 128}) {
    results.push_back(Gemm(gemm, "qkv", m, 1600, 960, rng));
    results.push_back(Gemm(gemm, "o", m, 960, 960, rng));
    results.push_back(Gemm(gemm, "gate_up", m, 5120, 960, rng));
    results.push_back(Gemm(gemm, "down", m, 960, 2560, rng));
    results.push_back(Gemm(gemm, "lm_head", m, 49152, 960, rng));
  }

  std::printf("device: %s, copy bandwidth %.0f GB/s (read + write)\n", prop.name, copy_bw / 1e9);
  std::printf("%-44s %10s %10s %8s %10s\n", "kernel", "us", "GB/s", "of copy", "TFLOP/s");
  std::string json = "{\"device\": \"" + std::string(prop.name) +
                     "\", \"copy_bytes_per_s\": " + std::to_string(copy_bw) + ", \"results\": [";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    const double bw = r.bytes / (r.ms * 1e-3);
    std::printf("%-44s %10.1f %10.0f %7.0f%% %10.2f\n", r.name.c_str(), r.ms * 1e3, bw / 1e9,
                100.0 * bw / copy_bw, r.flops / (r.ms * 1e-3) / 1e12);
    json += std::string(i ? ", " : "") + "{\"name\": \"" + r.name +
            "\", \"ms\": " + std::to_string(r.ms) + ", \"bytes\": " + std::to_string(r.bytes) +
            ", \"flops\": " + std::to_string(r.flops) + "}";
  }
  json += "]}\n";
  if (argc > 1) {
    FILE* f = std::fopen(argv[1], "w");
    if (f == nullptr) {
      std::perror(argv[1]);
      return 1;
    }
    std::fputs(json.c_str(), f);
    std::fclose(f);
  }
  return 0;
}

}  // namespace
}  // namespace morserve::kernels

int main(int argc, char** argv) { return morserve::kernels::Main(argc, argv); }
