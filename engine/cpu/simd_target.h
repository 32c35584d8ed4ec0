// Compiles a region of a file for an instruction-set extension, with GCC or clang (the
// fuzz and sanitizer tree builds with clang, which ignores `#pragma GCC target`):
//
//   MORSERVE_BEGIN_TARGET("avx2,fma")
//   ... functions that use the extension; the caller dispatches at run time ...
//   MORSERVE_END_TARGET
//
// Include <immintrin.h> and every other header before the region.
#pragma once

#define MORSERVE_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define MORSERVE_BEGIN_TARGET(features) \
  MORSERVE_PRAGMA(clang attribute push(__attribute__((target(features))), apply_to = function))
#define MORSERVE_END_TARGET MORSERVE_PRAGMA(clang attribute pop)
#else
#define MORSERVE_BEGIN_TARGET(features) \
  MORSERVE_PRAGMA(GCC push_options) MORSERVE_PRAGMA(GCC target(features))
#define MORSERVE_END_TARGET MORSERVE_PRAGMA(GCC pop_options)
#endif
