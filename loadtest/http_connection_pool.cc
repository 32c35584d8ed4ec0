// The keep-alive connection pool (see http_connection_pool.h).
#include "loadtest/http_connection_pool.h"

#include <sys/socket.h>

#include <cerrno>

namespace morserve::loadtest {

bool HttpConnectionPool::ClosedByPeer(Stream& stream) {
  if (!stream.socket().is_open()) return true;
  // Between responses the server sends nothing: EOF, an error or stray bytes all mean the
  // connection cannot carry the next request.
  char byte;
  const ssize_t n = ::recv(stream.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return !(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
}

std::unique_ptr<HttpConnectionPool::Stream> HttpConnectionPool::Take() {
  while (!idle_.empty()) {
    std::unique_ptr<Stream> s = std::move(idle_.back());
    idle_.pop_back();
    if (!ClosedByPeer(*s)) {
      ++reused_;
      return s;
    }
    ++dropped_;
    boost::beast::error_code ignored;
    s->socket().close(ignored);
  }
  return nullptr;
}

void HttpConnectionPool::Give(std::unique_ptr<Stream> stream, bool reusable) {
  if (!stream) return;
  boost::beast::error_code ignored;
  if (keep_alive_ && reusable && (max_idle_ <= 0 || static_cast<int>(idle_.size()) < max_idle_)) {
    stream->expires_never();
    idle_.push_back(std::move(stream));
    return;
  }
  stream->socket().shutdown(boost::asio::ip::tcp::socket::shutdown_both, ignored);
  stream->socket().close(ignored);
}

void HttpConnectionPool::CloseAll() {
  for (std::unique_ptr<Stream>& s : idle_) {
    boost::beast::error_code ignored;
    s->socket().close(ignored);
  }
  idle_.clear();
}

nlohmann::json HttpConnectionPool::StatsJson() const {
  return {{"keep_alive", keep_alive_},
          {"dialled", dialled_.load()},
          {"reused", reused_.load()},
          {"retried", retried_.load()},
          {"dropped_closed_idle", dropped_.load()}};
}

}  // namespace morserve::loadtest
