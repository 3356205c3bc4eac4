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

// cpp-httplib 0.11 listens with a backlog of 5, so a burst of connections
// overflows it and clients see resets. Finds this process's listening socket on
// `port` and listens again with `backlog` (Linux updates a listening socket's
// backlog in place). false if none was found or listen() failed.
bool raise_listen_backlog(int port, int backlog);

}  // namespace cellm::cli
