// Randomized and multi-threaded tests of DecodeFirstScheduler: a seeded run of
// thousands of operations checked against a ledger of owed tasks, and producers,
// a consumer and observers sharing one scheduler (run under TSan and ASan).
#include "cellm/decode_first_scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/scheduler_tasks.h"

namespace cellm {
namespace {

using test::AllCancelled;
using test::Chunk;
using test::Decode;
using test::Ids;
using test::Make;

// Checks what must hold of every batch, whatever was queued: the token and
// decode limits, decodes before prefill, and never two outputs owed to one
// session (one decode alone, or prefill chunks with at most one output).
void ExpectWellFormedBatch(const std::vector<Task>& batch, size_t max_batch_tokens,
                           size_t max_decode_sequences) {
  size_t num_tokens = 0;
  size_t num_decodes = 0;
  bool seen_prefill = false;
  std::map<SessionId, int> decodes;
  std::map<SessionId, int> chunks;
  std::map<SessionId, int> outputs;
  for (const Task& task : batch) {
    EXPECT_FALSE(task.cancelled);
    num_tokens += task.input.size;
    if (task.is_decode) {
      EXPECT_FALSE(seen_prefill) << "decode tid " << task.tid << " after a prefill chunk";
      EXPECT_EQ(task.input.size, 1u);
      ++num_decodes;
      ++decodes[task.input.sid];
    } else {
      seen_prefill = true;
      ++chunks[task.input.sid];
    }
    if (task.input.produce_output) ++outputs[task.input.sid];
  }
  EXPECT_LE(num_tokens, max_batch_tokens);
  EXPECT_LE(num_decodes, max_decode_sequences);
  for (auto [sid, n] : decodes) {
    EXPECT_EQ(n, 1) << "session " << sid;
    EXPECT_EQ(chunks.count(sid), 0u) << "session " << sid << " decodes and prefills";
  }
  for (auto [sid, n] : outputs) EXPECT_LE(n, 1) << "session " << sid;
}

// Every task the scheduler accepted and has not yet returned, with the order in
// which each session's chunks and decodes must come out.
struct Ledger {
  struct Owed {
    SessionId sid = 0;
    bool is_decode = false;
    size_t size = 0;
    uint64_t arrival = 0;  // submission order over all tasks
  };

  void accept(const std::vector<Task>& tasks) {
    for (const Task& task : tasks) {
      ASSERT_EQ(owed.count(task.tid), 0u);
      owed[task.tid] = {task.input.sid, task.is_decode, task.input.size, next_arrival++};
      (task.is_decode ? decode_order : prefill_order)[task.input.sid].push_back(task.tid);
      ++num_accepted;
    }
  }

  // A task handed out by get_work: owed, and the next of its session and kind.
  void settle_dispatched(const Task& task) {
    auto it = owed.find(task.tid);
    ASSERT_NE(it, owed.end()) << "tid " << task.tid << " was not owed";
    ASSERT_EQ(it->second.sid, task.input.sid);
    ASSERT_EQ(it->second.is_decode, task.is_decode);
    ASSERT_EQ(it->second.size, task.input.size);
    std::deque<TaskId>& order = (task.is_decode ? decode_order : prefill_order)[task.input.sid];
    ASSERT_FALSE(order.empty());
    ASSERT_EQ(order.front(), task.tid) << "session " << task.input.sid << " out of order";
    order.pop_front();
    owed.erase(it);
    ++num_returned;
  }

  // Tasks handed back by cancel(sid) or clear(): exactly those owed.
  void settle_cancelled(const std::vector<Task>& tasks, const std::vector<TaskId>& expected) {
    std::vector<TaskId> got = Ids(tasks);
    std::vector<TaskId> want = expected;
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    ASSERT_EQ(got, want);
    for (const Task& task : tasks) {
      ASSERT_TRUE(task.cancelled);
      auto it = owed.find(task.tid);
      ASSERT_EQ(it->second.sid, task.input.sid);
      owed.erase(it);
      ++num_returned;
    }
  }

  std::vector<TaskId> owed_by(SessionId sid) const {
    std::vector<TaskId> ids;
    for (const auto& [tid, entry] : owed) {
      if (entry.sid == sid) ids.push_back(tid);
    }
    return ids;
  }

  void forget_session(SessionId sid) {
    prefill_order.erase(sid);
    decode_order.erase(sid);
  }

