// Test controls of the CPU cuBLASLt stand-in (kernels/emu/cublaslt_emu.cc), for tests that
// link it (the emulated runner's tests): situations a real cuBLASLt may present that the
// emulation does not on its own.
#pragma once

#include <cstdint>

namespace morserve::cublaslt_emu {

// From now on, problems whose op(A) has `rows` rows (a projection with `rows` outputs, in
// gemm.cuh's terms) get one algorithm per m: only algorithm 2 for n <= 8 columns, only
// algorithm 0 wider, so no algorithm is offered at every M bucket. With `others_run`,
// cublasLtMatmulAlgoCheck still accepts the other algorithms there (what an H200 shows: the
// heuristic's lists differ with m, the kernels run at every m), so LtGemm::Pin pins by the
// check; without it only the offered one runs, and Pin fails with CUBLAS_STATUS_NOT_SUPPORTED.
// 0 turns it off.
void SetNoCommonAlgorithmRows(int64_t rows, bool others_run);

}  // namespace morserve::cublaslt_emu
