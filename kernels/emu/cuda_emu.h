// A CPU emulator of CUDA threads for this project's kernels, so their index arithmetic,
// barriers, warp shuffles and launch configurations run on machines without a GPU (CI, this
// VM): the kernel emulator tests call kernel bodies through Run(), and the emulated CUDA model
// runner ("The emulated runner" in kernels/README.md) launches every kernel through
// MORSERVE_LAUNCH (kernels/launch.cuh), which lands in Launcher below.
//
// Each CUDA thread of a block is a fiber (its own stack) on the calling OS thread; blocks run one
// after another. __syncthreads() parks a fiber until every live thread of the block has arrived;
// __syncwarp() and the shuffles do the same per warp (a shuffle publishes the value, waits for
// the warp, reads its partner's value, and waits again); a tensor-core mma.sync
// (MmaBf16M16N8K16) likewise gathers the warp's fragments, in one fixed fp32 order. A barrier
// that can never be released (threads of a block or warp waiting at different barriers, i.e. a
// divergent __syncthreads or shuffle, undefined on a GPU) aborts with a message instead of hanging.
// __shared__ variables become function-local statics, shared by the block's fibers and reused by
// the next block, as on a GPU (contents are not preserved across blocks there either, and the
// kernels initialise what they read). Fiber stacks are pooled across launches (not zero-filled).
//
// Launch limits a GPU enforces are checked (Check): block threads <= 1024 (x, y <= 1024,
// z <= 64), grid.x < 2^31, grid.y/z <= 65535, no zero dimension, dynamic shared memory
// <= 48 KiB (no kernel opts in to more). A bad configuration runs nothing and leaves
// cudaErrorInvalidConfiguration as the error cudaGetLastError() returns (and clears), as on a
// GPU. Static __shared__ memory over 48 KiB is not checked here: ptxas rejects it when nvcc
// builds morserve_kernels (CI's CUDA build).
//
// Launches and async copies on a created stream are deferred to the next synchronisation, or
// recorded while the stream captures a CUDA graph, which cudaGraphLaunch replays (stream_emu.h:
// stream order and capture); everything else is synchronous. What it does not model: timing,
// concurrency between blocks or streams, memory ordering beyond the barriers, fast-math
// intrinsics' exact rounding (host libm is used). Include it before a kernel header; it defines
// MORSERVE_CUDA_EMU.
#pragma once

#ifndef MORSERVE_CUDA_EMU
#define MORSERVE_CUDA_EMU 1
#endif

#include <cuda_runtime.h>  // first: its host-side keyword macros are replaced below
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/emu/stream_emu.h"

// CUDA's own (reserved) names, defined here for the host.
// NOLINTBEGIN(bugprone-reserved-identifier)
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#undef __shared__
#undef __align__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
// NOLINTEND(bugprone-reserved-identifier)

struct EmuDim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr EmuDim3() = default;
  constexpr EmuDim3(unsigned x_, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
  constexpr EmuDim3(dim3 d) : x(d.x), y(d.y), z(d.z) {}  // NOLINT: as a launch's <<<dim3>>>
  uint64_t count() const { return uint64_t{x} * y * z; }
};

