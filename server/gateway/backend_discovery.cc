// Backend sources: fixed, DNS and file (see backend_discovery.h).
#include "server/gateway/backend_discovery.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace morserve::gateway {
namespace {

// HOST:PORT with a non-empty host and a port in [1, 65535]; the port through *port.
bool SplitHostPort(const std::string& s, std::string* host, int* port) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  if (!absl::SimpleAtoi(s.substr(colon + 1), port) || *port < 1 || *port > 65535) return false;
  *host = s.substr(0, colon);
  return true;
}

}  // namespace

absl::StatusOr<BackendSource> ParseBackendSpec(const std::string& spec) {
  BackendSource s;
  std::string host;
  int port = 0;
  if (absl::StartsWith(spec, "dns:")) {
    if (!SplitHostPort(spec.substr(4), &host, &port) || host.find(':') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--backend: expected dns:NAME:PORT (port 1..65535), got '", spec, "'"));
    }
    s.kind = BackendSource::Kind::kDns;
    s.value = host;
    s.port = port;
    return s;
  }
  if (!SplitHostPort(spec, &host, &port)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--backend: expected HOST:PORT or dns:NAME:PORT (port 1..65535), got '", spec, "'"));
  }
  s.value = spec;
  return s;
}

absl::StatusOr<std::vector<std::string>> ParseBackendFile(const std::string& path,
                                                          const std::string& text) {
  std::vector<std::string> out;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    std::string l(absl::StripAsciiWhitespace(line.substr(0, line.find('#'))));
    if (l.empty()) continue;
    std::string host;
    int port = 0;
    if (!SplitHostPort(l, &host, &port)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": expected HOST:PORT (port 1..65535), got '", l, "'"));
    }
    out.push_back(l);
  }
  return out;
}

std::string TargetOf(const std::string& ip, int port, bool v6) {
  return v6 ? absl::StrCat("[", ip, "]:", port) : absl::StrCat(ip, ":", port);
}

BackendDiscovery::BackendDiscovery(std::vector<BackendSource> sources, BackendPool* pool)
    : sources_(std::move(sources)),
      last_(sources_.size()),
      last_error_(sources_.size()),
      pool_(pool) {}

BackendDiscovery::~BackendDiscovery() { Stop(); }

absl::StatusOr<std::vector<std::string>> BackendDiscovery::Resolve(const BackendSource& s) const {
  switch (s.kind) {
    case BackendSource::Kind::kFixed:
      return std::vector<std::string>{s.value};
    case BackendSource::Kind::kFile: {
      std::ifstream in(s.value, std::ios::binary);
      if (!in) return absl::NotFoundError(absl::StrCat("--backend-file: cannot read ", s.value));
      std::stringstream text;
      text << in.rdbuf();
      return ParseBackendFile(s.value, text.str());
    }
    case BackendSource::Kind::kDns: {
      boost::asio::io_context ioc;
      boost::asio::ip::tcp::resolver resolver(ioc);
      boost::system::error_code ec;
      auto results = resolver.resolve(s.value, std::to_string(s.port), ec);
      if (ec) {
        return absl::UnavailableError(
            absl::StrCat("--backend dns:", s.value, ":", s.port, ": ", ec.message()));
      }
      std::set<std::string> targets;  // getaddrinfo repeats an address per socket type
      for (const auto& r : results) {
        const auto addr = r.endpoint().address();
        targets.insert(TargetOf(addr.to_string(), s.port, addr.is_v6()));
      }
      return std::vector<std::string>(targets.begin(), targets.end());
    }
  }
  return absl::InternalError("unknown backend source");
}

void BackendDiscovery::Refresh() {
  std::vector<std::string> wanted;
  for (size_t i = 0; i < sources_.size(); ++i) {
    absl::StatusOr<std::vector<std::string>> r = Resolve(sources_[i]);
    const std::string error = r.ok() ? "" : std::string(r.status().message());
    if (error != last_error_[i]) {
      if (!error.empty()) {
        std::cerr << "morserve-gateway: " << error << " (keeping the last addresses)" << std::endl;
      }
      last_error_[i] = error;
    }
    if (r.ok()) last_[i] = *std::move(r);
    if (last_[i]) wanted.insert(wanted.end(), last_[i]->begin(), last_[i]->end());
  }
  const auto [added, removed] = pool_->SetAddresses(wanted);
  if (added + removed > 0) {
    std::cerr << "morserve-gateway: backends: " << added << " added, " << removed << " draining ("
              << pool_->size() << " in the set)" << std::endl;
  }
}

void BackendDiscovery::Start(int interval_ms) {
  bool dynamic = false;
  for (const BackendSource& s : sources_) dynamic |= s.kind != BackendSource::Kind::kFixed;
  if (!dynamic) return;
  thread_ = std::thread([this, interval_ms] { Loop(interval_ms); });
}

void BackendDiscovery::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void BackendDiscovery::Loop(int interval_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, std::chrono::milliseconds(interval_ms), [this] { return stop_; })) {
    lock.unlock();
    Refresh();
    lock.lock();
  }
}

}  // namespace morserve::gateway