  std::map<TaskId, Owed> owed;
  std::map<SessionId, std::deque<TaskId>> prefill_order;
  std::map<SessionId, std::deque<TaskId>> decode_order;
  uint64_t next_arrival = 0;
  size_t num_accepted = 0;
  size_t num_returned = 0;
};

class RandomOperations {
 public:
  static constexpr size_t kBatchTokens = 64;
  static constexpr size_t kDecodeCap = 4;
  static constexpr size_t kChunkTokens = 24;
  static constexpr SessionId kSessions = 6;

  explicit RandomOperations(uint64_t seed)
      : rng_(seed), scheduler_(Make(kBatchTokens, kDecodeCap, kChunkTokens)) {}

  void run(int num_operations) {
    for (int op = 0; op < num_operations; ++op) {
      const int roll = pick(0, 99);
      if (roll < 30) {
        submit_prompt();
      } else if (roll < 50) {
        submit_decodes();
      } else if (roll < 60) {
        submit_invalid_group();
      } else if (roll < 90) {
        get_work();
      } else if (roll < 99) {
        cancel(pick(1, kSessions + 1));  // kSessions + 1 is never used
      } else {
        clear();
      }
      if (::testing::Test::HasFatalFailure()) return;
      check_state();
      if (::testing::Test::HasFatalFailure()) return;
    }
    // Drain: each batch returns at least one task, so this ends.
    while (!ledger_.owed.empty()) {
      get_work();
      if (::testing::Test::HasFatalFailure()) return;
      check_state();
    }
    EXPECT_FALSE(scheduler_->has_work());
    EXPECT_EQ(ledger_.num_accepted, ledger_.num_returned);
    EXPECT_GT(ledger_.num_accepted, static_cast<size_t>(num_operations) / 2);
  }

 private:
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  TaskId new_tid() {
    if (!free_tids_.empty() && pick(0, 9) == 0) {  // reuse a returned id
      const size_t i = static_cast<size_t>(pick(0, static_cast<int>(free_tids_.size()) - 1));
      const TaskId tid = free_tids_[i];
      free_tids_.erase(free_tids_.begin() + static_cast<std::ptrdiff_t>(i));
      return tid;
    }
    return next_tid_++;
  }

  void release(const std::vector<Task>& tasks) {
    for (const Task& task : tasks) free_tids_.push_back(task.tid);
  }

  std::vector<Task> prompt(SessionId sid) {
    std::vector<Task> chunks;
    const int num_chunks = pick(1, 4);
    for (int i = 0; i < num_chunks; ++i) {
      chunks.push_back(
          Chunk(new_tid(), sid, static_cast<size_t>(pick(1, kChunkTokens)), i + 1 == num_chunks));
    }
    return chunks;
  }

  void submit_prompt() {
    std::vector<Task> chunks = prompt(pick(1, kSessions));
    ASSERT_TRUE(scheduler_->submit(chunks));
    ledger_.accept(chunks);
  }

  void submit_decodes() {
    std::vector<Task> decodes;
    const int n = pick(1, 3);
    for (int i = 0; i < n; ++i) decodes.push_back(Decode(new_tid(), pick(1, kSessions)));
    ASSERT_TRUE(scheduler_->submit(decodes));
    ledger_.accept(decodes);
  }

  // A valid prompt spoiled by one bad task at a random place: nothing changes.
  void submit_invalid_group() {
    std::vector<Task> group = prompt(pick(1, kSessions));
    group.push_back(Decode(new_tid(), pick(1, kSessions)));
    Task bad = Chunk(next_tid_++, pick(1, kSessions), 4);
    switch (pick(0, 5)) {
      case 0:
        bad.input.size = 0;
        break;
      case 1:
        bad.input.size = kChunkTokens + 1;
        break;
      case 2:
        bad = Decode(bad.tid, bad.input.sid, 2);
        break;
      case 3:
        bad.tid = group.front().tid;
        break;
      case 4:
        if (!ledger_.owed.empty()) bad.tid = ledger_.owed.begin()->first;
        bad.input.size = 0;  // also empty, in case nothing is owed
        break;
      default:
        bad.cancelled = true;
        break;
    }
    const size_t at = static_cast<size_t>(pick(0, static_cast<int>(group.size())));
    group.insert(group.begin() + static_cast<std::ptrdiff_t>(at), bad);
    const size_t queued = scheduler_->num_queued();
    ASSERT_FALSE(scheduler_->submit(group));
    ASSERT_EQ(scheduler_->num_queued(), queued);
    for (const Task& task : group) {
      if (ledger_.owed.count(task.tid) == 0) free_tids_.push_back(task.tid);
    }
    std::sort(free_tids_.begin(), free_tids_.end());
    free_tids_.erase(std::unique(free_tids_.begin(), free_tids_.end()), free_tids_.end());
  }

