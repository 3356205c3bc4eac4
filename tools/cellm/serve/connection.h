// The connection layer of `cellm serve`: how long and how much a client may make a
// worker thread wait on it, whether the client behind a request has gone, and the
// listening socket's backlog.
//
// HttpServer is cpp-httplib's Server with its own per-connection loop (httplib
// 0.11's per-read timeouts let a client that sends one byte every few seconds hold a
// worker forever, and it reads chunked bodies without a size limit). On every
// connection:
//   - Waiting for a request (the first or the next on a kept-alive connection) lasts
//     at most min(keep_alive_timeout, request_timeout); the whole request, from its
//     first byte to the end of its body, must arrive within request_timeout (else
//     408). The header section holds at most max_header_bytes, each line at most
//     max_header_line_bytes (else 431); the body at most max_body_bytes, whatever
//     its framing (else 413).
//   - Each write of the answer (a whole SSE chunk, say) must be taken by the client
//     within request_timeout; a client that stops reading fails the write, which
//     the stream's sink reports as a client that has gone (its generation is
//     cancelled).
//   - stop_accepting() closes the listening socket (new connections are refused),
//     closes idle kept-alive connections at once and lets requests in flight
//     finish: answers already being written are never cut. abort_waiting_io()
//     (the shutdown deadline) makes every read or write that would wait fail at once.
// The refusal a request got from this layer (408, 413, 431) is kept for the
// request's thread so the error handler answers with it (connection_refusal()).
//
// PeerWatch: whether the client behind a request has closed its connection, so a
// generation it no longer waits for can be cancelled at once. On HttpServer's
// threads it watches the request's own socket; elsewhere it finds the socket once
// per request: the process's socket whose local and peer addresses are the
// request's (a connected TCP socket is unique by that 4-tuple, and it stays open
// until the handler has returned). closed() polls it without blocking
// (POLLRDHUP: the peer shut its side; POLLHUP/POLLERR). A request whose socket is
// not found is treated as connected: writes still detect a vanished client.
//
// Thread-safety: HttpServer's methods may be called from any thread; PeerWatch::
// closed() only polls.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <optional>

#include "serve/api_error.h"

namespace cellm::cli {

struct ConnectionLimits {
  std::chrono::milliseconds request_timeout{60'000};
  std::chrono::milliseconds keep_alive_timeout{5'000};
  size_t keep_alive_max_requests = 1000;  // requests on one connection
  size_t max_header_bytes = 16 << 10;     // request line and headers together
  // One line of them: what httplib 0.11 accepts (CPPHTTPLIB_HEADER_MAX_LENGTH).
  size_t max_header_line_bytes = 8192;
  size_t max_body_bytes = 4 << 20;
};

class HttpServer final : public httplib::Server {
 public:
  explicit HttpServer(const ConnectionLimits& limits);

  const ConnectionLimits& limits() const { return limits_; }

  // New connections are refused from now on; see the header comment. listen_after_bind()
  // returns once every connection has been served. Call at most once, after the
  // server has started listening.
  void stop_accepting();
  bool accepting() const { return accepting_.load(); }
  // From now on a read or write that would have to wait fails at once.
  void abort_waiting_io() { abort_io_.store(true); }

  // The refusal this layer gave the request being answered on the calling thread
  // (a 408, 413 or 431 ApiError), if any.
  static std::optional<ApiError> connection_refusal();

 private:
  bool process_and_close_socket(socket_t sock) override;

  const ConnectionLimits limits_;
  std::atomic<bool> accepting_{true};
  std::atomic<bool> abort_io_{false};
};

class PeerWatch {
 public:
  PeerWatch() = default;
  explicit PeerWatch(const httplib::Request& request);
  bool closed() const;
  bool found() const { return fd_.has_value(); }

 private:
  std::optional<int> fd_;
};

// cpp-httplib 0.11 listens with a backlog of 5, so a burst of connections
// overflows it and clients see resets. Finds this process's listening socket on
// `port` and listens again with `backlog` (Linux updates a listening socket's
// backlog in place). false if none was found or listen() failed.
bool raise_listen_backlog(int port, int backlog);

}  // namespace cellm::cli
