// Raw-socket HTTP/1.1 for the gateway tests that need more than curl: RawStream (one blocking
// POST on 127.0.0.1 whose answer is read piece by piece, so a test can close it at any point)
// and ParseHttpResponse (status, headers and the de-chunked body of the bytes received so far,
// and whether they are a complete response), for the streaming, disconnect, failover and soak
// tests.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace morserve::testing {

// A raw HTTP client for one POST: connect, send, read until `until` shows up.
class RawStream {
 public:
  RawStream(int port, const std::string& path, const std::string& body);
  ~RawStream() { Close(); }
  RawStream(const RawStream&) = delete;
  RawStream& operator=(const RawStream&) = delete;
  // Reads until `text` was received (false on EOF or error first).
  bool ReadUntil(const std::string& text);
  // One read into received(); false on EOF or error.
  bool ReadSome();
  void Close();
  const std::string& received() const { return got_; }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  bool ok_ = false;
  std::string got_;
};

// One HTTP/1.1 response as far as it was received.
struct ParsedResponse {
  bool headers_complete = false;  // the status line and headers ended ("\r\n\r\n")
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  bool chunked = false;
  std::string body;        // de-chunked when chunked
  bool complete = false;   // the whole body: Content-Length bytes or the last (0) chunk
  bool malformed = false;  // a status line or chunk framing that does not parse
};
ParsedResponse ParseHttpResponse(const std::string& raw);

// The "data: " payloads of an SSE body in order (events are "data: X\n\n"); lines of any
// other kind are returned in *other (when given).
std::vector<std::string> SseEvents(const std::string& body,
                                   std::vector<std::string>* other = nullptr);

}  // namespace morserve::testing
