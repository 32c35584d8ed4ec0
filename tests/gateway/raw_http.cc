// Raw-socket HTTP client and response parsing for the gateway tests (see raw_http.h).
#include "tests/gateway/raw_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace morserve::testing {

RawStream::RawStream(int port, const std::string& path, const std::string& body) {
  fd_ = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ok_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  const std::string req = absl::StrCat("POST ", path,
                                       " HTTP/1.1\r\nHost: x\r\n"
                                       "Content-Type: application/json\r\nContent-Length: ",
                                       body.size(), "\r\n\r\n", body);
  ok_ = ok_ && write(fd_, req.data(), req.size()) == static_cast<ssize_t>(req.size());
}

bool RawStream::ReadUntil(const std::string& text) {
  char buf[4096];
  while (ok_ && got_.find(text) == std::string::npos) {
    const ssize_t n = read(fd_, buf, sizeof buf);
    if (n <= 0) return false;
    got_.append(buf, n);
  }
  return ok_;
}

bool RawStream::ReadSome() {
  char buf[4096];
  const ssize_t n = read(fd_, buf, sizeof buf);
  if (n <= 0) return false;
  got_.append(buf, n);
  return true;
}

void RawStream::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && (s[a] == ' ' || s[a] == '\t')) ++a;
  while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t' || s[b - 1] == '\r')) --b;
  return s.substr(a, b - a);
}

}  // namespace

ParsedResponse ParseHttpResponse(const std::string& raw) {
  ParsedResponse r;
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) return r;
  r.headers_complete = true;
  std::istringstream head(raw.substr(0, head_end));
  std::string line;
  std::getline(head, line);
  // "HTTP/1.1 200 OK"
  if (line.rfind("HTTP/1.", 0) != 0 || line.size() < 12) {
    r.malformed = true;
    return r;
  }
  r.status = std::atoi(line.c_str() + 9);
  while (std::getline(head, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    r.headers[Lower(Trim(line.substr(0, colon)))] = Trim(line.substr(colon + 1));
  }
  const std::string rest = raw.substr(head_end + 4);
  auto te = r.headers.find("transfer-encoding");
  r.chunked = te != r.headers.end() && Lower(te->second).find("chunked") != std::string::npos;
  if (!r.chunked) {
    auto cl = r.headers.find("content-length");
    if (cl == r.headers.end()) {  // read to EOF: never known to be complete here
      r.body = rest;
      return r;
    }
    const size_t want = std::strtoull(cl->second.c_str(), nullptr, 10);
    r.body = rest.substr(0, want);
    r.complete = rest.size() >= want;
    return r;
  }
  // Chunks: HEX[;ext]\r\n DATA \r\n ... 0\r\n [trailers] \r\n
  size_t at = 0;
  for (;;) {
    const size_t eol = rest.find("\r\n", at);
    if (eol == std::string::npos) return r;
    const std::string size_line = rest.substr(at, eol - at);
    char* end = nullptr;
    const unsigned long long n = std::strtoull(size_line.c_str(), &end, 16);
    if (end == size_line.c_str()) {
      r.malformed = true;
      return r;
    }
    at = eol + 2;
    if (n == 0) {
      // No trailers: "\r\n" next; with trailers, they end with an empty line.
      r.complete =
          rest.compare(at, 2, "\r\n") == 0 || rest.find("\r\n\r\n", at) != std::string::npos;
      return r;
    }
    if (rest.size() < at + n + 2) return r;
    r.body.append(rest, at, n);
    if (rest.compare(at + n, 2, "\r\n") != 0) {
      r.malformed = true;
      return r;
    }
    at += n + 2;
  }
}

std::vector<std::string> SseEvents(const std::string& body, std::vector<std::string>* other) {
  std::vector<std::string> data;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line.rfind("data: ", 0) == 0) {
      data.push_back(line.substr(6));
    } else if (other != nullptr) {
      other->push_back(line);
    }
  }
  return data;
}

}  // namespace morserve::testing
