// Test child processes (see child_process.h). Everything the child needs (argv, envp, file
// descriptors) is prepared before fork(), so the child only makes async-signal-safe calls
// before execve, as required in a multi-threaded test (gRPC threads).
#include "tests/child_process.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>

extern char** environ;

namespace morserve::testing {
namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point Deadline(double timeout_s) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
}

// argv[0] as a path execve accepts: as given when it names a directory, else the first
// executable of that name on $PATH ("" when there is none).
std::string ResolveProgram(const std::string& name) {
  if (name.find('/') != std::string::npos) return access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = end > start ? dirs.substr(start, end - start) : ".";
    const std::string candidate = dir + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

// The test's environment with `extra` ("NAME=VALUE") added or replacing entries of that name.
std::vector<std::string> MergedEnvironment(const std::vector<std::string>& extra) {
  std::set<std::string> replaced;
  for (const std::string& e : extra) replaced.insert(e.substr(0, e.find('=')));
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry(*e);
    if (!replaced.count(entry.substr(0, entry.find('=')))) env.push_back(entry);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

std::vector<char*> CStrings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (const std::string& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

int DecodeStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

void WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// In the forked child: own process group, default signal handling, stdio, exec. On failure
// the exec errno goes to `err_fd` (close-on-exec, so the parent reads EOF on success).
[[noreturn]] void ExecChild(const char* path, char* const* argv, char* const* envp, pid_t parent,
                            int stdin_fd, int out_fd, int err_fd) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the parent died before the line above
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) sigaction(sig, &dfl, nullptr);
  if (dup2(stdin_fd, STDIN_FILENO) < 0 || dup2(out_fd, STDOUT_FILENO) < 0 ||
      dup2(out_fd, STDERR_FILENO) < 0) {
    const int e = errno;
    WriteAll(err_fd, reinterpret_cast<const char*>(&e), sizeof e);
    _exit(127);
  }
  execve(path, argv, envp);
  const int e = errno;
  WriteAll(err_fd, reinterpret_cast<const char*>(&e), sizeof e);
  _exit(127);
}

}  // namespace

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !Reap(false)) {
    Kill();
    if (!status_) Reap(true);
  }
  StopReader();
}

bool ChildProcess::Start(const ChildOptions& options) {
  if (pid_ > 0) {
    error_ = "already started";
    return false;
  }
  if (options.argv.empty()) {
    error_ = "empty argv";
    return false;
  }
  for (const std::string& e : options.env) {
    if (e.find('=') == std::string::npos || e[0] == '=') {
      error_ = "environment entry is not NAME=VALUE: " + e;
      return false;
    }
  }
  const std::string path = ResolveProgram(options.argv[0]);
  if (path.empty()) {
    error_ = "no executable " + options.argv[0] +
             (options.argv[0].find('/') == std::string::npos ? " on $PATH" : "");
    return false;
  }
  int log_fd = -1;
  if (!options.log_file.empty()) {
    log_fd = open(options.log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      error_ = "cannot write " + options.log_file + ": " + std::strerror(errno);
      return false;
    }
  }
  const std::vector<std::string> env = MergedEnvironment(options.env);
  std::vector<char*> argv = CStrings(options.argv);
  std::vector<char*> envp = CStrings(env);
  int out[2], err[2];
  const int stdin_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (stdin_fd < 0 || pipe2(out, O_CLOEXEC) != 0) {
    error_ = std::string("pipe: ") + std::strerror(errno);
    if (stdin_fd >= 0) close(stdin_fd);
    if (log_fd >= 0) close(log_fd);
    return false;
  }
  if (pipe2(err, O_CLOEXEC) != 0) {
    error_ = std::string("pipe: ") + std::strerror(errno);
    for (int fd : {stdin_fd, out[0], out[1], log_fd}) {
      if (fd >= 0) close(fd);
    }
    return false;
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) ExecChild(path.c_str(), argv.data(), envp.data(), parent, stdin_fd, out[1], err[1]);
  close(stdin_fd);
  close(out[1]);
  close(err[1]);
  if (pid < 0) {
    error_ = std::string("fork: ") + std::strerror(errno);
    for (int fd : {out[0], err[0], log_fd}) {
      if (fd >= 0) close(fd);
    }
    return false;
  }
  setpgid(pid, pid);  // also here, so a signal to the group cannot race the child's own call
  int exec_errno = 0;
  ssize_t n;
  do {
    n = read(err[0], &exec_errno, sizeof exec_errno);
  } while (n < 0 && errno == EINTR);
  close(err[0]);
  if (n == static_cast<ssize_t>(sizeof exec_errno)) {
    error_ = "cannot run " + path + ": " + std::strerror(exec_errno);
    waitpid(pid, nullptr, 0);
    close(out[0]);
    if (log_fd >= 0) close(log_fd);
    return false;
  }
  pid_ = pid;
  reader_ = std::thread([this, fd = out[0], log_fd] { ReadLoop(fd, log_fd); });
  return true;
}

