// The scheduler interface: a thread-safe queue of Tasks that picks the next
// batch. It never runs callbacks or executors, does bounded non-blocking work,
// and no I/O. The only implementation is DecodeFirstScheduler.
#pragma once

#include <cstddef>
#include <vector>

#include "cellm/types.h"

namespace cellm {

class Scheduler {
 public:
  virtual ~Scheduler() = default;

  // All or nothing: false means nothing was queued. A tid must be unique among
  // queued tasks (including within `tasks`); it may be reused once dispatched
  // or cancelled.
  virtual bool submit(std::vector<Task> tasks) = 0;

  // A hint, not a reservation.
  virtual bool has_work() const = 0;

  // The next batch; the caller owns the returned tasks. A session appears more
  // than once only as consecutive prefill chunks with at most one produce_output.
  virtual std::vector<Task> get_work() = 0;

  // Removes and returns the session's queued tasks, marked cancelled. Tasks
  // already handed out by get_work() are not returned.
  virtual std::vector<Task> cancel(SessionId sid) = 0;

  // Removes and returns every queued task, marked cancelled (for shutdown).
  virtual std::vector<Task> clear() = 0;

  // Tasks queued now (for metrics).
  virtual size_t num_queued() const = 0;

  // Non-zero. The runner splits prompts into chunks of at most this many tokens.
  virtual size_t max_prefill_chunk_size() const = 0;
};

}  // namespace cellm
