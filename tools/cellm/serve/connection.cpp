#include "serve/connection.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace cellm::cli {
namespace {

using Clock = std::chrono::steady_clock;

// How often a wait looks at the server's state (stopping, the shutdown deadline).
constexpr auto kWaitSlice = std::chrono::milliseconds(50);
// A chunked body's framing on top of max_body_bytes.
constexpr size_t kChunkFramingBytes = 64 << 10;
// Enough of a header line for "content-length: " and 20 digits.
constexpr size_t kHeaderPrefixBytes = 48;

// "address", port of a socket address (IPv4 or IPv6); false for other families.
bool describe(const sockaddr_storage& a, std::string& host, int& port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    if (inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf) == nullptr) return false;
    port = ntohs(in->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
    if (inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof buf) == nullptr) return false;
    port = ntohs(in6->sin6_port);
  } else {
    return false;
  }
  host = buf;
  return true;
}

bool matches(int fd, const httplib::Request& req) {
  sockaddr_storage local{}, peer{};
  socklen_t local_len = sizeof local, peer_len = sizeof peer;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) return false;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) return false;
  std::string local_host, peer_host;
  int local_port = 0, peer_port = 0;
  if (!describe(local, local_host, local_port) || !describe(peer, peer_host, peer_port)) {
    return false;
  }
  return local_port == req.local_port && peer_port == req.remote_port &&
         peer_host == req.remote_addr && local_host == req.local_addr;
}

// The first socket of this process for which `pred(fd)` holds.
template <typename Pred>
std::optional<int> find_socket(Pred pred) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  std::optional<int> found;
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st {};
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (pred(static_cast<int>(fd))) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

// poll() of one descriptor for `events`; the revents, 0 when nothing happened in
// `timeout` (or poll failed with EINTR).
short poll_one(int fd, short events, std::chrono::milliseconds timeout) {
  pollfd p{};
  p.fd = fd;
  p.events = events;
  const int n = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, timeout.count())));
  return n > 0 ? p.revents : 0;
}

