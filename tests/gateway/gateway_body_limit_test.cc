// A request body over --max-body-bytes gets a 413 the client can read, even when the client
// goes on sending the whole body before it reads (as HTTP/1.1 clients that do not watch for an
// early response do): the gateway answers, then drains the rest of the body (a lingering
// close, bounded in bytes and time) instead of closing with unread data, which resets the
// connection under the sender (EPIPE / ECONNRESET, the answer lost). Only the real
// `morserve-gateway` runs (no backend: the limit is enforced before routing), driven by a raw
// socket client on 127.0.0.1.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tests/gateway/gateway_process.h"

namespace morserve::testing {
namespace {

struct RawExchange {
  int64_t sent = 0;
  int send_errno = 0;  // 0: every byte of the body was accepted
  std::string response;
  int recv_errno = 0;
};

// POSTs a `body_bytes` body with Content-Length, writing all of it before reading anything.
RawExchange PostWholeBodyThenRead(int port, int64_t body_bytes) {
  RawExchange x;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    x.send_errno = errno;
    close(fd);
    return x;
  }
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  const std::string head = absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                                        "Content-Type: application/json\r\nContent-Length: ",
                                        body_bytes, "\r\n\r\n");
  const std::string chunk(64 * 1024, 'a');
  bool ok = send(fd, head.data(), head.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(head.size());
  while (ok && x.sent < body_bytes) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(chunk.size(), body_bytes - x.sent));
    const ssize_t w = send(fd, chunk.data(), n, MSG_NOSIGNAL);
    if (w < 0) {
      x.send_errno = errno;
      break;
    }
    x.sent += w;
  }
  char buf[4096];
  for (;;) {
    const ssize_t r = recv(fd, buf, sizeof(buf), 0);
    if (r < 0) x.recv_errno = errno;
    if (r <= 0) break;
    x.response.append(buf, static_cast<size_t>(r));
  }
  close(fd);
  return x;
}

class GatewayBodyLimitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(gateway_.Start({"--backend", "127.0.0.1:1", "--max-body-bytes", "8192"}))
        << gateway_.output();
  }
  void TearDown() override { gateway_.Terminate(); }
  GatewayProcess gateway_;
};

TEST_F(GatewayBodyLimitTest, ClientThatSendsItAllStillReadsThe413) {
  for (int64_t bytes : {int64_t{9000}, int64_t{4} << 20, int64_t{32} << 20}) {
    SCOPED_TRACE(absl::StrCat(bytes, " body bytes"));
    const RawExchange x = PostWholeBodyThenRead(gateway_.port(), bytes);
    EXPECT_EQ(x.send_errno, 0) << std::strerror(x.send_errno) << " after " << x.sent << " bytes";
    EXPECT_EQ(x.sent, bytes);
    EXPECT_EQ(x.recv_errno, 0) << std::strerror(x.recv_errno);
    ASSERT_EQ(x.response.rfind("HTTP/1.1 413 ", 0), 0u) << x.response.substr(0, 200);
    const size_t body_at = x.response.find("\r\n\r\n");
    ASSERT_NE(body_at, std::string::npos);
    const nlohmann::json j = nlohmann::json::parse(x.response.substr(body_at + 4), nullptr, false);
    ASSERT_TRUE(j.is_object()) << x.response;
    EXPECT_EQ(j["error"]["code"], "request_too_large");
    EXPECT_NE(j["error"]["message"].get<std::string>().find("8192"), std::string::npos);
  }
  // Still serving: the next request is answered (503: no backend is up).
  EXPECT_EQ(Curl("GET", gateway_.url() + "/health", "", {}).status, 503);
  EXPECT_TRUE(gateway_.Running());
}

}  // namespace
}  // namespace morserve::testing