  void get_work() {
    std::set<SessionId> with_decodes;
    std::set<SessionId> with_chunks;
    for (const auto& [tid, entry] : ledger_.owed) {
      (entry.is_decode ? with_decodes : with_chunks).insert(entry.sid);
    }
    const bool had_work = !ledger_.owed.empty();

    std::vector<Task> batch = scheduler_->get_work();
    ExpectWellFormedBatch(batch, kBatchTokens, kDecodeCap);
    ASSERT_EQ(batch.empty(), !had_work);

    uint64_t last_decode_arrival = 0;
    size_t num_decodes = 0;
    bool any_chunk = false;
    std::set<SessionId> decoding;
    for (const Task& task : batch) {
      if (task.is_decode) {
        const uint64_t arrival = ledger_.owed.at(task.tid).arrival;
        EXPECT_TRUE(num_decodes == 0 || arrival > last_decode_arrival) << "decodes out of order";
        last_decode_arrival = arrival;
        ++num_decodes;
        decoding.insert(task.input.sid);
      } else {
        any_chunk = true;
      }
      ledger_.settle_dispatched(task);
      if (::testing::Test::HasFatalFailure()) return;
    }
    // Decodes fill their cap from distinct sessions; prefill runs whenever a
    // session not decoding has a chunk (any chunk fits beside a full decode batch).
    EXPECT_EQ(num_decodes, std::min(kDecodeCap, with_decodes.size()));
    bool prefill_possible = false;
    for (SessionId sid : with_chunks) prefill_possible |= decoding.count(sid) == 0;
    EXPECT_EQ(any_chunk, prefill_possible);
    release(batch);
  }

  void cancel(SessionId sid) {
    const std::vector<TaskId> expected = ledger_.owed_by(sid);
    std::vector<Task> cancelled = scheduler_->cancel(sid);
    ledger_.settle_cancelled(cancelled, expected);
    ledger_.forget_session(sid);
    release(cancelled);
  }

  void clear() {
    std::vector<TaskId> expected;
    for (const auto& [tid, entry] : ledger_.owed) expected.push_back(tid);
    std::vector<Task> cleared = scheduler_->clear();
    ledger_.settle_cancelled(cleared, expected);
    ledger_.prefill_order.clear();
    ledger_.decode_order.clear();
    release(cleared);
  }

  void check_state() {
    scheduler_->check_invariants();
    ASSERT_EQ(scheduler_->num_queued(), ledger_.owed.size());
    ASSERT_EQ(scheduler_->has_work(), !ledger_.owed.empty());
  }

  std::mt19937_64 rng_;
  std::unique_ptr<DecodeFirstScheduler> scheduler_;
  Ledger ledger_;
  TaskId next_tid_ = 1;
  std::vector<TaskId> free_tids_;  // returned ids, free for reuse
};

TEST(InvariantTest, AcceptedTasksAreNeverLostOrReturnedTwice) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    RandomOperations operations(seed);
    operations.run(4000);
    if (HasFatalFailure()) return;
  }
}

// Producers submit prompts and decodes for sessions of their own (and now and
// then cancel one) while a consumer takes batches; optional observers poll the
// read-only calls. Every task must come back exactly once, by get_work or cancel.
struct ConcurrentRun {
  static constexpr size_t kBatchTokens = 96;
  static constexpr size_t kDecodeCap = 8;
  static constexpr size_t kChunkTokens = 32;
  static constexpr int kSessionsPerProducer = 4;

