// PeerWatch: whether the client behind an HTTP request has closed its
// connection, so a generation it no longer waits for can be cancelled at once.
//
// cpp-httplib 0.11 does not hand the connection's socket to handlers, so the
// watch finds it once per request: the process's socket whose local and peer
// addresses are the request's (a connected TCP socket is unique by that
// 4-tuple, and it stays open until the handler has returned). closed() polls it
// without blocking (POLLRDHUP: the peer shut its side; POLLHUP/POLLERR).
// A request whose socket is not found is treated as connected: writes still
// detect a vanished client on streams.
//
// Thread-safe: closed() only polls.
#pragma once

#include <httplib.h>

#include <optional>

namespace cellm::cli {

class PeerWatch {
 public:
  PeerWatch() = default;
  explicit PeerWatch(const httplib::Request& request);
  bool closed() const;
  bool found() const { return fd_.has_value(); }

 private:
  std::optional<int> fd_;
};

}  // namespace cellm::cli
