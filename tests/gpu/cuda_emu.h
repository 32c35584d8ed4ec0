// A small CPU emulator for this project's CUDA kernel bodies, so their index arithmetic,
// barriers and warp shuffles are exercised on machines without a GPU (CI, this VM).
//
// Each CUDA thread of a block is a fiber (ucontext) on the calling OS thread; blocks run one
// after another. __syncthreads() parks a fiber until every live thread of the block has
// arrived; __syncwarp() and the shuffles do the same per warp (a shuffle publishes the value,
// waits for the warp, reads its partner's value, and waits again). A barrier that can never
// be released (threads of a block or warp waiting at different barriers, i.e. a divergent
// __syncthreads or shuffle, undefined on a GPU) aborts with a message instead of hanging.
// __shared__ variables become function-local statics, shared by the block's fibers and
// reused by the next block, as on a GPU (contents are not preserved across blocks there
// either, and the kernels initialise what they read).
//
// What it does not model: timing, memory ordering beyond the barriers, fast-math
// intrinsics' exact rounding (host libm is used), or launch limits. Include it before a
// kernel header and define MORSERVE_CUDA_EMU.
#pragma once

#ifndef MORSERVE_CUDA_EMU
#define MORSERVE_CUDA_EMU 1
#endif

#include <cuda_runtime.h>  // first: its host-side keyword macros are replaced below
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "engine/model/dtype.h"

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

struct EmuDim3 {
  unsigned x = 0, y = 0, z = 0;
};

namespace cuda_emu {

// One launch's state; the fibers of the current block live here.
struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  enum State { kRunnable, kBlockBarrier, kWarpBarrier, kDone } state = kRunnable;
};

struct Launch {
  int threads = 0;
  std::vector<Fiber> fibers;
  ucontext_t scheduler;
  int current = 0;
  std::vector<uint64_t> shuffle;  // one slot per thread
  std::function<void()> body;
};

inline Launch*& Current() {
  static Launch* launch = nullptr;
  return launch;
}

}  // namespace cuda_emu

inline EmuDim3 threadIdx, blockIdx, blockDim, gridDim;

namespace cuda_emu {

inline void Park(Fiber::State why) {
  Launch& l = *Current();
  l.fibers[l.current].state = why;
  swapcontext(&l.fibers[l.current].ctx, &l.scheduler);
}

inline void FiberMain() {
  Launch& l = *Current();
  l.body();
  l.fibers[l.current].state = Fiber::kDone;
  swapcontext(&l.fibers[l.current].ctx, &l.scheduler);
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

// Runs body() as every thread of every block of the grid.
inline void Run(EmuDim3 grid, int threads, std::function<void()> body) {
  Launch l;
  l.threads = threads;
  l.fibers.resize(threads);
  l.shuffle.assign(threads, 0);
  l.body = std::move(body);
  Current() = &l;
  gridDim = grid;
  blockDim = {static_cast<unsigned>(threads), 1, 1};
  for (auto& f : l.fibers) f.stack.resize(256 * 1024);
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = {x, y, z};
        for (int t = 0; t < threads; ++t) {
          Fiber& f = l.fibers[t];
          f.state = Fiber::kRunnable;
          getcontext(&f.ctx);
          f.ctx.uc_stack.ss_sp = f.stack.data();
          f.ctx.uc_stack.ss_size = f.stack.size();
          f.ctx.uc_link = nullptr;
          makecontext(&f.ctx, FiberMain, 0);
        }
        for (;;) {
          bool ran = false, done = true;
          for (int t = 0; t < threads; ++t) {
            if (l.fibers[t].state == Fiber::kRunnable) {
              l.current = t;
              threadIdx = {static_cast<unsigned>(t), 0, 0};
              swapcontext(&l.scheduler, &l.fibers[t].ctx);
              ran = true;
            }
            done = done && l.fibers[t].state == Fiber::kDone;
          }
          if (done) break;
          if (!Release(l) && !ran) {
            std::fprintf(
                stderr,
                "cuda_emu: deadlock in block (%u, %u, %u): threads wait at different barriers\n", x,
                y, z);
            std::abort();
          }
        }
      }
    }
  }
  Current() = nullptr;
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

}  // namespace cuda_emu

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
