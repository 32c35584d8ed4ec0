// Blocking GET (see http_get.h).
#include "loadtest/http_get.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "absl/strings/str_cat.h"

namespace morserve::loadtest {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = boost::asio::ip::tcp;

absl::StatusOr<std::string> HttpGet(const Url& url, int timeout_ms, const std::string& bearer) {
  const std::string where = absl::StrCat("http://", url.host, ":", url.port, url.target);
  try {
    boost::asio::io_context io;
    tcp::resolver resolver(io);
    beast::tcp_stream stream(io);
    stream.expires_after(std::chrono::milliseconds(timeout_ms));
    stream.connect(resolver.resolve(url.host, url.port));
    http::request<http::empty_body> req(http::verb::get, url.target, 11);
    req.set(http::field::host, url.host);
    if (!bearer.empty()) req.set(http::field::authorization, "Bearer " + bearer);
    http::write(stream, req);
    beast::flat_buffer buffer;
    http::response<http::string_body> res;
    http::read(stream, buffer, res);
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    if (res.result_int() != 200) {
      return absl::UnavailableError(absl::StrCat("GET ", where, ": HTTP ", res.result_int()));
    }
    return std::move(res.body());
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("GET ", where, ": ", e.what()));
  }
}

}  // namespace morserve::loadtest