namespace cuda_emu {

// Fiber stacks: 64 KiB each (an engine run reaches 2.4 KiB at -O2), pooled across
// launches.
constexpr size_t kStackBytes = 64 * 1024;

// A saved execution context. On x86-64 (without AddressSanitizer, which must see stack
// switches) it is a stack pointer and Switch() is the few instructions below: ucontext's
// swapcontext makes a system call per switch (the signal mask), which dominated the time of
// an emulated engine run. Elsewhere, ucontext.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define MORSERVE_CUDA_EMU_ASM_SWITCH 1
struct Context {
  void* sp = nullptr;
};
}  // namespace cuda_emu
// cuda_emu_switch(save, load): pushes the callee-saved registers, stores the stack pointer in
// *save, loads `load` and pops the same from there. The SSE and x87 control words are not
// switched (saving them cost a third of an engine run): no kernel changes them, so every fiber
// runs with the launching thread's. Weak: every translation unit that includes this header
// emits it.
extern "C" void cuda_emu_switch(void** save, void* load);
asm(R"(
  .text
  .weak cuda_emu_switch
  .type cuda_emu_switch, @function
cuda_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cuda_emu_switch, .-cuda_emu_switch
)");
namespace cuda_emu {
inline void Switch(Context* save, const Context& load) { cuda_emu_switch(&save->sp, load.sp); }
// A context that starts entry() on the stack [stack, stack + bytes): the six registers
// cuda_emu_switch pops, then entry as the return address, with the stack aligned as at a call.
inline Context MakeContext(char* stack, size_t bytes, void (*entry)()) {
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15};
  auto* sp = reinterpret_cast<uint64_t*>(top);  // NOLINT(performance-no-int-to-ptr)
  *--sp = 0;                                    // entry's own (never used) return address
  *--sp = reinterpret_cast<uint64_t>(entry);    // where cuda_emu_switch's ret goes
  for (int i = 0; i < 6; ++i) *--sp = 0;        // rbp, rbx, r12..r15
  return Context{sp};
}
#else
struct Context {
  ucontext_t uc;
};
inline void Switch(Context* save, const Context& load) { swapcontext(&save->uc, &load.uc); }
inline Context MakeContext(char* stack, size_t bytes, void (*entry)()) {
  Context c;
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
  return c;
}
#endif

struct Fiber {
  Context ctx;
  char* stack = nullptr;
  enum State { kRunnable, kBlockBarrier, kWarpBarrier, kDone } state = kRunnable;
};

// One launch's state; the fibers of the current block live here.
struct Launch {
  int threads = 0;
  std::vector<Fiber> fibers;
  Context scheduler;
  int current = 0;
  std::vector<uint64_t> shuffle;             // one slot per thread
  std::vector<std::array<uint32_t, 6>> mma;  // one slot per thread: its A and B fragments
  const std::function<void()>* body = nullptr;
};

inline Launch*& Current() {
  static Launch* launch = nullptr;
  return launch;
}

// The error of the last failed launch, returned and cleared by cudaGetLastError().
inline cudaError_t& LastError() {
  static cudaError_t error = cudaSuccess;
  return error;
}

// Launches run one at a time (the emulator's thread and block indices are process-wide).
inline std::mutex& LaunchMutex() {
  static std::mutex m;
  return m;
}

// The stacks of fibers 0..1023 (Check allows no more): one mapping made on first use and
// kept, never zero-filled by us, asked for transparent huge pages (every switch lands on
// another fiber's stack; fewer pages, fewer TLB misses).
inline char* PooledStack(int i) {
  static char* pool = [] {
    const size_t bytes = size_t{1024} * kStackBytes;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "cuda_emu: cannot map %zu bytes of fiber stacks\n", bytes);
      std::abort();
    }
    madvise(p, bytes, MADV_HUGEPAGE);
    return static_cast<char*>(p);
  }();
  return pool + static_cast<size_t>(i) * kStackBytes;
}

}  // namespace cuda_emu

inline EmuDim3 threadIdx, blockIdx, blockDim, gridDim;

