// RunnerCore under a KV policy (RunnerOptions::policy): the waiting queue,
// admission by the executor's KV budget, preemption and resume, and the
// history kept for them.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/runner_core.h"

namespace cellm {

const char* to_string(KvPolicy policy) {
  switch (policy) {
    case KvPolicy::kNone:
      return "none";
    case KvPolicy::kReserve:
      return "reserve";
    case KvPolicy::kOvercommit:
      return "overcommit";
  }
  return "unknown";
}

namespace detail {

void RunnerCore::resolve_policy() {
  policy_ = options_.policy;
  // An executor that does not know its pool (a test double) cannot be shared
  // by need: the policy stays off.
  if (policy_ != KvPolicy::kNone && executor_.kv_budget().capacity <= 0) policy_ = KvPolicy::kNone;
}

std::optional<std::string> RunnerCore::never_fits(const SessionRecord& record, int64_t feed,
                                                  int32_t max_new_tokens) const {
  const KvBudget budget = executor_.kv_budget();
  const int64_t position = record.position.load();
  const int64_t end = position + feed + max_new_tokens;
  const int64_t context = budget.max_context > 0 ? budget.max_context : budget.capacity;
  if (end <= context && end <= budget.capacity) return std::nullopt;
  return "generation needs " + std::to_string(end) + " positions (" + std::to_string(position) +
         " committed + " + std::to_string(feed) + " to feed + max_new_tokens " +
         std::to_string(max_new_tokens) + ") but a session holds at most " +
         std::to_string(context) + " positions and the KV pool " + std::to_string(budget.capacity) +
         " cells";
}

void RunnerCore::park(const std::shared_ptr<SessionRecord>& record) {
  ActiveGeneration& gen = *record->active;
  gen.t_parked_us = now_us();
  gen.parked_loop = loop_;
  waiting_.push_back(record);
}

void RunnerCore::admit_waiting() {
  // Strictly FIFO: nothing passes a head that does not fit.
  while (policy_on() && !waiting_.empty() && !stop_requested()) {
    if (try_admit(waiting_.front())) continue;
    // Running generations will give cells back; with none, only the cells of
    // waiting sessions (attached prefixes, earlier turns) can make room.
    if (!running_.empty() || !release_a_waiting_session()) break;
  }
}

bool RunnerCore::try_admit(std::shared_ptr<SessionRecord> record) {
  SessionRecord& r = *record;
  ActiveGeneration& gen = *r.active;
  const KvBudget budget = executor_.kv_budget();
  // Cached cells count as room: the pool reclaims them when a step needs them.
  const int64_t room = budget.free + budget.cached - budget.reserved;
  // A released session's history counts in full, though part of it may come
  // back from the cache: those cells are counted in `cached` too.
  const int64_t feed =
      (r.released ? int64_t{r.position.load()} : 0) + static_cast<int64_t>(gen.feed->size());
  if (policy_ == KvPolicy::kReserve) {
    if (feed + gen.remaining_tokens > room) return false;
    if (r.released) reattach(r);
    // The tokens it feeds and those it may generate; cells the session
    // already holds (an attached prefix) count once.
    const int64_t cells = static_cast<int64_t>(gen.feed->size()) + gen.remaining_tokens;
    if (!executor_.reserve(r.sid, cells)) return false;
    gen.reserved = true;
  } else {
    if (feed > room - promised_cells()) return false;
    if (r.released) reattach(r);
  }

  waiting_.pop_front();
  gen.admitted = true;
  running_.push_back(record);
  if (gen.admit_seq == 0) {
    gen.admit_seq = next_admit_seq_++;
    if (loop_ > gen.parked_loop) {
      metrics_.admission_waits++;
      metrics_.admission_wait_us_sum += now_us() - gen.t_parked_us;
    }
  }
  submit_feed(r);
  return true;
}

void RunnerCore::reattach(SessionRecord& record) {
  ActiveGeneration& gen = *record.active;
  std::vector<Token>& history = record.history;
  CELLM_CHECK_MSG(history.size() == static_cast<size_t>(record.position.load()),
                  "session " + std::to_string(record.sid) + ": history of " +
                      std::to_string(history.size()) + " tokens at position " +
                      std::to_string(record.position.load()));
  // The feed is never empty, so the history's last token may be attached too.
  const Position matched = std::clamp<Position>(executor_.attach_prefix(record.sid, history), 0,
                                                static_cast<Position>(history.size()));
  auto feed = std::make_shared<std::vector<Token>>(history.begin() + matched, history.end());
  feed->insert(feed->end(), gen.feed->begin(), gen.feed->end());
  metrics_.recomputed_tokens += static_cast<int64_t>(history.size()) - matched;
  history.resize(static_cast<size_t>(matched));
  record.position.store(matched);
  record.released = false;
  gen.feed = std::move(feed);
  gen.feed_base = matched;
}

bool RunnerCore::release_a_waiting_session() {
  for (size_t i = waiting_.size(); i-- > 1;) {
    SessionRecord& r = *waiting_[i];
    if (r.released || r.position.load() == 0) continue;
    // Its feed has not started, so history and feed stay as they are.
    if (!executor_.release_cells(r.sid)) return false;
    r.released = true;
    return true;
  }
  return false;
}

int64_t RunnerCore::promised_cells() const {
  int64_t cells = 0;
  for (const std::shared_ptr<SessionRecord>& r : running_) {
    const ActiveGeneration& gen = *r->active;
    cells += 1;
    if (gen.in_prefill) {
      cells += int64_t{gen.feed_base} + static_cast<int64_t>(gen.feed->size()) - r->position.load();
    }
  }
  return cells;
}

bool RunnerCore::preempt_for_step(std::vector<Task>& tasks) {
  int64_t need = 0;
  for (const Task& task : tasks) need += static_cast<int64_t>(task.input.size);
  // The oldest running generation is never preempted.
  while (running_.size() > 1) {
    const KvBudget budget = executor_.kv_budget();
    if (need <= budget.free + budget.cached - budget.reserved) break;
    const std::shared_ptr<SessionRecord> victim = *std::max_element(
        running_.begin(), running_.end(),
        [](const std::shared_ptr<SessionRecord>& a, const std::shared_ptr<SessionRecord>& b) {
          return a->active->admit_seq < b->active->admit_seq;
        });
    if (!preempt(victim)) break;
    const SessionId sid = victim->sid;
    const auto mine = [sid](const Task& task) { return task.input.sid == sid; };
    for (const Task& task : tasks) need -= mine(task) ? static_cast<int64_t>(task.input.size) : 0;
    tasks.erase(std::remove_if(tasks.begin(), tasks.end(), mine), tasks.end());
  }
  return !tasks.empty();
}

bool RunnerCore::preempt(const std::shared_ptr<SessionRecord>& record) {
  SessionRecord& r = *record;
  ActiveGeneration& gen = *r.active;
  if (!executor_.release_cells(r.sid)) return false;
  (void)scheduler_->cancel(r.sid);
  // What is left to feed at `position`: the unsent part of the feed, or the
  // pending token a decode would have fed. Everything before it is history.
  const Position position = r.position.load();
  std::vector<Token> rest;
  if (gen.in_prefill) {
    CELLM_CHECK_MSG(position >= gen.feed_base &&
                        static_cast<size_t>(position - gen.feed_base) < gen.feed->size(),
                    "session " + std::to_string(r.sid) + ": preempted past its feed");
    rest.assign(gen.feed->begin() + (position - gen.feed_base), gen.feed->end());
  } else {
    CELLM_CHECK_MSG(r.pending.has_value(),
                    "session " + std::to_string(r.sid) + ": a decoding generation without a token");
    rest.push_back(*r.pending);
  }
  gen.feed = std::make_shared<const std::vector<Token>>(std::move(rest));
  gen.feed_base = position;
  gen.in_prefill = true;
  r.released = true;
  gen.admitted = false;
  running_.erase(std::find(running_.begin(), running_.end(), record));
  waiting_.push_front(record);
  metrics_.preemptions++;
  gen.metrics.n_preemptions++;
  return true;
}

void RunnerCore::leave_kv(SessionRecord& record, ActiveGeneration& gen) {
  const auto same = [&record](const std::shared_ptr<SessionRecord>& r) {
    return r.get() == &record;
  };
  if (gen.admitted) {
    running_.erase(std::remove_if(running_.begin(), running_.end(), same), running_.end());
    gen.admitted = false;
  } else {
    waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), same), waiting_.end());
  }
  if (gen.reserved) {
    (void)executor_.reserve(record.sid, 0);
    gen.reserved = false;
  }
}

void RunnerCore::note_input(SessionRecord& record, const Input& input) {
  const auto start = static_cast<size_t>(input.start());
  CELLM_CHECK_MSG(start <= record.history.size(),
                  "session " + std::to_string(record.sid) + ": an input at " +
                      std::to_string(start) + " past its history of " +
                      std::to_string(record.history.size()) + " tokens");
  record.history.resize(start);
  for (size_t i = 0; i < input.size; ++i) record.history.push_back(input.token(i));
}

}  // namespace detail
}  // namespace cellm