// One connection's socket, as the httplib::Stream that process_request reads the
// request from and writes the answer to, with the limits of ConnectionLimits.
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(int fd, const ConnectionLimits& limits, const std::atomic<bool>& accepting,
                   const std::atomic<bool>& abort_io)
      : fd_(fd), limits_(limits), accepting_(accepting), abort_io_(abort_io) {}

  int fd() const { return fd_; }
  // The request announced a body that nobody read (an answer given before it, such as
  // a 401): what follows on the connection is not a request.
  bool body_unread() const {
    return phase_ == Phase::kBody && body_bytes_ == 0 &&
           (declared_length_ > 0 || has_transfer_encoding_);
  }
  const std::optional<ApiError>& refusal() const { return refusal_; }

  // Waits for the first byte of the next request and starts its clock. false when
  // none comes in time, the client closed, or the server stops accepting (then
  // only a request already sent is served).
  bool wait_for_request() {
    if (off_ == len_) {
      const auto idle = std::min(limits_.keep_alive_timeout, limits_.request_timeout);
      const Clock::time_point deadline = Clock::now() + idle;
      while (true) {
        const bool stopping = !accepting_.load() || abort_io_.load();
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        const short ready =
            poll_one(fd_, POLLIN,
                     stopping ? std::chrono::milliseconds(0)
                              : std::min<std::chrono::milliseconds>(kWaitSlice, left));
        if (ready != 0) break;
        if (stopping || Clock::now() >= deadline) return false;
      }
      deadline_ = Clock::now() + limits_.request_timeout;
      if (!fill()) return false;
    }
    phase_ = Phase::kHead;
    head_bytes_ = line_bytes_ = body_bytes_ = 0;
    line_index_ = 0;
    prev_ = 0;
    line_start_.clear();
    declared_length_ = 0;
    has_length_ = has_transfer_encoding_ = false;
    refusal_.reset();
    deadline_ = Clock::now() + limits_.request_timeout;
    return true;
  }

  bool is_readable() const override {
    return off_ < len_ || (poll_one(fd_, POLLIN, std::chrono::milliseconds(0)) & POLLIN) != 0;
  }

  // Still worth writing to: the peer has neither closed nor shut its side, and it
  // has taken bytes within the request timeout (a full send buffer alone is no
  // reason to give up: a slow reader is not a stalled one).
  bool is_writable() const override {
    // Not abort_io_: after the shutdown deadline a reading client still gets the
    // cancellation's error events; only waiting for one that does not read fails.
    if (stalled()) return false;
    const short r = poll_one(fd_, POLLOUT | POLLRDHUP, std::chrono::milliseconds(0));
    return (r & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) == 0;
  }

  ssize_t read(char* ptr, size_t size) override {
    if (refusal_) return -1;
    if (off_ == len_) {
      if (!wait_until(POLLIN, deadline_)) {
        if (!abort_io_.load()) refuse_slow();
        return -1;
      }
      if (!fill()) return eof_ ? 0 : -1;
    }
    const size_t n = std::min(size, len_ - off_);
    if (!account(n)) return -1;
    std::memcpy(ptr, buf_.data() + off_, n);
    off_ += n;
    return static_cast<ssize_t>(n);
  }

  // All of [ptr, ptr + size) within request_timeout, or -1 (also once the peer
  // has stalled).
  ssize_t write(const char* ptr, size_t size) override {
    const Clock::time_point deadline = Clock::now() + limits_.request_timeout;
    size_t sent = 0;
    while (sent < size) {
      if (stalled()) return -1;
      const ssize_t n = ::send(fd_, ptr + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        sent_bytes_ += static_cast<uint64_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      if (!wait_until(POLLOUT, deadline)) return -1;
    }
    return static_cast<ssize_t>(size);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (getpeername(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0 || !describe(a, ip, port)) {
      ip.clear();
      port = 0;
    }
  }

  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0 || !describe(a, ip, port)) {
      ip.clear();
      port = 0;
    }
  }

  socket_t socket() const override { return fd_; }

 private:
  enum class Phase { kHead, kBody };

  // Whether the peer has taken none of the bytes waiting for it for longer than the
  // request timeout. The kernel's send buffer can hold megabytes, so a client that
  // stops reading would otherwise go unnoticed until it filled: what the peer has
  // acknowledged is what this stream sent minus what is still queued (SIOCOUTQ).
  bool stalled() const {
    int queued = 0;
    if (::ioctl(fd_, SIOCOUTQ, &queued) != 0 || queued < 0) return false;
    const uint64_t acked = sent_bytes_ - std::min<uint64_t>(sent_bytes_, queued);
    const Clock::time_point now = Clock::now();
    if (queued == 0 || acked != acked_seen_) {
      acked_seen_ = acked;
      progress_at_ = now;
      return false;
    }
    return now - progress_at_ > limits_.request_timeout;
  }

  // Reads what the socket has into the empty buffer; false at the end of the stream
  // (eof_) or on an error.
  bool fill() {
    while (true) {
      const ssize_t n = ::recv(fd_, buf_.data(), buf_.size(), MSG_DONTWAIT);
      if (n > 0) {
        off_ = 0;
        len_ = static_cast<size_t>(n);
        return true;
      }
      if (n == 0) {
        eof_ = true;
        return false;
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
      if (!wait_until(POLLIN, deadline_)) return false;
    }
  }

  // Waits until the socket is ready for `events`, in slices, giving up at
  // `deadline` or once the shutdown deadline has passed.
  bool wait_until(short events, Clock::time_point deadline) const {
    while (true) {
      const short r = poll_one(fd_, events, std::chrono::milliseconds(0));
      if ((r & (events | POLLERR | POLLHUP | POLLNVAL)) != 0) return true;
      if (abort_io_.load()) return false;
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return false;
      const short later =
          poll_one(fd_, events, std::min<std::chrono::milliseconds>(kWaitSlice, left));
      if ((later & (events | POLLERR | POLLHUP | POLLNVAL)) != 0) return true;
    }
  }

  // Counts the next `n` buffered bytes against the limits of the request's header
  // section and body; false (with the refusal) when one is passed.
  bool account(size_t n) {
    for (size_t i = 0; i < n; ++i) {
      if (phase_ == Phase::kBody) {
        body_bytes_ += n - i;
        // A body of a declared length is httplib's to refuse (413 before reading it;
        // the rest is skipped within the request timeout).
        const bool length_declared = has_length_ && !has_transfer_encoding_;
        if (!length_declared && body_bytes_ > limits_.max_body_bytes + kChunkFramingBytes) {
          refusal_ = ApiError{413,
                              "the request body is larger than the server's limit of " +
                                  std::to_string(limits_.max_body_bytes) + " bytes",
                              "invalid_request_error", "", "body_too_large"};
          return false;
        }
        return true;
      }
      const char c = buf_[off_ + i];
      if (++head_bytes_ > limits_.max_header_bytes) {
        refusal_ = ApiError{431,
                            "the request's header section is larger than the server's limit of " +
                                std::to_string(limits_.max_header_bytes) + " bytes",
                            "invalid_request_error", "", "headers_too_large"};
        return false;
      }
      if (c == '\n') {
        const bool empty_line = line_bytes_ == 0 || (line_bytes_ == 1 && prev_ == '\r');
        if (empty_line && line_index_ > 0) phase_ = Phase::kBody;
        note_header(line_start_);
        line_bytes_ = 0;
        line_start_.clear();
        ++line_index_;
        prev_ = c;
        continue;
      }
      if (line_start_.size() < kHeaderPrefixBytes) {
        line_start_ += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      }
      if (++line_bytes_ > limits_.max_header_line_bytes && line_index_ > 0) {
        // The request line has httplib's own limit (414).
        refusal_ = ApiError{431,
                            "a request header line is longer than the server's limit of " +
                                std::to_string(limits_.max_header_line_bytes) + " bytes",
                            "invalid_request_error", "", "header_line_too_long"};
        return false;
      }
      prev_ = c;
    }
    return true;
  }

  // Notes the framing of the body from a header line's first bytes (lower-cased).
  void note_header(const std::string& line) {
    if (line.rfind("transfer-encoding:", 0) == 0) has_transfer_encoding_ = true;
    if (line.rfind("content-length:", 0) == 0) {
      has_length_ = true;
      const size_t digits = line.find_first_of("0123456789");
      if (digits != std::string::npos && line.find_first_not_of(" \t\r", 15) == digits) {
        declared_length_ = std::strtoull(line.c_str() + digits, nullptr, 10);
      }
    }
  }

  void refuse_slow() {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%g",
                  static_cast<double>(limits_.request_timeout.count()) / 1000.0);
    refusal_ = ApiError{408,
                        std::string("the request did not arrive within the server's request "
                                    "timeout of ") +
                            seconds + " s",
                        "invalid_request_error", "", "request_timeout"};
  }

  const int fd_;
  const ConnectionLimits& limits_;
  const std::atomic<bool>& accepting_;
  const std::atomic<bool>& abort_io_;
  std::array<char, 4096> buf_{};
  size_t off_ = 0, len_ = 0;  // buffered bytes not read yet: [off_, len_)
  bool eof_ = false;
  Phase phase_ = Phase::kHead;
  size_t head_bytes_ = 0, line_bytes_ = 0, body_bytes_ = 0, line_index_ = 0;
  char prev_ = 0;
  std::string line_start_;  // the current header line's first bytes, lower-cased
  bool has_length_ = false, has_transfer_encoding_ = false;
  uint64_t declared_length_ = 0;  // Content-Length (saturated), 0 when absent
  uint64_t sent_bytes_ = 0;       // over the connection's life
  mutable uint64_t acked_seen_ = 0;
  mutable Clock::time_point progress_at_ = Clock::now();  // when acked_seen_ last moved
  Clock::time_point deadline_{};                          // the current request's
  std::optional<ApiError> refusal_;
};

