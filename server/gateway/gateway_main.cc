// `morserve-gateway`: the OpenAI-compatible HTTP gateway in front of morserve gRPC servers.
// Prints exactly one line, "gateway listening on HOST:PORT", once it accepts connections;
// SIGTERM/SIGINT stop accepting, let requests in flight finish, and exit 0.
#include <signal.h>

#include <cstdio>
#include <iostream>

#include "server/gateway/backend_discovery.h"
#include "server/gateway/backend_pool.h"
#include "server/gateway/gateway_metrics.h"
#include "server/gateway/http_server.h"
#include "server/gateway/options.h"

int main(int argc, char** argv) {
  using namespace morserve::gateway;
  absl::StatusOr<GatewayOptions> options = ParseGatewayOptions(argc, argv);
  if (!options.ok()) {
    const bool help = options.status().code() == absl::StatusCode::kNotFound;
    (help ? std::cout : std::cerr) << options.status().message() << "\n";
    return help ? 0 : 2;
  }
  // Signals are handled by the server's signal_set; block them in every thread until then
  // (gRPC's threads start with the pool) so none is delivered to a thread that kills us.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  GatewayMetrics metrics;
  BackendPool pool(options->served_model_name, &metrics);
  std::vector<BackendSource> sources;
  for (const std::string& b : options->backends) sources.push_back(*ParseBackendSpec(b));
  for (const std::string& f : options->backend_files) {
    sources.push_back({BackendSource::Kind::kFile, f, 0});
  }
  BackendDiscovery discovery(std::move(sources), &pool);
  discovery.Refresh();
  pool.Start(options->health_interval_ms);
  discovery.Start(options->resolve_interval_ms);
  HttpServer server(GatewayContext{&*options, &pool, &metrics});
  absl::StatusOr<int> port = server.Listen(options->host, options->port);
  if (!port.ok()) {
    std::cerr << "morserve-gateway: " << port.status().message() << "\n";
    discovery.Stop();
    pool.Stop();
    return 1;
  }
  std::cout << "gateway listening on " << options->host << ":" << *port << std::endl;
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  server.Run(options->threads);
  discovery.Stop();
  pool.Stop();
  return 0;
}
