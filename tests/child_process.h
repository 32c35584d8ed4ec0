// A child process for tests: argv (+ environment additions) started in its own process group
// with stdin from /dev/null and stdout+stderr on one pipe, drained by a background thread that
// keeps all output (for failure messages) and optionally copies it to a log file. Waits for an
// output line, signals, terminates or kills with bounded waits, reports the exit status, and
// its destructor kills and reaps the whole group, so a failing test leaves no process behind.
// The child also gets SIGKILL if the thread that started it dies (PR_SET_PDEATHSIG), which
// covers a test binary killed by a ctest timeout: start children from a thread that outlives
// them (the test's own thread, not a short-lived helper thread).
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace morserve::testing {

struct ChildOptions {
  std::vector<std::string> argv;  // argv[0]: a path, or a name looked up on $PATH
  std::vector<std::string> env;   // "NAME=VALUE" added to (or replacing in) the test's environment
  std::string log_file;           // when set, the output is also written there as it arrives
};

class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess();  // kills the group, reaps the child, joins the reader
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Starts the process; false with error() set when it cannot (no such program, bad log
  // file, already started). A program that starts and then fails shows in exit_status().
  bool Start(const ChildOptions& options);
  bool Start(const std::vector<std::string>& argv) { return Start(ChildOptions{argv, {}, ""}); }
  const std::string& error() const { return error_; }

  // The first output line (from the start; the unterminated last line counts once the output
  // ended) for which `match` is true, waiting up to `timeout_s`; nullopt on timeout or when
  // the output ended without one.
  std::optional<std::string> WaitForLine(const std::function<bool(const std::string&)>& match,
                                         double timeout_s);
  // The same with std::regex_search: the groups of the first match, [0] the whole match.
  std::optional<std::vector<std::string>> WaitForLine(const std::regex& re, double timeout_s);

  // Sends `sig` to the child's process group (nothing once it was reaped).
  void Signal(int sig);
  // Waits up to `timeout_s` for the exit; its status, or nullopt if it is still running.
  std::optional<int> Wait(double timeout_s);
  // SIGTERM, then waits up to `timeout_s`: the exit status, or -1 when it had to be killed.
  int Terminate(double timeout_s = 30);
  // SIGKILL to the group and waits: the exit status (137 unless it had already exited).
  int Kill();
  bool Running();  // started and not yet exited

  // Exit code, or 128 + signal number when a signal ended it; nullopt while running.
  std::optional<int> exit_status();
  pid_t pid() const { return pid_; }  // stays set after the exit (-1 before Start)
  std::string output();               // everything written so far

 private:
  bool Reap(bool block);  // true once the child was reaped (status_ set)
  void ReadLoop(int fd, int log_fd);
  void StopReader();

  pid_t pid_ = -1;
  std::optional<int> status_;
  std::string error_;
  std::mutex reap_mu_;  // one waitpid at a time
  std::thread reader_;
  std::mutex mu_;  // guards output_, eof_, stop_
  std::condition_variable cv_;
  std::string output_;
  bool eof_ = false;
  bool stop_ = false;
};

// "Threads:" of /proc/PID/status (a process's thread count), or -1.
int ThreadCount(pid_t pid);

}  // namespace morserve::testing
