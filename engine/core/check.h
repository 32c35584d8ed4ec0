// Data-plane checks: a failed check is a programming error (a broken invariant, never bad
// user input, which is an absl::Status at the edge), so it prints the condition with file
// and line and aborts. No exceptions, no Status on the hot path.
#pragma once

#include <cstdio>
#include <cstdlib>

#define MORSERVE_CHECK(cond, msg)                                                            \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "%s:%d: check failed: %s: %s\n", __FILE__, __LINE__, #cond, msg); \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)
