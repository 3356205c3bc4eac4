#include "cellm/serve.h"

#include <algorithm>
#include <utility>

#include "cellm/status.h"

namespace cellm::serve {

Admission::Ticket::Ticket(Ticket&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)), slots_(std::exchange(other.slots_, 0)) {}

Admission::Ticket& Admission::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    if (owner_ != nullptr) owner_->release(slots_);
    owner_ = std::exchange(other.owner_, nullptr);
    slots_ = std::exchange(other.slots_, 0);
  }
  return *this;
}

Admission::Ticket::~Ticket() {
  if (owner_ != nullptr) owner_->release(slots_);
}

Admission::Admission(int32_t max_sessions, int32_t max_queued)
    : max_sessions_(max_sessions), max_queued_(max_queued) {
  CELLM_CHECK(max_sessions >= 1 && max_queued >= 0);
}

std::variant<Admission::Ticket, Admission::Refusal> Admission::acquire(int32_t slots) {
  // REQUIRES: 1 <= slots <= max_sessions.
  CELLM_CHECK(slots >= 1 && slots <= max_sessions_);
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_) return Refusal::kClosed;
  if (queue_.empty() && in_use_ + slots <= max_sessions_) {
    in_use_ += slots;
    admitted_++;
    return Ticket(this, slots);
  }
  if (static_cast<int32_t>(queue_.size()) >= max_queued_) return Refusal::kQueueFull;
  const uint64_t me = next_waiter_++;
  queue_.push_back(me);
  cv_.wait(lock,
           [&] { return closed_ || (queue_.front() == me && in_use_ + slots <= max_sessions_); });
  queue_.erase(std::find(queue_.begin(), queue_.end(), me));
  // The next waiter may fit too.
  cv_.notify_all();
  if (closed_) return Refusal::kClosed;
  in_use_ += slots;
  admitted_++;
  return Ticket(this, slots);
}

void Admission::release(int32_t slots) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_use_ -= slots;
    admitted_--;
    CELLM_CHECK(in_use_ >= 0 && admitted_ >= 0);
  }
  cv_.notify_all();
}

void Admission::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

int32_t Admission::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int32_t>(queue_.size());
}

int32_t Admission::slots_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

int32_t Admission::requests_admitted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return admitted_;
}

}  // namespace cellm::serve
