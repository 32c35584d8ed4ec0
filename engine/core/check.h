// Data-plane checks for the CPU kernels: a failed check is a programming error, so it prints
// the condition with file and line and aborts (no exceptions, no Status on the hot path).
#pragma once

#include <cstdio>
#include <cstdlib>

#define MORSERVE_CPU_CHECK(cond, msg)                                                        \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "%s:%d: check failed: %s: %s\n", __FILE__, __LINE__, #cond, msg); \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)
