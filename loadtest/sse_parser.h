// Server-sent events (the WHATWG EventSource format) from a byte stream that arrives in
// arbitrary pieces: lines end with LF, CRLF or CR; "data:" lines of one event are joined with
// LF; a blank line dispatches the event; comments (":...") and other fields are ignored.
// OpenAI streams send `data: {json}` events and a final `data: [DONE]`.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace morserve::loadtest {

class SseParser {
 public:
  using OnEvent = std::function<void(const std::string& data)>;
  explicit SseParser(OnEvent on_event) : on_event_(std::move(on_event)) {}
  void Feed(std::string_view bytes);

 private:
  void Line(std::string_view line);
  OnEvent on_event_;
  std::string line_;
  std::string data_;
  bool has_data_ = false;
  bool last_was_cr_ = false;
};

}  // namespace morserve::loadtest
