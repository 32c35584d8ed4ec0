// Stalled-write guard (see write_watchdog.h).
#include "server/gateway/write_watchdog.h"

namespace morserve::gateway {

using Clock = std::chrono::steady_clock;

struct WriteWatchdog::State {
  State(boost::asio::ip::tcp::socket& s, std::chrono::milliseconds t)
      : socket(&s), timeout(t), timer(s.get_executor()) {}
  boost::asio::ip::tcp::socket* socket;  // null once the watchdog is gone
  std::chrono::milliseconds timeout;
  boost::asio::steady_timer timer;
  Clock::time_point began;
  bool writing = false;
  bool armed = false;
  bool fired = false;
};

WriteWatchdog::WriteWatchdog(boost::asio::ip::tcp::socket& socket,
                             std::chrono::milliseconds timeout)
    : state_(std::make_shared<State>(socket, timeout)) {}

WriteWatchdog::~WriteWatchdog() {
  state_->socket = nullptr;
  state_->timer.cancel();
}

void WriteWatchdog::Begin() {
  state_->began = Clock::now();
  state_->writing = true;
  if (!state_->armed) Arm(state_, state_->began + state_->timeout);
}

void WriteWatchdog::End() { state_->writing = false; }

bool WriteWatchdog::fired() const { return state_->fired; }

void WriteWatchdog::Arm(const std::shared_ptr<State>& s, Clock::time_point at) {
  s->armed = true;
  s->timer.expires_at(at);
  s->timer.async_wait([s](const boost::system::error_code& ec) {
    s->armed = false;
    if (ec || s->socket == nullptr || !s->writing) return;
    const Clock::time_point deadline = s->began + s->timeout;
    if (Clock::now() < deadline) {  // a later write: wait for its own deadline
      Arm(s, deadline);
      return;
    }
    s->fired = true;
    boost::system::error_code ignored;
    s->socket->close(ignored);
  });
}

}  // namespace morserve::gateway
