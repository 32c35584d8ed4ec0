// ChildProcess (tests/child_process.h) on /bin/sh scripts: output capture from both streams,
// environment additions, log files, WaitForLine (match, groups, timeout, early end), exit
// codes and signal deaths, Signal, Terminate of a process that ignores SIGTERM (then
// SIGKILL), clear errors for programs that cannot start, and no process left behind.
#include "tests/child_process.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <thread>

#include "tests/testutil.h"

namespace morserve::testing {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool StartSh(ChildProcess* c, const std::string& script, std::vector<std::string> env = {}) {
  return c->Start(ChildOptions{{"/bin/sh", "-c", script}, std::move(env), ""});
}

// The state letter of /proc/PID/stat (R, S, T, Z, ...), or 0 when there is no such process.
char State(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return 0;
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : 0;
}

// True while `pid` is a live (not zombie) process.
bool Alive(pid_t pid) {
  const char s = State(pid);
  return s != 0 && s != 'Z';
}

// Polls until `pred(State(pid))` holds.
bool StateWithin(pid_t pid, const std::function<bool(char)>& pred, double seconds) {
  const auto start = Clock::now();
  while (SecondsSince(start) < seconds) {
    if (pred(State(pid))) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Polls until `pid` is gone (an orphan is reaped by whoever adopted it).
bool GoneWithin(pid_t pid, double seconds) {
  const auto start = Clock::now();
  while (SecondsSince(start) < seconds) {
    if (!Alive(pid)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST(ChildProcessTest, CapturesStdoutAndStderrInOrder) {
  ChildProcess c;
  ASSERT_TRUE(StartSh(&c, "echo out; echo err >&2; printf partial")) << c.error();
  EXPECT_EQ(c.Wait(30), 0);
  EXPECT_EQ(c.output(), "out\nerr\npartial");
  // The unterminated last line counts once the output ended.
  EXPECT_EQ(c.WaitForLine([](const std::string& l) { return l == "partial"; }, 5), "partial");
  EXPECT_FALSE(c.Running());
}

TEST(ChildProcessTest, KeepsLargeOutputWhole) {
  ChildProcess c;
  ASSERT_TRUE(StartSh(&c, "i=0; while [ $i -lt 20000 ]; do echo line-$i; i=$((i+1)); done"))
      << c.error();
  const auto last = c.WaitForLine(std::regex("^line-(19999)$"), 60);
  ASSERT_TRUE(last.has_value()) << c.output().size();
  EXPECT_EQ((*last)[1], "19999");
  EXPECT_EQ(c.Wait(30), 0);
  std::string want;
  for (int i = 0; i < 20000; ++i) want += "line-" + std::to_string(i) + "\n";
  EXPECT_EQ(c.output(), want);
}

TEST(ChildProcessTest, EnvironmentAdditionsAndStdinFromDevNull) {
  ChildProcess c;
  ASSERT_TRUE(StartSh(&c, "cat; echo \"[$MORSERVE_CHILD_TEST] [$HOME] [${PATH:+path}]\"",
                      {"MORSERVE_CHILD_TEST=hello world", "HOME=/nonexistent-home"}))
      << c.error();
  EXPECT_EQ(c.Wait(30), 0);  // cat reads EOF at once: stdin is /dev/null
  EXPECT_EQ(c.output(), "[hello world] [/nonexistent-home] [path]\n");
  ChildProcess bad;
  EXPECT_FALSE(bad.Start(ChildOptions{{"/bin/sh", "-c", "true"}, {"NO_EQUALS_SIGN"}, ""}));
  EXPECT_NE(bad.error().find("NO_EQUALS_SIGN"), std::string::npos) << bad.error();
}

TEST(ChildProcessTest, LogFileGetsTheSameOutput) {
  TempDir dir;
  ChildProcess c;
  ASSERT_TRUE(c.Start(ChildOptions{{"sh", "-c", "echo one; echo two >&2"}, {}, dir.File("log")}))
      << c.error();
  EXPECT_EQ(c.Wait(30), 0);
  EXPECT_EQ(c.output(), "one\ntwo\n");
  EXPECT_EQ(ReadFile(dir.File("log")), "one\ntwo\n");
  ChildProcess unwritable;
  EXPECT_FALSE(unwritable.Start(ChildOptions{{"/bin/true"}, {}, "/nonexistent-dir/log"}));
  EXPECT_NE(unwritable.error().find("/nonexistent-dir/log"), std::string::npos)
      << unwritable.error();
}

TEST(ChildProcessTest, WaitForLineMatchesGroupsAndTimesOut) {
  ChildProcess c;
  ASSERT_TRUE(StartSh(&c, "echo 'listening on 127.0.0.1:4567'; exec sleep 60")) << c.error();
  const auto port = c.WaitForLine(std::regex("listening on ([0-9.]+):([0-9]+)"), 30);
  ASSERT_TRUE(port.has_value()) << c.output();
  ASSERT_EQ(port->size(), 3u);
  EXPECT_EQ((*port)[0], "listening on 127.0.0.1:4567");
  EXPECT_EQ((*port)[1], "127.0.0.1");
  EXPECT_EQ((*port)[2], "4567");
  // A line that never comes: nullopt after the timeout, not before and not much later.
  const auto start = Clock::now();
  EXPECT_FALSE(c.WaitForLine(std::regex("never"), 0.5).has_value());
  EXPECT_GE(SecondsSince(start), 0.5);
  EXPECT_LT(SecondsSince(start), 5);
  EXPECT_TRUE(c.Running());
  EXPECT_FALSE(c.exit_status().has_value());
}

TEST(ChildProcessTest, WaitForLineEndsWhenTheOutputEnds) {
  ChildProcess c;
  ASSERT_TRUE(StartSh(&c, "echo only; exit 4")) << c.error();
  const auto start = Clock::now();
  EXPECT_FALSE(c.WaitForLine([](const std::string& l) { return l == "other"; }, 60).has_value());
  EXPECT_LT(SecondsSince(start), 10);
  EXPECT_EQ(c.Wait(30), 4);
}

TEST(ChildProcessTest, ExitCodesAndSignalDeaths) {
  for (const auto& [script, want] :
       std::vector<std::pair<std::string, int>>{{"exit 0", 0},
                                                {"exit 3", 3},
                                                {"exit 255", 255},
                                                {"kill -9 $$", 137},
                                                {"kill -TERM $$", 143}}) {
    SCOPED_TRACE(script);
    ChildProcess c;
    ASSERT_TRUE(StartSh(&c, script)) << c.error();
    EXPECT_EQ(c.Wait(30), want);
    EXPECT_EQ(c.exit_status(), want);
    EXPECT_FALSE(c.Running());
    EXPECT_EQ(c.Terminate(), want);  // already exited: its status, nothing signalled
  }
}

TEST(ChildProcessTest, SignalReachesTheChild) {
  ChildProcess c;
  ASSERT_TRUE(StartSh(&c,
                      "trap 'echo got usr1; exit 7' USR1; echo ready; "
                      "while :; do sleep 0.05; done"))
      << c.error();
  ASSERT_TRUE(c.WaitForLine(std::regex("^ready$"), 30)) << c.output();
  c.Signal(SIGUSR1);
  EXPECT_TRUE(c.WaitForLine(std::regex("^got usr1$"), 30)) << c.output();
  EXPECT_EQ(c.Wait(30), 7);
}

TEST(ChildProcessTest, SignalGoesToTheWholeProcessGroup) {
  ChildProcess c;
  ASSERT_TRUE(StartSh(&c, "sleep 60 & echo bg $!; wait")) << c.error();
  const auto bg = c.WaitForLine(std::regex("^bg ([0-9]+)$"), 30);
  ASSERT_TRUE(bg.has_value()) << c.output();
  const pid_t grandchild = std::stoi((*bg)[1]);
  const auto stopped = [](char s) { return s == 'T'; };
  const auto running = [](char s) { return s == 'S' || s == 'R'; };
  c.Signal(SIGSTOP);
  EXPECT_TRUE(StateWithin(grandchild, stopped, 10));
  EXPECT_TRUE(StateWithin(c.pid(), stopped, 10));
  c.Signal(SIGCONT);
  EXPECT_TRUE(StateWithin(grandchild, running, 10));
  EXPECT_TRUE(c.Running());
}

TEST(ChildProcessTest, TerminateStopsAWellBehavedProcess) {
  ChildProcess c;
  ASSERT_TRUE(StartSh(&c, "echo ready; exec sleep 60")) << c.error();
  ASSERT_TRUE(c.WaitForLine(std::regex("ready"), 30));
  EXPECT_EQ(c.Terminate(10), 128 + SIGTERM);
  EXPECT_EQ(c.exit_status(), 128 + SIGTERM);
}

TEST(ChildProcessTest, TerminateKillsAProcessThatIgnoresSigterm) {
  ChildProcess c;
  // The ignored SIGTERM is inherited by the sleeps too; the whole group must go.
  ASSERT_TRUE(StartSh(&c,
                      "trap '' TERM; sleep 60 & echo bg $!; echo ready; "
                      "while :; do sleep 0.05; done"))
      << c.error();
  const auto bg = c.WaitForLine(std::regex("^bg ([0-9]+)$"), 30);
  ASSERT_TRUE(bg.has_value()) << c.output();
  ASSERT_TRUE(c.WaitForLine(std::regex("^ready$"), 30));
  const pid_t grandchild = std::stoi((*bg)[1]);
  EXPECT_TRUE(Alive(grandchild));
  const auto start = Clock::now();
  EXPECT_EQ(c.Terminate(0.5), -1);  // not gone within the timeout: killed
  EXPECT_GE(SecondsSince(start), 0.5);
  EXPECT_LT(SecondsSince(start), 10);
  EXPECT_EQ(c.exit_status(), 128 + SIGKILL);
  EXPECT_FALSE(c.Running());
  EXPECT_TRUE(GoneWithin(grandchild, 10));
}

TEST(ChildProcessTest, DestructorLeavesNoProcessBehind) {
  pid_t child = -1, grandchild = -1;
  const auto start = Clock::now();
  {
    ChildProcess c;
    ASSERT_TRUE(StartSh(&c, "trap '' TERM; sleep 60 & echo bg $!; exec sleep 60")) << c.error();
    const auto bg = c.WaitForLine(std::regex("^bg ([0-9]+)$"), 30);
    ASSERT_TRUE(bg.has_value()) << c.output();
    grandchild = std::stoi((*bg)[1]);
    child = c.pid();
    EXPECT_TRUE(Alive(child));
  }
  EXPECT_LT(SecondsSince(start), 15);
  EXPECT_FALSE(Alive(child));  // reaped by the destructor, not even a zombie
  EXPECT_TRUE(GoneWithin(grandchild, 10));
}

TEST(ChildProcessTest, WhatAChildLeftInItsGroupIsKilledWhenItExits) {
  ChildProcess c;
  ASSERT_TRUE(StartSh(&c, "sleep 60 & echo bg $!; exit 0")) << c.error();
  const auto bg = c.WaitForLine(std::regex("^bg ([0-9]+)$"), 30);
  ASSERT_TRUE(bg.has_value()) << c.output();
  // The background sleep holds the output pipe; the exit still comes back promptly.
  const auto start = Clock::now();
  EXPECT_EQ(c.Wait(30), 0);
  EXPECT_LT(SecondsSince(start), 10);
  EXPECT_TRUE(GoneWithin(std::stoi((*bg)[1]), 10));
}

TEST(ChildProcessTest, ProgramsThatCannotStartAreClearErrors) {
  TempDir dir;
  ChildProcess missing;
  EXPECT_FALSE(missing.Start({"/nonexistent/program", "x"}));
  EXPECT_NE(missing.error().find("/nonexistent/program"), std::string::npos) << missing.error();
  EXPECT_FALSE(missing.Running());
  EXPECT_EQ(missing.Terminate(), -1);
  ChildProcess not_on_path;
  EXPECT_FALSE(not_on_path.Start({"morserve-no-such-program"}));
  EXPECT_NE(not_on_path.error().find("morserve-no-such-program on $PATH"), std::string::npos)
      << not_on_path.error();
  // Executable bits but no valid format: execve itself fails, reported with its reason.
  WriteFile(dir.File("garbage"), std::string("\x01\x02\x03\x04 not a program"));
  ASSERT_EQ(chmod(dir.File("garbage").c_str(), 0755), 0);
  ChildProcess garbage;
  EXPECT_FALSE(garbage.Start({dir.File("garbage")}));
  EXPECT_NE(garbage.error().find("cannot run " + dir.File("garbage") + ": "), std::string::npos)
      << garbage.error();
  ChildProcess empty;
  EXPECT_FALSE(empty.Start(std::vector<std::string>{}));
  EXPECT_EQ(empty.error(), "empty argv");
  ChildProcess twice;
  ASSERT_TRUE(twice.Start({"/bin/true"})) << twice.error();
  EXPECT_FALSE(twice.Start({"/bin/true"}));
  EXPECT_EQ(twice.error(), "already started");
  EXPECT_EQ(twice.Wait(30), 0);
}

}  // namespace
}  // namespace morserve::testing
