// deploy/docker/Dockerfile without a Docker engine: the builder stage runs ./test.sh's build
// commands in order (so CI, which runs test.sh, exercises the container build); the server
// and gateway images run as a numeric non-root user with a health check, on
// debian:bookworm-slim; COPY sources exist; and the runtime stage's package list provides
// the Debian package of every shared library `ldd` shows for the built binaries (closure
// over dpkg's Depends, the slim base counted as the Essential set plus apt), and lists
// nothing they do not need; the GPU runtime carries the cuBLASLt the CUDA runner dlopens.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "tests/deploy/deploy_testutil.h"

namespace morserve::testing {
namespace {

namespace fs = std::filesystem;

// Logical lines of a shell script or Dockerfile: continuations joined, comments and blank
// lines dropped, whitespace collapsed.
std::vector<std::string> LogicalLines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line, current;
  while (std::getline(in, line)) {
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    const bool continued = !line.empty() && line.back() == '\\';
    current += " " + (continued ? line.substr(0, line.size() - 1) : line);
    if (!continued) {
      out.push_back(std::regex_replace(current, std::regex("^\\s+|\\s+$"), ""));
      out.back() = std::regex_replace(out.back(), std::regex("\\s+"), " ");
      current.clear();
    }
  }
  return out;
}

struct Stage {
  std::string base, name;
  std::vector<std::pair<std::string, std::string>> instructions;  // (INSTRUCTION, rest)
};

std::vector<Stage> ParseDockerfile(const std::string& path) {
  std::vector<Stage> stages;
  for (const std::string& l : LogicalLines(ReadTextFile(path))) {
    const size_t sp = l.find(' ');
    const std::string ins = l.substr(0, sp), rest = sp == std::string::npos ? "" : l.substr(sp + 1);
    if (ins == "FROM") {
      std::smatch m;
      std::regex_match(rest, m, std::regex("(\\S+)(?: AS (\\S+))?"));
      stages.push_back({m[1], m[2], {}});
    } else if (!stages.empty()) {
      stages.back().instructions.push_back({ins, rest});
    }
  }
  return stages;
}

const Stage* FindStage(const std::vector<Stage>& stages, const std::string& name) {
  for (const Stage& s : stages) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

// The stages a stage builds on, itself first (FROM ${VARIANT}-style bases resolved to every
// variant, so "runtime-${VARIANT}" gives both runtime-cpu and runtime-gpu chains).
void StageChain(const std::vector<Stage>& stages, const std::string& name,
                std::vector<const Stage*>* out) {
  const Stage* s = FindStage(stages, name);
  if (!s) return;
  out->push_back(s);
  const size_t var = s->base.find("${VARIANT}");
  if (var == std::string::npos) {
    StageChain(stages, s->base, out);
  } else {
    for (const char* v : {"cpu", "gpu"}) {
      StageChain(stages, s->base.substr(0, var) + v + s->base.substr(var + 10), out);
    }
  }
}

const std::string kDockerfile = "deploy/docker/Dockerfile";

TEST(DeployDockerfileTest, BuilderRunsTheBuildCommandsOfTestSh) {
  // test.sh's commands before ctest, without the shell setup and the timer.
  std::vector<std::string> expected;
  for (const std::string& l : LogicalLines(ReadTextFile(RepoPath("test.sh")))) {
    if (l.rfind("ctest", 0) == 0) break;
    if (l.rfind("set ", 0) == 0 || l.rfind("cd ", 0) == 0 || l.rfind("start=", 0) == 0) continue;
    expected.push_back(l);
  }
  ASSERT_GE(expected.size(), 3u);
  EXPECT_EQ(expected[expected.size() - 3], "scripts/install_deps.sh");
  // The builder's RUN commands, split at &&.
  const auto stages = ParseDockerfile(RepoPath(kDockerfile));
  std::vector<const Stage*> chain;
  StageChain(stages, "builder", &chain);
  ASSERT_FALSE(chain.empty());
  std::vector<std::string> commands;
  for (const auto& [ins, rest] : chain[0]->instructions) {
    if (ins != "RUN") continue;
    size_t b = 0;
    for (size_t e; (e = rest.find(" && ", b)) != std::string::npos; b = e + 4) {
      commands.push_back(rest.substr(b, e - b));
    }
    commands.push_back(rest.substr(b));
  }
  size_t next = 0;
  for (const std::string& c : commands) {
    if (next < expected.size() && c == expected[next]) ++next;
  }
  EXPECT_EQ(next, expected.size())
      << "the builder stage of " << kDockerfile << " does not run, in order, test.sh's line: "
      << (next < expected.size() ? expected[next] : "");
  // The variants set what test.sh reads from the environment.
  const auto env_of = [&](const char* stage) {
    std::string env;
    for (const auto& [ins, rest] : FindStage(stages, stage)->instructions) {
      if (ins == "ENV") env += rest + " ";
    }
    return env;
  };
  EXPECT_NE(env_of("builder-cpu").find("MORSERVE_CUDA=OFF"), std::string::npos);
  EXPECT_NE(env_of("builder-gpu").find("MORSERVE_CUDA=ON"), std::string::npos);
}

TEST(DeployDockerfileTest, ImagesRunAsNonRootWithAHealthCheck) {
  const auto stages = ParseDockerfile(RepoPath(kDockerfile));
  EXPECT_EQ(stages.back().name, "server") << "the default target is the server";
  for (const char* target : {"server", "gateway"}) {
    const Stage* s = FindStage(stages, target);
    ASSERT_NE(s, nullptr) << target;
    std::map<std::string, std::string> last;
    for (const auto& [ins, rest] : s->instructions) last[ins] = rest;
    EXPECT_TRUE(std::regex_match(last["USER"], std::regex("[1-9][0-9]*:[1-9][0-9]*")))
        << target << ": USER must be a numeric non-root uid:gid (Kubernetes runAsNonRoot), got "
        << last["USER"];
    EXPECT_NE(last["HEALTHCHECK"].find("CMD"), std::string::npos) << target;
    EXPECT_FALSE(last["ENTRYPOINT"].empty()) << target;
    // Runtime chains end on debian:bookworm-slim: no compilers, no headers.
    std::vector<const Stage*> chain;
    StageChain(stages, target, &chain);
    for (const Stage* c : chain) {
      if (!FindStage(stages, c->base) && c->base.find("${") == std::string::npos) {
        EXPECT_EQ(c->base, "debian:bookworm-slim") << target << " via " << c->name;
      }
    }
  }
  // The server's health check is the gRPC one, and the gateway's is GET /health.
  std::string server_hc, gateway_hc;
  for (const auto& [ins, rest] : FindStage(stages, "server")->instructions) {
    if (ins == "HEALTHCHECK") server_hc = rest;
  }
  for (const auto& [ins, rest] : FindStage(stages, "gateway")->instructions) {
    if (ins == "HEALTHCHECK") gateway_hc = rest;
  }
  EXPECT_NE(server_hc.find("morserve-grpc-health"), std::string::npos);
  EXPECT_NE(gateway_hc.find("/health"), std::string::npos);
  // COPY sources outside other stages exist in the repository.
  for (const Stage& s : stages) {
    for (const auto& [ins, rest] : s.instructions) {
      if (ins != "COPY" || rest.find("--from=") != std::string::npos) continue;
      const std::string src = rest.substr(0, rest.find(' '));
      if (src != ".") EXPECT_TRUE(fs::exists(RepoPath(src))) << "COPY " << rest;
    }
  }
}

// dpkg's database of installed packages (no network, no apt lists): name -> the package
// names its Depends and Pre-Depends mention (every alternative), and the Essential set.
struct Dpkg {
  std::map<std::string, std::vector<std::string>> depends;
  std::vector<std::string> essential;
};

Dpkg ReadDpkg() {
  Dpkg d;
  std::stringstream in(
      RunShell("dpkg-query -W -f='${Package}\\t${Essential}\\t${Depends}, ${Pre-Depends}\\n'").out);
  const std::regex name("([a-z0-9][a-z0-9+.-]+)");
  for (std::string line; std::getline(in, line);) {
    const size_t t1 = line.find('\t'), t2 = line.find('\t', t1 + 1);
    if (t2 == std::string::npos) continue;
    const std::string pkg = line.substr(0, t1);
    if (line.substr(t1 + 1, t2 - t1 - 1) == "yes") d.essential.push_back(pkg);
    std::stringstream deps(line.substr(t2 + 1));
    for (std::string clause; std::getline(deps, clause, ',');) {
      std::stringstream alts(clause);
      for (std::string alt; std::getline(alts, alt, '|');) {
        std::smatch m;
        if (std::regex_search(alt, m, name)) d.depends[pkg].push_back(m[1]);
      }
    }
  }
  return d;
}

std::set<std::string> DependencyClosure(const Dpkg& dpkg, std::vector<std::string> todo) {
  std::set<std::string> seen;
  while (!todo.empty()) {
    const std::string p = todo.back();
    todo.pop_back();
    if (!seen.insert(p).second) continue;
    auto it = dpkg.depends.find(p);
    if (it != dpkg.depends.end()) todo.insert(todo.end(), it->second.begin(), it->second.end());
  }
  return seen;
}

// The Debian packages owning the shared libraries `binary` loads (CUDA's excepted).
std::set<std::string> PackagesOfSharedLibraries(const std::string& binary) {
  const ShellResult ldd = RunShell("ldd " + ShellQuote(binary));
  EXPECT_EQ(ldd.rc, 0) << ldd.err;
  std::vector<std::string> libs;
  std::string candidates;
  std::smatch m;
  std::string text = ldd.out;
  while (std::regex_search(text, m, std::regex("=> (/\\S+)"))) {
    const std::string lib = m[1];
    text = m.suffix();
    if (lib.rfind("/usr/local/cuda", 0) == 0) continue;  // NVIDIA's packages, GPU variant only
    libs.push_back(lib);
    // dpkg records a file under the path its package ships (/lib or /usr/lib, merged /usr).
    for (const std::string& path : {lib, fs::weakly_canonical(lib).string()}) {
      for (const std::string& p :
           {path, std::regex_replace(path, std::regex("^/usr/lib/"), "/lib/"),
            std::regex_replace(path, std::regex("^/lib/"), "/usr/lib/")}) {
        candidates += " " + ShellQuote(p);
      }
    }
  }
  std::map<std::string, std::string> owner;  // path -> package
  std::stringstream out(RunShell("dpkg-query -S" + candidates + " 2>/dev/null").out);
  for (std::string line; std::getline(out, line);) {
    const size_t sep = line.find(": ");
    if (sep == std::string::npos) continue;
    const std::string pkg = line.substr(0, line.find(':'));
    owner[line.substr(sep + 2)] = pkg;
  }
  std::set<std::string> pkgs;
  for (const std::string& lib : libs) {
    std::string found;
    for (const std::string& path : {lib, fs::weakly_canonical(lib).string()}) {
      for (const std::string& p :
           {path, std::regex_replace(path, std::regex("^/usr/lib/"), "/lib/"),
            std::regex_replace(path, std::regex("^/lib/"), "/usr/lib/")}) {
        if (found.empty() && owner.count(p)) found = owner[p];
      }
    }
    EXPECT_FALSE(found.empty()) << binary << " loads " << lib << ", which no Debian package owns";
    if (!found.empty()) pkgs.insert(found);
  }
  return pkgs;
}

TEST(DeployDockerfileTest, RuntimePackagesProvideEveryLibraryTheBinariesLoad) {
  const auto stages = ParseDockerfile(RepoPath(kDockerfile));
  const Stage* runtime = FindStage(stages, "runtime-cpu");
  ASSERT_NE(runtime, nullptr);
  std::vector<std::string> listed;
  for (const auto& [ins, rest] : runtime->instructions) {
    const size_t at = rest.find("apt-get install");
    if (ins != "RUN" || at == std::string::npos) continue;
    std::stringstream words(rest.substr(at + 15, rest.find("&&", at) - at - 15));
    for (std::string w; words >> w;) {
      if (w[0] != '-') listed.push_back(w);
    }
  }
  ASSERT_GE(listed.size(), 5u);
  // Every listed package is a real bookworm package (installed here as a dependency of the
  // -dev packages install_deps.sh brings, or known to apt).
  for (const std::string& p : listed) {
    const bool installed =
        RunShell("dpkg-query -W -f='${Status}' " + ShellQuote(p)).out == "install ok installed";
    const bool known =
        installed || RunShell("apt-cache show --no-all-versions " + ShellQuote(p)).rc == 0;
    EXPECT_TRUE(known) << "runtime package " << p << " is not a Debian bookworm package";
  }
  // What debian:bookworm-slim has: the Essential packages and apt, with their dependencies.
  const Dpkg dpkg = ReadDpkg();
  std::vector<std::string> base = dpkg.essential;
  base.push_back("apt");
  std::vector<std::string> image = base;
  image.insert(image.end(), listed.begin(), listed.end());
  const std::set<std::string> in_image = DependencyClosure(dpkg, image);
  const std::set<std::string> in_base = DependencyClosure(dpkg, base);
  std::map<std::string, std::set<std::string>> needs;
  for (const std::string& binary :
       {std::string(MORSERVE_BINARY), std::string(MORSERVE_GATEWAY_BINARY)}) {
    if (!fs::exists(binary)) {
      ADD_FAILURE() << binary << " is not built";
      continue;
    }
    needs[binary] = PackagesOfSharedLibraries(binary);
    for (const std::string& p : needs[binary]) {
      EXPECT_TRUE(in_image.count(p)) << fs::path(binary).filename() << " needs package " << p
                                     << ", which the runtime image does not install";
    }
  }
  // And the list carries no package that nothing needs beyond the base (curl and
  // ca-certificates serve the health checks).
  std::set<std::string> needed;
  for (const auto& [binary, pkgs] : needs) needed.insert(pkgs.begin(), pkgs.end());
  for (const std::string& p : listed) {
    if (p == "curl" || p == "ca-certificates") continue;
    EXPECT_TRUE(needed.count(p) || in_base.count(p))
        << "runtime package " << p << " provides no library the binaries load";
  }
}

// The CUDA runner loads libcublasLt.so.<major> with dlopen (engine/cuda/cublaslt_loader.cc),
// so `ldd` cannot show it: the GPU runtime must install it by name, where the loader looks,
// and for the CUDA major the builder compiles against.
TEST(DeployDockerfileTest, GpuRuntimeHasTheCublasLtTheCudaRunnerLoads) {
  const auto stages = ParseDockerfile(RepoPath(kDockerfile));
  const auto all_of = [&](const char* stage, const char* instruction) {
    std::string text;
    const Stage* s = FindStage(stages, stage);
    if (s == nullptr) return text;
    for (const auto& [ins, rest] : s->instructions) {
      if (ins == instruction) text += rest + " ";
    }
    return text;
  };
  EXPECT_NE(all_of("builder-gpu", "RUN").find("libcublas-dev-${CUDA_PKG}"), std::string::npos);
  const std::string run = all_of("runtime-gpu", "RUN");
  EXPECT_NE(run.find("cuda-cudart-${CUDA_PKG}"), std::string::npos) << run;
  EXPECT_NE(run.find("libcublas-${CUDA_PKG}"), std::string::npos) << run;
  EXPECT_NE(all_of("runtime-gpu", "ENV").find("LD_LIBRARY_PATH=/usr/local/cuda/lib64"),
            std::string::npos);
  // ARG CUDA_PKG=13-0 (before the first FROM) -> CUDA 13.
  std::smatch m;
  const std::string text = ReadTextFile(RepoPath(kDockerfile));
  ASSERT_TRUE(std::regex_search(text, m, std::regex("ARG CUDA_PKG=(\\d+)-\\d+")));
  const std::string major = m[1];
  // A CUDA build of `morserve` (libcudart linked) names the cuBLASLt it will open.
  if (RunShell("ldd " + ShellQuote(MORSERVE_BINARY) + " | grep -q libcudart").rc != 0) {
    GTEST_SKIP() << "morserve is a CPU build: the soname check needs MORSERVE_CUDA=ON";
  }
  const ShellResult soname = RunShell("strings -a " + ShellQuote(MORSERVE_BINARY) +
                                      " | grep -x 'libcublasLt[.]so[.][0-9]*' | sort -u");
  EXPECT_EQ(soname.out, "libcublasLt.so." + major + "\n");
}

}  // namespace
}  // namespace morserve::testing
