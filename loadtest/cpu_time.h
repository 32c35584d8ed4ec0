// CPU time a process has used (user + system, its own threads; /proc/PID/stat fields 14
// and 15 in clock ticks), to charge a server or gateway its CPU per streamed token.
#pragma once

#include <sys/types.h>

#include "absl/status/statusor.h"

namespace morserve::loadtest {

absl::StatusOr<double> ProcessCpuSeconds(pid_t pid);

}  // namespace morserve::loadtest
