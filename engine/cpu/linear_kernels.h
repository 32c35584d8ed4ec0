// The CPU linear kernels: y[m, n] (+)= x[m, k] · W^T for W in any LinearWeights format.
//
// One reduction order, by design, for every output element whatever m, the row's place in
// the batch, the column range a thread was given or the thread count (the "L8 order"):
//   acc[0..7] = +0; for each block b of 8 along k (the last one zero-padded):
//     acc[l] = fma(x[8b + l], w[8b + l], acc[l]);
//   s = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7));
//   y = s, or y = y + s when accumulating.
// w is the weight decoded to exact fp32 (linear_weights.h), so the order, not the format,
// decides the bits. Batch invariance holds by construction: no padding rows, no M-dependent
// kernel choice changes a row's bits. Kernel sets with the same order give the same bits (the
// scalar set is the reference the tests compare every other set against bit for bit).
//
// A kernel set implements one column range; CpuLinear (cpu_linear.h) spreads ranges over the
// thread pool. Inside a range, small m (decode) reads the weights from where they lie: a tile of
// up to 4 rows of x serves every row from one weight load (register blocking), and the weights
// of a small column chunk stay in cache while each block of 4 rows runs over it; large m
// (prefill) decodes a panel of weight rows to fp32 once (cache-resident) and runs fp32 tiles
// over the rows in blocks of 4. The AVX-512 set reads bf16-quads without panels: blocks of 8
// rows per quad, in chunks of 64 rows, at every m beyond 4; and int8-octets in blocks of 4 rows
// per octet up to 63 rows, in panels from 64.
#pragma once

#include <cstdint>
#include <string_view>

#include "engine/cpu/linear_weights.h"

namespace morserve {

struct LinearArgs {
  const float* x = nullptr;  // [m, ldx], row-major
  int64_t ldx = 0;
  int m = 0;
  const LinearWeights* w = nullptr;
  float* y = nullptr;  // [m, ldy], row-major; columns n0..n1 written
  int64_t ldy = 0;
  bool accumulate = false;
  // x converted once per call by the set's `prepare` (nullptr for sets without one), on the
  // calling thread before the ranges run; it lives until that thread's next call.
  const void* prepared = nullptr;
};

struct LinearKernelSet {
  std::string_view name;  // "scalar", "avx2", "avx512", "amx", "avx512-bf16", ...
  // Computes columns [n0, n1) of every row.
  void (*run)(const LinearArgs& args, int n0, int n1) = nullptr;
  // Rows of W one range should hold for m rows: ranges are multiples of it (except the last).
  int (*chunk_rows)(int m, int k) = nullptr;
  // Sets whose products read x in another form (bf16-rounded rows): converts x once per call
  // into args.prepared, so the ranges of one call do not each convert it again. nullptr: none.
  void (*prepare)(LinearArgs& args) = nullptr;
};

const LinearKernelSet& ScalarLinearKernels();
// nullptr when the host lacks AVX2, FMA or F16C.
const LinearKernelSet* Avx2LinearKernels();
// nullptr when the host lacks AVX-512 F/BW/DQ/VL or the AVX2 set's extensions.
const LinearKernelSet* Avx512LinearKernels();
// The AMX set (linear_kernels_amx.cc) runs amx-bf16 weights only, in its own order: x rounded
// to bf16, products summed by the tile unit (one order for every M, so batch invariance still
// holds by construction; within a stated tolerance of the exact product, not the L8 bits).
// nullptr when the host lacks AMX-TILE/AMX-BF16 or Linux refuses the tile state.
const LinearKernelSet* AmxLinearKernels();
// The AVX-512 BF16 set (linear_kernels_avx512_bf16.cc) runs amx-bf16 weights with VDPBF16PS on
// hosts without AMX (AMD Zen 4/5): the same bf16-rounded inputs, in one documented order per
// element that the tests hold bit for bit (batch invariant by construction). nullptr without
// AVX-512 F/BW/VL/BF16.
const LinearKernelSet* Avx512Bf16LinearKernels();
// The set CpuLinear picks for amx-bf16 weights: the AMX set, else the AVX-512 BF16 set, else
// nullptr (the engine refuses amx-bf16 then).
const LinearKernelSet* AmxBf16BestLinearKernels();
// The w8a8 sets (linear_kernels_w8a8.cc) run w8a8 weights only: each row of x quantized to int8
// in groups of 32 and integer dot products per group, scaled in one fixed fp32 order (batch
// invariant by construction; every set gives the scalar set's bits). CpuLinear picks the best
// one the host has for w8a8 weights; the scalar set is their reference in the tests. The VNNI
// set is nullptr without AVX-512 F/BW/VNNI, the AVX2 set without AVX2/FMA/F16C.
const LinearKernelSet& W8A8ScalarLinearKernels();
const LinearKernelSet* W8A8VnniLinearKernels();
const LinearKernelSet* W8A8Avx2LinearKernels();
// The VNNI set, else the AVX2 set, else nullptr (the engine refuses w8a8 then).
const LinearKernelSet* W8A8BestLinearKernels();
// The fastest set the host runs (avx512, then avx2, then scalar), unless $MORSERVE_CPU_KERNELS
// names one ("scalar", "avx2", "avx512"): a name the host cannot run is a fatal error that
// names it.
const LinearKernelSet& BestLinearKernels();

}  // namespace morserve