void ChildProcess::ReadLoop(int fd, int log_fd) {
  char buf[8192];
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) break;
    }
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, 100);
    if (r < 0 && errno != EINTR) break;
    if (r <= 0) continue;
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) break;
    if (log_fd >= 0) WriteAll(log_fd, buf, static_cast<size_t>(n));
    std::lock_guard<std::mutex> lock(mu_);
    output_.append(buf, static_cast<size_t>(n));
    cv_.notify_all();
  }
  close(fd);
  if (log_fd >= 0) close(log_fd);
  std::lock_guard<std::mutex> lock(mu_);
  eof_ = true;
  cv_.notify_all();
}

void ChildProcess::StopReader() {
  if (!reader_.joinable()) return;
  {
    std::unique_lock<std::mutex> lock(mu_);
    // A process outside the group may still hold the pipe: wait a little, then stop reading.
    cv_.wait_for(lock, std::chrono::seconds(2), [&] { return eof_; });
    stop_ = true;
  }
  reader_.join();
}

bool ChildProcess::Reap(bool block) {
  {
    std::lock_guard<std::mutex> lock(reap_mu_);
    if (status_) return true;
    if (pid_ <= 0) return false;
    // Look without reaping first: while the exited child is a zombie its pid (= the group's
    // id) cannot be reused, so what is left of its group can be killed safely.
    siginfo_t info;
    std::memset(&info, 0, sizeof info);
    int r;
    do {
      r = waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOWAIT | (block ? 0 : WNOHANG));
    } while (r < 0 && errno == EINTR);
    if (r < 0 || info.si_pid == 0) return false;
    kill(-pid_, SIGKILL);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    status_ = DecodeStatus(status);
  }
  // Once it exited, output() should hold everything it wrote: give the reader a moment.
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::seconds(2), [&] { return eof_; });
  return true;
}

void ChildProcess::Signal(int sig) {
  std::lock_guard<std::mutex> lock(reap_mu_);
  if (pid_ > 0 && !status_) kill(-pid_, sig);
}

std::optional<int> ChildProcess::Wait(double timeout_s) {
  const auto end = Deadline(timeout_s);
  for (;;) {
    if (Reap(false)) return status_;
    if (pid_ <= 0 || Clock::now() >= end) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int ChildProcess::Terminate(double timeout_s) {
  if (pid_ <= 0) return -1;
  if (Reap(false)) return *status_;
  Signal(SIGTERM);
  if (std::optional<int> status = Wait(timeout_s)) return *status;
  Kill();
  return -1;
}

int ChildProcess::Kill() {
  if (pid_ <= 0) return -1;
  Signal(SIGKILL);
  const std::optional<int> status = Wait(10);
  return status.value_or(-1);
}

bool ChildProcess::Running() { return pid_ > 0 && !Reap(false); }

std::optional<int> ChildProcess::exit_status() {
  Reap(false);
  return status_;
}

std::string ChildProcess::output() {
  std::lock_guard<std::mutex> lock(mu_);
  return output_;
}

std::optional<std::string> ChildProcess::WaitForLine(
    const std::function<bool(const std::string&)>& match, double timeout_s) {
  const auto end = Deadline(timeout_s);
  size_t scanned = 0;  // offset of the first line not yet offered to `match`
  for (;;) {
    std::string text;
    bool eof;
    {
      std::unique_lock<std::mutex> lock(mu_);
      text = output_.substr(scanned);
      eof = eof_;
    }
    size_t start = 0;
    for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string line = text.substr(start, nl - start);
      if (match(line)) return line;
    }
    if (eof) {
      if (start < text.size() && match(text.substr(start))) return text.substr(start);
      return std::nullopt;
    }
    scanned += start;
    std::unique_lock<std::mutex> lock(mu_);
    const size_t seen = scanned + (text.size() - start);
    if (!cv_.wait_until(lock, end, [&] { return output_.size() > seen || eof_; })) {
      return std::nullopt;
    }
  }
}

std::optional<std::vector<std::string>> ChildProcess::WaitForLine(const std::regex& re,
                                                                  double timeout_s) {
  std::vector<std::string> groups;
  const auto line = WaitForLine(
      [&](const std::string& l) {
        std::smatch m;
        if (!std::regex_search(l, m, re)) return false;
        for (const auto& g : m) groups.push_back(g.str());
        return true;
      },
      timeout_s);
  if (!line) return std::nullopt;
  return groups;
}

int ThreadCount(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

}  // namespace morserve::testing