  ConcurrentRun(int num_producers, int groups_per_producer)
      : scheduler(Make(kBatchTokens, kDecodeCap, kChunkTokens)) {
    for (int p = 0; p < num_producers; ++p) {
      std::mt19937_64 rng(static_cast<uint64_t>(p) + 11);
      auto pick = [&rng](int lo, int hi) {
        return std::uniform_int_distribution<int>(lo, hi)(rng);
      };
      TaskId tid = (p + 1) * TaskId{1'000'000};
      std::vector<std::vector<Task>> groups;
      for (int g = 0; g < groups_per_producer; ++g) {
        const SessionId sid = (p + 1) * 100 + pick(0, kSessionsPerProducer - 1);
        std::vector<Task> group;
        if (pick(0, 2) == 0) {
          group.push_back(Decode(++tid, sid));
        } else {
          const int num_chunks = pick(1, 3);
          for (int i = 0; i < num_chunks; ++i) {
            group.push_back(
                Chunk(++tid, sid, static_cast<size_t>(pick(1, kChunkTokens)), i + 1 == num_chunks));
          }
        }
        num_tasks += group.size();
        groups.push_back(std::move(group));
      }
      plans.push_back(std::move(groups));
    }
  }

  void run(int num_observers) {
    std::vector<std::vector<Task>> cancelled(plans.size());
    std::vector<Task> dispatched;
    std::atomic<size_t> num_settled{0};
    std::atomic<bool> done{false};

    std::vector<std::thread> threads;
    for (size_t p = 0; p < plans.size(); ++p) {
      threads.emplace_back([&, p] {
        for (size_t g = 0; g < plans[p].size(); ++g) {
          EXPECT_TRUE(scheduler->submit(plans[p][g]));
          if (g % 40 == 39) {
            std::vector<Task> back = scheduler->cancel(plans[p][g].front().input.sid);
            num_settled += back.size();
            for (Task& task : back) cancelled[p].push_back(std::move(task));
          }
        }
      });
    }
    threads.emplace_back([&] {
      while (num_settled.load() < num_tasks) {
        std::vector<Task> batch = scheduler->get_work();
        if (batch.empty()) {
          std::this_thread::yield();
          continue;
        }
        ExpectWellFormedBatch(batch, kBatchTokens, kDecodeCap);
        num_settled += batch.size();
        for (Task& task : batch) dispatched.push_back(std::move(task));
      }
    });
    std::vector<std::thread> observers;
    std::atomic<size_t> num_observations{0};
    for (int o = 0; o < num_observers; ++o) {
      observers.emplace_back([&] {
        do {
          const size_t queued = scheduler->num_queued();
          EXPECT_LE(queued, num_tasks);
          static_cast<void>(scheduler->has_work());
          EXPECT_EQ(scheduler->max_prefill_chunk_size(), kChunkTokens);
          scheduler->check_invariants();
          ++num_observations;
        } while (!done.load());
      });
    }
    for (std::thread& t : threads) t.join();
    done = true;
    for (std::thread& t : observers) t.join();

    EXPECT_FALSE(scheduler->has_work());
    EXPECT_EQ(scheduler->num_queued(), 0u);
    scheduler->check_invariants();
    EXPECT_GE(num_observations.load(), static_cast<size_t>(num_observers));

    // Exactly once: the dispatched and cancelled ids are all the submitted ones.
    std::vector<TaskId> submitted;
    for (const auto& groups : plans) {
      for (const auto& group : groups) {
        for (const Task& task : group) submitted.push_back(task.tid);
      }
    }
    std::vector<TaskId> returned = Ids(dispatched);
    for (const auto& back : cancelled) {
      EXPECT_TRUE(AllCancelled(back));
      for (const Task& task : back) returned.push_back(task.tid);
    }
    std::sort(submitted.begin(), submitted.end());
    std::sort(returned.begin(), returned.end());
    EXPECT_EQ(returned, submitted);

    // Each session's chunks and decodes were dispatched in submission order.
    std::map<std::pair<SessionId, bool>, TaskId> last;
    for (const Task& task : dispatched) {
      TaskId& previous = last[{task.input.sid, task.is_decode}];
      EXPECT_GT(task.tid, previous) << "session " << task.input.sid;
      previous = task.tid;
    }
  }

  std::unique_ptr<DecodeFirstScheduler> scheduler;
  std::vector<std::vector<std::vector<Task>>> plans;  // [producer][group][task]
  size_t num_tasks = 0;
};

TEST(ConcurrencyTest, ProducersAndConsumerMakeProgressWithoutLoss) {
  ConcurrentRun run(/*num_producers=*/4, /*groups_per_producer=*/400);
  run.run(/*num_observers=*/0);
}

TEST(ConcurrencyTest, ObserversAreSafeDuringScheduling) {
  ConcurrentRun run(/*num_producers=*/2, /*groups_per_producer=*/200);
  run.run(/*num_observers=*/3);
}

}  // namespace
}  // namespace cellm