namespace cuda_emu {

// Makes fiber t the current thread (its threadIdx from the launch's block shape).
inline void Enter(Launch& l, int t) {
  l.current = t;
  const unsigned u = static_cast<unsigned>(t);
  threadIdx = {u % blockDim.x, u / blockDim.x % blockDim.y, u / (blockDim.x * blockDim.y)};
}

// Leaves the current fiber for the next runnable one of this round (a higher index), or for
// the scheduler when none is left: one switch per hand-over instead of two.
inline void Yield(Launch& l) {
  const int from = l.current;
  for (int t = from + 1; t < l.threads; ++t) {
    if (l.fibers[t].state == Fiber::kRunnable) {
      Enter(l, t);
      Switch(&l.fibers[from].ctx, l.fibers[t].ctx);
      return;
    }
  }
  Switch(&l.fibers[from].ctx, l.scheduler);
}

inline void Park(Fiber::State why) {
  Launch& l = *Current();
  l.fibers[l.current].state = why;
  Yield(l);
}

inline void FiberMain() {
  Launch& l = *Current();
  (*l.body)();
  l.fibers[l.current].state = Fiber::kDone;
  Yield(l);  // never resumed
}

// Releases barriers whose participants have all arrived; false when nothing could move.
inline bool Release(Launch& l) {
  bool moved = false;
  bool all_block = true;
  for (const Fiber& f : l.fibers)
    all_block = all_block && (f.state == Fiber::kBlockBarrier || f.state == Fiber::kDone);
  bool any_block = false;
  for (const Fiber& f : l.fibers) any_block = any_block || f.state == Fiber::kBlockBarrier;
  if (all_block && any_block) {
    for (Fiber& f : l.fibers) {
      if (f.state == Fiber::kBlockBarrier) f.state = Fiber::kRunnable;
    }
    moved = true;
  }
  for (int w = 0; w * 32 < l.threads; ++w) {
    const int lo = w * 32, hi = std::min(l.threads, lo + 32);
    bool all = true, any = false;
    for (int t = lo; t < hi; ++t) {
      all = all && (l.fibers[t].state == Fiber::kWarpBarrier || l.fibers[t].state == Fiber::kDone);
      any = any || l.fibers[t].state == Fiber::kWarpBarrier;
    }
    if (all && any) {
      for (int t = lo; t < hi; ++t) {
        if (l.fibers[t].state == Fiber::kWarpBarrier) l.fibers[t].state = Fiber::kRunnable;
      }
      moved = true;
    }
  }
  return moved;
}

// cudaSuccess, or cudaErrorInvalidConfiguration where a GPU would refuse the launch.
inline cudaError_t Check(EmuDim3 grid, EmuDim3 block, size_t dynamic_smem) {
  const bool bad_block = block.x == 0 || block.y == 0 || block.z == 0 || block.x > 1024 ||
                         block.y > 1024 || block.z > 64 || block.count() > 1024;
  const bool bad_grid = grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu ||
                        grid.y > 65535 || grid.z > 65535;
  const bool bad_smem = dynamic_smem > 48 * 1024;
  return bad_block || bad_grid || bad_smem ? cudaErrorInvalidConfiguration : cudaSuccess;
}

// Runs one block: every thread of it as a fiber until all are done.
inline void RunBlock(Launch& l) {
  for (int t = 0; t < l.threads; ++t) {
    Fiber& f = l.fibers[t];
    f.state = Fiber::kRunnable;
    f.ctx = MakeContext(f.stack, kStackBytes, FiberMain);
  }
  for (;;) {
    // One round: the runnable fibers in index order, each handing over to the next (Yield).
    bool ran = false;
    for (int t = 0; t < l.threads; ++t) {
      if (l.fibers[t].state == Fiber::kRunnable) {
        Enter(l, t);
        Switch(&l.scheduler, l.fibers[t].ctx);
        ran = true;
        break;
      }
    }
    bool done = true;
    for (const Fiber& f : l.fibers) done = done && f.state == Fiber::kDone;
    if (done) return;
    if (!Release(l) && !ran) {
      std::fprintf(stderr,
                   "cuda_emu: deadlock in block (%u, %u, %u): threads wait at different "
                   "barriers\n",
                   blockIdx.x, blockIdx.y, blockIdx.z);
      std::abort();
    }
  }
}

// Runs body() as every thread of every block of the grid (blocks in x, then y, then z
// order). A configuration a GPU refuses runs nothing: the error is returned and kept for
// cudaGetLastError().
inline cudaError_t Run(EmuDim3 grid, EmuDim3 block, size_t dynamic_smem,
                       const std::function<void()>& body) {
  if (cudaError_t e = Check(grid, block, dynamic_smem); e != cudaSuccess) {
    LastError() = e;
    return e;
  }
  std::lock_guard<std::mutex> lock(LaunchMutex());
  Launch l;
  l.threads = static_cast<int>(block.count());
  l.fibers.resize(l.threads);
  for (int t = 0; t < l.threads; ++t) l.fibers[t].stack = PooledStack(t);
  l.shuffle.assign(l.threads, 0);
  l.mma.assign(l.threads, {});
  l.body = &body;
  Current() = &l;
  gridDim = grid;
  blockDim = block;
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = {x, y, z};
        RunBlock(l);
      }
    }
  }
  Current() = nullptr;
  return cudaSuccess;
}

