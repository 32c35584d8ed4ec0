// The device helpers a kernel body (*_kernels.cuh) uses: kernels/common.cuh under nvcc. Under
// the CPU emulator (MORSERVE_CUDA_EMU) tests/gpu/cuda_emu.h, included first, defines the same
// names, so nothing more is included. Kernel bodies include this instead of common.cuh.
#pragma once

#ifndef MORSERVE_CUDA_EMU
#include "kernels/common.cuh"
#endif
