// http://HOST:PORT/PATH URLs and HOST:PORT addresses, and the loopback rule: the load tester
// talks only to 127.0.0.0/8, ::1 or "localhost" unless --allow-remote-host is given, so a
// mistyped address cannot load someone else's server.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace morserve::loadtest {

struct Url {
  std::string host;
  std::string port;
  std::string target = "/";  // path and query
};

// http only (https is refused with a clear error); the port defaults to 80.
absl::StatusOr<Url> ParseHttpUrl(const std::string& url);
// "HOST:PORT" or "[V6]:PORT".
absl::StatusOr<Url> ParseHostPort(const std::string& address);
bool IsLoopbackHost(const std::string& host);
absl::Status CheckHostAllowed(const std::string& host, bool allow_remote);

}  // namespace morserve::loadtest
