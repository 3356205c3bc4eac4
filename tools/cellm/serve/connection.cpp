#include "serve/connection.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace cellm::cli {
namespace {

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

}  // namespace

PeerWatch::PeerWatch(const httplib::Request& request)
    : fd_(find_socket([&](int fd) { return matches(fd, request); })) {}

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