// The kernel emulator tests' form: a 1-D block of `threads`, no dynamic shared memory.
inline cudaError_t Run(EmuDim3 grid, int threads, const std::function<void()>& body) {
  return Run(grid, EmuDim3(static_cast<unsigned>(threads)), 0, body);
}

// What MORSERVE_LAUNCH(grid, block, smem, stream, kernel)(args...) builds: the launch
// configuration and a callable that calls the kernel; operator() checks the configuration
// (a refused launch is cudaGetLastError's error at once, as on a GPU), copies the arguments (a
// kernel takes them by value, as a launch does, so a graph replays the captured values) and
// runs the grid in stream order or records it in the stream's capture (Submit).
template <typename Kernel>
struct Launcher {
  EmuDim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  Kernel kernel;
  template <typename... Args>
  void operator()(Args&&... args) const {
    if (cudaError_t e = Check(grid, block, smem); e != cudaSuccess) {
      LastError() = e;
      return;
    }
    const cudaError_t e =
        Submit(stream, [grid = grid, block = block, smem = smem, kernel = kernel,
                        copy = std::tuple<std::decay_t<Args>...>(std::forward<Args>(args)...)] {
          Run(grid, block, smem, [&] { std::apply(kernel, copy); });
        });
    if (e != cudaSuccess) {
      LastError() = e;  // a launch into an invalidated capture
      return;
    }
    Counts().kernel_launches.fetch_add(1, std::memory_order_relaxed);
  }
};

template <typename Kernel>
Launcher<Kernel> MakeLauncher(EmuDim3 grid, EmuDim3 block, size_t smem, cudaStream_t stream,
                              Kernel kernel) {
  return Launcher<Kernel>{grid, block, smem, stream, std::move(kernel)};
}

template <typename T>
T Shuffle(T v, int src_lane_xor, bool is_xor, int up) {
  Launch& l = *Current();
  const int t = l.current;
  const int lane = t % 32, base = t - lane;
  static_assert(sizeof(T) <= 8, "shuffle of a value over 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  l.shuffle[t] = bits;
  Park(Fiber::kWarpBarrier);
  int src = is_xor ? (lane ^ src_lane_xor) : lane - up;
  if (src < 0 || src >= 32 || base + src >= l.threads) src = lane;  // out of range: own value
  T out;
  std::memcpy(&out, &l.shuffle[base + src], sizeof(T));
  Park(Fiber::kWarpBarrier);
  return out;
}

// One warp's mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (kernels/common.cuh's
// MmaBf16M16N8K16): every lane publishes its A and B fragments, waits for the warp, computes
// its own four D elements from the whole warp's fragments, and waits again. Fragment layout as
// in the PTX ISA (lane = 4 g + t): a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1],
// a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9]; b[0] = B[2t, 2t+1][g],
// b[1] = B[2t+8, 2t+9][g]; d[0..1] = D[g][2t, 2t+1], d[2..3] = D[g+8][2t, 2t+1]; the lower 16
// bits hold the lower index. Each D element is c plus its 16 products (exact in fp32) added in
// k order in fp32: one fixed order, not the tensor core's (the emulator models no GPU rounding).
inline void Mma(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  Launch& l = *Current();
  const int t = l.current;
  const int lane = t % 32, base = t - lane;
  if (base + 32 > l.threads) {
    std::fprintf(stderr, "cuda_emu: mma.sync in a partial warp\n");
    std::abort();
  }
  l.mma[t] = {a[0], a[1], a[2], a[3], b[0], b[1]};
  Park(Fiber::kWarpBarrier);
  auto half = [](uint32_t word, int hi) {
    uint32_t bits = (hi ? word >> 16 : word & 0xffffu) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  };
  // A[row][k]: lane 4 (row % 8) + (k % 8) / 2, register (row >= 8) + 2 (k >= 8), half k % 2.
  auto a_at = [&](int row, int k) {
    const auto& s = l.mma[base + 4 * (row % 8) + (k % 8) / 2];
    return half(s[(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k % 2);
  };
  // B[k][col]: lane 4 col + (k % 8) / 2, register 4 + (k >= 8), half k % 2.
  auto b_at = [&](int k, int col) {
    const auto& s = l.mma[base + 4 * col + (k % 8) / 2];
    return half(s[4 + (k >= 8 ? 1 : 0)], k % 2);
  };
  const int g = lane / 4, tq = lane % 4;
  float out[4];
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i >= 2 ? 8 : 0), col = 2 * tq + i % 2;
    float acc = c[i];
    for (int k = 0; k < 16; ++k) {
      const float prod = a_at(row, k) * b_at(k, col);  // exact: two 8-bit significands
      acc = acc + prod;
    }
    out[i] = acc;
  }
  Park(Fiber::kWarpBarrier);
  for (int i = 0; i < 4; ++i) d[i] = out[i];
}

}  // namespace cuda_emu

