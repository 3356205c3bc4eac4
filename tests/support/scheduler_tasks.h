// Task builders shared by the scheduler tests: prefill chunks and decodes with a
// real token backing, a scheduler built from limits that must be valid, and
// small views of returned tasks.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include "cellm/decode_first_scheduler.h"
#include "cellm/types.h"

namespace cellm::test {

using TaskIds = std::vector<TaskId>;

// [num_tokens] tokens 0, 1, 2, ...
inline std::shared_ptr<const std::vector<Token>> Backing(size_t num_tokens) {
  auto tokens = std::make_shared<std::vector<Token>>(num_tokens);
  std::iota(tokens->begin(), tokens->end(), 0);
  return tokens;
}

// A prefill chunk of `size` tokens over its own backing.
inline Task Chunk(TaskId tid, SessionId sid, size_t size, bool produce_output = false) {
  Task task;
  task.tid = tid;
  task.is_decode = false;
  task.input.sid = sid;
  task.input.size = size;
  task.input.produce_output = produce_output;
  task.input.tokens = Backing(size);
  return task;
}

// A decode; `size` other than 1 makes the invalid kind.
inline Task Decode(TaskId tid, SessionId sid, size_t size = 1) {
  Task task;
  task.tid = tid;
  task.is_decode = true;
  task.input.sid = sid;
  task.input.size = size;
  task.input.produce_output = true;
  task.input.tokens = Backing(size);
  return task;
}

// REQUIRES: limits that create() accepts (the test fails, then aborts, if not).
inline std::unique_ptr<DecodeFirstScheduler> Make(size_t max_batch_tokens = 544,
                                                  size_t max_decode_sequences = 32,
                                                  size_t max_prefill_chunk_size = 256) {
  auto created =
      DecodeFirstScheduler::create(max_batch_tokens, max_decode_sequences, max_prefill_chunk_size);
  EXPECT_TRUE(created.ok()) << created.status().to_string();
  return std::move(created).value();
}

inline TaskIds Ids(const std::vector<Task>& tasks) {
  TaskIds ids;
  for (const Task& task : tasks) ids.push_back(task.tid);
  return ids;
}

inline bool AllCancelled(const std::vector<Task>& tasks) {
  for (const Task& task : tasks) {
    if (!task.cancelled) return false;
  }
  return true;
}

}  // namespace cellm::test
