// URL parsing and the loopback rule (see url.h).
#include "loadtest/url.h"

#include <arpa/inet.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace morserve::loadtest {

absl::StatusOr<Url> ParseHostPort(const std::string& address) {
  Url u;
  size_t colon;
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos)
      return absl::InvalidArgumentError(absl::StrCat("address '", address, "': missing ]"));
    u.host = address.substr(1, close - 1);
    colon = close + 1;
    if (colon >= address.size() || address[colon] != ':') colon = std::string::npos;
  } else {
    colon = address.rfind(':');
    u.host = address.substr(0, colon);
  }
  if (colon == std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat("address '", address, "': expected HOST:PORT"));
  u.port = address.substr(colon + 1);
  int port;
  if (u.host.empty() || !absl::SimpleAtoi(u.port, &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", address, "': expected HOST:PORT with a port in 1..65535"));
  }
  return u;
}

absl::StatusOr<Url> ParseHttpUrl(const std::string& url) {
  if (absl::StartsWith(url, "https://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", url, "': https is not supported (plain http only)"));
  }
  if (!absl::StartsWith(url, "http://"))
    return absl::InvalidArgumentError(absl::StrCat("'", url, "': expected http://HOST:PORT/PATH"));
  const std::string rest = url.substr(7);
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  if (authority.find(':') == std::string::npos ||
      (authority.front() == '[' && authority.back() == ']')) {
    authority += ":80";
  }
  auto u = ParseHostPort(authority);
  if (!u.ok())
    return absl::InvalidArgumentError(absl::StrCat("'", url, "': ", u.status().message()));
  if (slash != std::string::npos) u->target = rest.substr(slash);
  return u;
}

bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

absl::Status CheckHostAllowed(const std::string& host, bool allow_remote) {
  if (allow_remote || IsLoopbackHost(host)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "host '", host, "' is not a loopback address; pass --allow-remote-host to load it"));
}

}  // namespace morserve::loadtest
