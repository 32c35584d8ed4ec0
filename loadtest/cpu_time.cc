// /proc/PID/stat reading (see cpu_time.h).
#include "loadtest/cpu_time.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace morserve::loadtest {

absl::StatusOr<double> ProcessCpuSeconds(pid_t pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/stat");
  std::ifstream in(path);
  std::string stat;
  if (!in || !std::getline(in, stat))
    return absl::NotFoundError(absl::StrCat(path, ": no such process"));
  // The command name (field 2) is in parentheses and may hold spaces: count after the last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos)
    return absl::InternalError(absl::StrCat(path, ": unexpected format"));
  std::istringstream fields(stat.substr(close + 2));
  std::string f;
  long long utime = -1, stime = -1;
  // Field 3 is the first after ')'; utime is field 14, stime 15.
  for (int field = 3; field <= 15 && fields >> f; ++field) {
    if (field == 14) utime = std::stoll(f);
    if (field == 15) stime = std::stoll(f);
  }
  if (utime < 0 || stime < 0) return absl::InternalError(absl::StrCat(path, ": too few fields"));
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace morserve::loadtest
