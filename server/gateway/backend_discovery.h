// Where the gateway's backends come from, re-read every --resolve-interval-ms and handed to
// BackendPool::SetAddresses (which adds new ones and drains removed ones):
//   - `--backend HOST:PORT`: one fixed entry (gRPC's channel resolves HOST itself, so behind
//     a ClusterIP Service all of that entry's calls go to one connection, i.e. one pod);
//   - `--backend dns:NAME:PORT`: one entry per address NAME resolves to (Asio's resolver,
//     getaddrinfo), e.g. a Kubernetes headless Service (clusterIP: None) lists every ready
//     pod, so the least-outstanding choice spreads over pods;
//   - `--backend-file PATH`: one HOST:PORT per line ('#' comments and blank lines skipped),
//     re-read every interval (a file-based discovery source, e.g. a mounted ConfigMap).
// The wanted set is the union of every source. A source that fails (a name that does not
// resolve, a file missing or malformed) keeps its last good addresses and says so on stderr
// once per change of error; an empty file is an empty set (everything drains).
#pragma once

#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "server/gateway/backend_pool.h"

namespace morserve::gateway {

struct BackendSource {
  enum class Kind { kFixed, kDns, kFile } kind = Kind::kFixed;
  std::string value;  // kFixed: HOST:PORT; kDns: NAME; kFile: the path
  int port = 0;       // kDns only
};

// "HOST:PORT" or "dns:NAME:PORT" as a source (errors name --backend).
absl::StatusOr<BackendSource> ParseBackendSpec(const std::string& spec);
// The lines of a backend file as HOST:PORT entries (errors name the file and line).
absl::StatusOr<std::vector<std::string>> ParseBackendFile(const std::string& path,
                                                          const std::string& text);
// The gRPC target of one resolved address: "1.2.3.4:50051" or "[::1]:50051".
std::string TargetOf(const std::string& ip, int port, bool v6);

class BackendDiscovery {
 public:
  BackendDiscovery(std::vector<BackendSource> sources, BackendPool* pool);
  ~BackendDiscovery();

  // Resolves every source once and applies the union to the pool (the first call: before the
  // pool's first health round). Fixed sources never change, so only they make the set when
  // no dns/file source is given.
  void Refresh();
  // Refresh every interval_ms on a thread of its own (nothing to do without dns/file sources).
  void Start(int interval_ms);
  void Stop();

 private:
  absl::StatusOr<std::vector<std::string>> Resolve(const BackendSource& s) const;
  void Loop(int interval_ms);

  std::vector<BackendSource> sources_;
  std::vector<std::optional<std::vector<std::string>>> last_;  // last good result per source
  std::vector<std::string> last_error_;                        // per source, "" when fine
  BackendPool* pool_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace morserve::gateway
