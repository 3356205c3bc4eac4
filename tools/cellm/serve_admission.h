// Admission: who may hold generation sessions now, and who waits for them.
//
// The server has `max_sessions` session slots for generations (a request with
// n choices takes n). A request that cannot take its slots at once waits in a
// FIFO queue of at most `max_queued` requests; one more is refused at once (the
// caller answers 429). Slots are handed out strictly in arrival order, so a
// request wanting several slots is never starved by later single ones.
// A Ticket (move-only) gives its slots back when destroyed. close() refuses
// every waiting and later request (shutdown).
//
// Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <variant>

namespace cellm::cli {

class Admission {
 public:
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept;
    Ticket& operator=(Ticket&& other) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket();
    int32_t slots() const { return slots_; }

   private:
    friend class Admission;
    Ticket(Admission* owner, int32_t slots) : owner_(owner), slots_(slots) {}
    Admission* owner_ = nullptr;
    int32_t slots_ = 0;
  };

  enum class Refusal { kQueueFull, kClosed };

  Admission(int32_t max_sessions, int32_t max_queued);

  // Blocks until `slots` slots are free and every earlier waiter is served.
  // REQUIRES: 1 <= slots <= max_sessions.
  // Returns the refusal instead when the queue is full or admission is closed.
  std::variant<Ticket, Refusal> acquire(int32_t slots);

  // Wakes every waiter with kClosed; later acquire() calls are refused.
  void close();

  int32_t waiting() const;
  int32_t slots_in_use() const;
  int32_t requests_admitted() const;  // tickets alive now

 private:
  void release(int32_t slots);

  const int32_t max_sessions_;
  const int32_t max_queued_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<uint64_t> queue_;  // guarded by mu_; waiter numbers, oldest first
  uint64_t next_waiter_ = 0;    // guarded by mu_
  int32_t in_use_ = 0;          // guarded by mu_
  int32_t admitted_ = 0;        // guarded by mu_
  bool closed_ = false;         // guarded by mu_
};

}  // namespace cellm::cli
