#include "cellm/decode_first_scheduler.h"

#include <string>
#include <utility>

namespace cellm {
namespace {

// Checks one task on its own (no scheduler state): the rules of submit() that
// need no lock.
bool admissible(const Task& task, size_t max_prefill_chunk_size) {
  if (task.cancelled) return false;
  if (task.input.size == 0) return false;
  if (task.is_decode) return task.input.size == 1;
  return task.input.size <= max_prefill_chunk_size;
}

std::string describe_limits(size_t max_batch_tokens, size_t max_decode_sequences,
                            size_t max_prefill_chunk_size) {
  return "max_batch_tokens=" + std::to_string(max_batch_tokens) +
         ", max_decode_sequences=" + std::to_string(max_decode_sequences) +
         ", max_prefill_chunk_size=" + std::to_string(max_prefill_chunk_size);
}

}  // namespace

Result<std::unique_ptr<DecodeFirstScheduler>> DecodeFirstScheduler::create(
    size_t max_batch_tokens, size_t max_decode_sequences, size_t max_prefill_chunk_size) {
  const std::string limits =
      describe_limits(max_batch_tokens, max_decode_sequences, max_prefill_chunk_size);
  if (max_batch_tokens == 0 || max_decode_sequences == 0 || max_prefill_chunk_size == 0) {
    return InvalidArgument("scheduler limits must be non-zero (" + limits + ")");
  }
  if (max_decode_sequences >= max_batch_tokens) {
    return InvalidArgument("max_decode_sequences " + std::to_string(max_decode_sequences) +
                           " leaves no prefill room in max_batch_tokens " +
                           std::to_string(max_batch_tokens) + " (" + limits + ")");
  }
  if (max_prefill_chunk_size > max_batch_tokens - max_decode_sequences) {
    return InvalidArgument("max_prefill_chunk_size " + std::to_string(max_prefill_chunk_size) +
                           " does not fit beside a full decode batch: max_batch_tokens " +
                           std::to_string(max_batch_tokens) + " - max_decode_sequences " +
                           std::to_string(max_decode_sequences) + " = " +
                           std::to_string(max_batch_tokens - max_decode_sequences));
  }
  return std::unique_ptr<DecodeFirstScheduler>(
      new DecodeFirstScheduler(max_batch_tokens, max_decode_sequences, max_prefill_chunk_size));
}

DecodeFirstScheduler::DecodeFirstScheduler(size_t max_batch_tokens, size_t max_decode_sequences,
                                           size_t max_prefill_chunk_size)
    : max_batch_tokens_(max_batch_tokens),
      max_decode_sequences_(max_decode_sequences),
      max_prefill_chunk_size_(max_prefill_chunk_size) {}

bool DecodeFirstScheduler::submit(std::vector<Task> tasks) {
  for (const Task& task : tasks) {
    if (!admissible(task, max_prefill_chunk_size_)) return false;
  }
  std::unordered_set<TaskId> incoming;
  incoming.reserve(tasks.size());
  for (const Task& task : tasks) {
    if (!incoming.insert(task.tid).second) return false;
  }

  std::lock_guard<std::mutex> lock(mu_);
  for (const Task& task : tasks) {
    if (pending_.count(task.tid) != 0) return false;
  }
  for (Task& task : tasks) {
    pending_.insert(task.tid);
    if (task.is_decode) {
      decode_queue_.push_back(std::move(task));
      continue;
    }
    auto [entry, created] = prefill_.try_emplace(task.input.sid);
    if (created) rotation_.push_back(task.input.sid);
    entry->second.push_back(std::move(task));
  }
  return true;
}

bool DecodeFirstScheduler::has_work() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !pending_.empty();
}

size_t DecodeFirstScheduler::num_queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size();
}

std::vector<Task> DecodeFirstScheduler::get_work() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Task> batch;
  // Sessions owed an output by this batch: they may take nothing more in it.
  std::unordered_set<SessionId> owing_output;
  const size_t spent_tokens = take_decodes(batch, owing_output);
  take_prefill_chunks(batch, owing_output, spent_tokens);
  for (const Task& task : batch) pending_.erase(task.tid);
  return batch;
}

size_t DecodeFirstScheduler::take_decodes(std::vector<Task>& batch,
                                          std::unordered_set<SessionId>& owing_output) {
  size_t taken = 0;
  std::vector<Task> deferred;  // a second decode of a session, in arrival order
  while (taken < max_decode_sequences_ && !decode_queue_.empty()) {
    Task task = std::move(decode_queue_.front());
    decode_queue_.pop_front();
    if (!owing_output.insert(task.input.sid).second) {
      deferred.push_back(std::move(task));
      continue;
    }
    batch.push_back(std::move(task));
    ++taken;
  }
  for (auto it = deferred.rbegin(); it != deferred.rend(); ++it) {
    decode_queue_.push_front(std::move(*it));
  }
  return taken;
}

