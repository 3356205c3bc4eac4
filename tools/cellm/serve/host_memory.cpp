#include "serve/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

namespace cellm::cli {
namespace {

// A cgroup limit file's value; nullopt for "max", an unset v1 limit (close to 2^63) or
// a file that cannot be read.
std::optional<int64_t> read_limit(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!in || !(in >> text) || text == "max") return std::nullopt;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || value <= 0 || value >= (int64_t{1} << 62)) {
    return std::nullopt;
  }
  return static_cast<int64_t>(value);
}

// The tightest memory limit of this process's cgroup (v2 or v1), looked up under the
// cgroup's path and at the root of the mount (inside a container, the process's
// own cgroup is mounted there).
std::optional<int64_t> cgroup_limit() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  std::optional<int64_t> limit;
  auto take = [&](std::optional<int64_t> v) {
    if (v) limit = limit ? std::min(*limit, *v) : *v;
  };
  while (std::getline(in, line)) {
    const size_t first = line.find(':');
    const size_t second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (controllers.empty()) {  // v2
      take(read_limit("/sys/fs/cgroup" + path + "/memory.max"));
      take(read_limit("/sys/fs/cgroup/memory.max"));
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {  // v1
      take(read_limit("/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes"));
      take(read_limit("/sys/fs/cgroup/memory/memory.limit_in_bytes"));
    }
  }
  return limit;
}

}  // namespace

int64_t process_resident_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      int64_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

int64_t HostMemory::limit_bytes() const {
  return cgroup_limit_bytes ? std::min(ram_bytes, *cgroup_limit_bytes) : ram_bytes;
}

std::string HostMemory::describe_limit() const {
  if (cgroup_limit_bytes && *cgroup_limit_bytes < ram_bytes) {
    return bytes_text(*cgroup_limit_bytes) + " (the cgroup's memory limit; " +
           bytes_text(ram_bytes) + " of RAM)";
  }
  return bytes_text(ram_bytes) + " of RAM";
}

HostMemory read_host_memory() {
  HostMemory m;
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_bytes = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page_bytes > 0) m.ram_bytes = int64_t{pages} * int64_t{page_bytes};
  m.cgroup_limit_bytes = cgroup_limit();
  m.resident_bytes = process_resident_bytes();
  return m;
}

}  // namespace cellm::cli
