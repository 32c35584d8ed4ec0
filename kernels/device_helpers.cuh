// The device helpers a kernel body (*_kernels.cuh) uses: kernels/common.cuh under nvcc. Under
// the CPU emulator (MORSERVE_CUDA_EMU) kernels/emu/cuda_emu.h, included first, defines the same
// device names; common.cuh's device part is nvcc-only, and its host part (GridStrideBlocks, for
// the launchers) serves both. Kernel bodies include this instead of common.cuh.
#pragma once

#include "kernels/common.cuh"