// The connection served on this thread (HttpServer's workers only).
thread_local ConnectionStream* t_connection = nullptr;

}  // namespace

HttpServer::HttpServer(const ConnectionLimits& limits) : limits_(limits) {
  set_payload_max_length(limits_.max_body_bytes);
  // What the Keep-Alive header of each answer announces.
  set_keep_alive_max_count(limits_.keep_alive_max_requests);
  set_keep_alive_timeout(std::max<time_t>(
      1, static_cast<time_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                 std::min(limits_.keep_alive_timeout, limits_.request_timeout))
                                 .count())));
}

void HttpServer::stop_accepting() {
  if (!accepting_.exchange(false)) return;
  // A blocked accept() fails (EINVAL) and httplib's listen loop closes the socket and
  // ends; svr_sock_ keeps its value, so answers in flight are not treated as a
  // shutdown (httplib stops writing a provider's content once svr_sock_ is invalid).
  const socket_t sock = svr_sock_.load();
  if (sock != INVALID_SOCKET) ::shutdown(sock, SHUT_RDWR);
}

std::optional<ApiError> HttpServer::connection_refusal() {
  if (t_connection == nullptr) return std::nullopt;
  return t_connection->refusal();
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  ConnectionStream strm(sock, limits_, accepting_, abort_io_);
  t_connection = &strm;
  bool ret = false;
  for (size_t left = limits_.keep_alive_max_requests; left > 0; --left) {
    if (!strm.wait_for_request()) break;
    bool connection_closed = false;
    const bool last = left == 1 || !accepting_.load();
    ret = process_request(strm, last, connection_closed, nullptr);
    if (!ret || connection_closed || strm.refusal() || strm.body_unread()) break;
  }
  t_connection = nullptr;
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ret;
}

PeerWatch::PeerWatch(const httplib::Request& request) {
  if (t_connection != nullptr) {
    fd_ = t_connection->fd();
  } else {
    fd_ = find_socket([&](int fd) { return matches(fd, request); });
  }
}

bool raise_listen_backlog(int port, int backlog) {
  const std::optional<int> fd = find_socket([&](int s) {
    int listening = 0;
    socklen_t len = sizeof listening;
    if (getsockopt(s, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || listening == 0) {
      return false;
    }
    sockaddr_storage local{};
    socklen_t local_len = sizeof local;
    if (getsockname(s, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) return false;
    std::string host;
    int local_port = 0;
    return describe(local, host, local_port) && local_port == port;
  });
  return fd && ::listen(*fd, backlog) == 0;
}

bool PeerWatch::closed() const {
  if (!fd_) return false;
  pollfd p{};
  p.fd = *fd_;
  p.events = POLLRDHUP;
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace cellm::cli
