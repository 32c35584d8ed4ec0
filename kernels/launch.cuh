// One kernel launch form for the launchers in kernels/*.cu:
//   MORSERVE_LAUNCH(grid, block, smem, stream, Kernel<T...>)(args...);
// Under nvcc it is exactly `Kernel<T...><<<grid, block, smem, stream>>>(args...)`. Compiled as
// C++ with the CPU emulator (kernels/emu/cuda_emu.h included first, MORSERVE_CUDA_EMU), it runs
// the grid on the emulator, synchronously, with the launch limits a GPU checks: that is how the
// emulated CUDA model runner (morserve_cuda_runner_emu) runs every launcher and kernel without
// a GPU. The kernel comes last so template arguments with commas need no parentheses.
#pragma once

#ifdef MORSERVE_CUDA_EMU
#define MORSERVE_LAUNCH(grid, block, smem, stream, ...)                                    \
  ::cuda_emu::MakeLauncher(grid, block, smem, stream, [](auto&&... morserve_launch_args) { \
    __VA_ARGS__(morserve_launch_args...);                                                  \
  })
#else
#define MORSERVE_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#endif