void DecodeFirstScheduler::take_prefill_chunks(std::vector<Task>& batch,
                                               std::unordered_set<SessionId>& owing_output,
                                               size_t spent_tokens) {
  bool progress = true;
  while (spent_tokens < max_batch_tokens_ && progress) {
    progress = false;
    std::deque<SessionId> visiting = std::move(rotation_);
    rotation_.clear();
    std::deque<SessionId> served;
    for (SessionId sid : visiting) {
      auto entry = prefill_.find(sid);
      CELLM_CHECK(entry != prefill_.end());
      std::deque<Task>& queue = entry->second;
      if (queue.empty()) {  // drained or cancelled: the slot retires with the entry
        prefill_.erase(entry);
        continue;
      }
      // A session owed an output already has its one output in this batch; a
      // chunk over the remaining budget passes its turn.
      const size_t size = queue.front().input.size;
      if (owing_output.count(sid) != 0 || size > max_batch_tokens_ - spent_tokens) {
        rotation_.push_back(sid);  // deferred: back to the front, in order
        continue;
      }
      spent_tokens += size;
      if (queue.front().input.produce_output) owing_output.insert(sid);
      batch.push_back(std::move(queue.front()));
      queue.pop_front();
      progress = true;
      if (queue.empty()) {
        prefill_.erase(entry);
      } else {
        served.push_back(sid);
      }
    }
    rotation_.insert(rotation_.end(), served.begin(), served.end());
  }
}

std::vector<Task> DecodeFirstScheduler::cancel(SessionId sid) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Task> cancelled;
  auto entry = prefill_.find(sid);
  if (entry != prefill_.end()) {
    // The entry stays, empty, so that it and its rotation slot retire together.
    for (Task& task : entry->second) cancelled.push_back(std::move(task));
    entry->second.clear();
  }
  std::deque<Task> kept;
  for (Task& task : decode_queue_) {
    if (task.input.sid == sid) {
      cancelled.push_back(std::move(task));
    } else {
      kept.push_back(std::move(task));
    }
  }
  decode_queue_ = std::move(kept);
  for (Task& task : cancelled) {
    task.cancelled = true;
    pending_.erase(task.tid);
  }
  return cancelled;
}

std::vector<Task> DecodeFirstScheduler::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Task> cancelled;
  cancelled.reserve(pending_.size());
  for (Task& task : decode_queue_) cancelled.push_back(std::move(task));
  for (SessionId sid : rotation_) {
    for (Task& task : prefill_.at(sid)) cancelled.push_back(std::move(task));
  }
  for (Task& task : cancelled) task.cancelled = true;
  decode_queue_.clear();
  prefill_.clear();
  rotation_.clear();
  pending_.clear();
  return cancelled;
}

void DecodeFirstScheduler::check_invariants() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::unordered_set<TaskId> queued;
  for (const Task& task : decode_queue_) {
    CELLM_CHECK_MSG(task.is_decode, "tid " + std::to_string(task.tid));
    CELLM_CHECK_MSG(task.input.size == 1, "decode tid " + std::to_string(task.tid));
    CELLM_CHECK_MSG(!task.cancelled, "decode tid " + std::to_string(task.tid));
    CELLM_CHECK_MSG(queued.insert(task.tid).second, "tid " + std::to_string(task.tid));
  }
  for (const auto& [sid, queue] : prefill_) {
    for (const Task& task : queue) {
      CELLM_CHECK_MSG(!task.is_decode, "tid " + std::to_string(task.tid));
      CELLM_CHECK_MSG(task.input.sid == sid, "tid " + std::to_string(task.tid));
      CELLM_CHECK_MSG(task.input.size >= 1 && task.input.size <= max_prefill_chunk_size_,
                      "prefill tid " + std::to_string(task.tid));
      CELLM_CHECK_MSG(!task.cancelled, "prefill tid " + std::to_string(task.tid));
      CELLM_CHECK_MSG(queued.insert(task.tid).second, "tid " + std::to_string(task.tid));
    }
  }
  CELLM_CHECK(queued == pending_);

  std::unordered_set<SessionId> in_rotation;
  for (SessionId sid : rotation_) {
    CELLM_CHECK_MSG(in_rotation.insert(sid).second, "session twice in the rotation");
    CELLM_CHECK_MSG(prefill_.count(sid) == 1, "rotation session without a prefill queue");
  }
  CELLM_CHECK_MSG(in_rotation.size() == prefill_.size(), "prefill queue outside the rotation");
}

}  // namespace cellm