// The device intrinsics (CUDA's reserved names) on the emulator.
// NOLINTBEGIN(bugprone-reserved-identifier)
inline void __syncthreads() { cuda_emu::Park(cuda_emu::Fiber::kBlockBarrier); }
inline void __syncwarp(unsigned = 0xffffffffu) { cuda_emu::Park(cuda_emu::Fiber::kWarpBarrier); }
template <typename T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  return cuda_emu::Shuffle(v, lane_mask, true, 0);
}
template <typename T>
T __shfl_up_sync(unsigned, T v, unsigned delta) {
  return cuda_emu::Shuffle(v, 0, false, static_cast<int>(delta));
}

inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float __int_as_float(int32_t i) { return __uint_as_float(static_cast<uint32_t>(i)); }
inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
// Round-to-nearest arithmetic intrinsics: plain IEEE operations on the host (no contraction
// into fused multiply-adds happens for separate statements of this form).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __double2float_rn(double d) { return static_cast<float>(d); }
// NOLINTEND(bugprone-reserved-identifier)
// Fibers switch only at barriers, so an atomic is a plain read-modify-write here.
template <typename T, typename U>
T atomicAdd(T* p, U v) {
  const T old = *p;
  *p = static_cast<T>(old + static_cast<T>(v));
  return old;
}
using std::isnan;
using std::max;
using std::min;

namespace morserve::kernels {

// The device helpers of kernels/common.cuh.
inline void MmaBf16M16N8K16(float d[4], const uint32_t a[4], const uint32_t b[2],
                            const float c[4]) {
  cuda_emu::Mma(d, a, b, c);
}
inline void CopyAsync16(void* smem_dst, const void* gmem_src) {
  std::memcpy(smem_dst, gmem_src, 16);
}
inline void WaitAsyncCopies() {}
inline float Bf16BitsToF32(uint16_t b) { return Bf16ToF32(b); }
inline uint16_t F32ToBf16Bits(float f) { return F32ToBf16(f); }
template <typename T>
float LoadF32(const T* p, int64_t i);
template <>
inline float LoadF32<float>(const float* p, int64_t i) {
  return p[i];
}
template <>
inline float LoadF32<uint16_t>(const uint16_t* p, int64_t i) {
  return Bf16BitsToF32(p[i]);
}
template <typename T>
void StoreF32(T* p, int64_t i, float v);
template <>
inline void StoreF32<float>(float* p, int64_t i, float v) {
  p[i] = v;
}
template <>
inline void StoreF32<uint16_t>(uint16_t* p, int64_t i, float v) {
  p[i] = F32ToBf16Bits(v);
}

}  // namespace morserve::kernels
