// How much memory `cellm serve` may use on this host, for checking at start that the
// KV pool it was asked for can fit: the machine's RAM, capped by the memory limit of
// the process's control group when one is set (a container's), and what the process
// holds already (the weights).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cellm/engine.h"

namespace cellm::cli {

struct HostMemory {
  int64_t ram_bytes = 0;                      // physical memory (sysconf)
  std::optional<int64_t> cgroup_limit_bytes;  // memory.max (v2) or memory.limit_in_bytes (v1)
  int64_t resident_bytes = 0;                 // this process's resident set (VmRSS)

  // What the process may hold in all: the RAM, or the cgroup's limit when lower.
  int64_t limit_bytes() const;
  // "23.5 GiB of RAM" or "8.0 GiB (the cgroup's memory limit; 23.5 GiB of RAM)".
  std::string describe_limit() const;
};

HostMemory read_host_memory();

// This process's resident set now (VmRSS of /proc/self/status), bytes; 0 when unreadable.
int64_t process_resident_bytes();

using cellm::bytes_text;  // engine.h

}  // namespace cellm::cli
