#include "cpu/kernels/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace cellm::cpu {
namespace {

TEST(ThreadPoolTest, ParallelForCoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 8, 9, 100, 1001}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "threads " << threads << " n " << n;
      }
    }
  }
}

TEST(ThreadPoolTest, ParallelForDynamicCoversEveryIndexOnceInPiecesOfTheGrain) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 5, 64, 1001}) {
      for (int64_t grain : {1, 4, 32, 2000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<bool> bad_piece{false};
        pool.parallel_for_dynamic(n, grain, [&](int64_t begin, int64_t end) {
          // Pieces start at multiples of the grain and span it, but for the last.
          if (begin % grain != 0 || end - begin > grain || (end != n && end - begin != grain)) {
            bad_piece = true;
          }
          for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
        });
        EXPECT_FALSE(bad_piece) << "threads " << threads << " n " << n << " grain " << grain;
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1)
              << "threads " << threads << " n " << n << " grain " << grain;
        }
      }
    }
  }
}

TEST(ThreadPoolTest, ChunksAreContiguousNearEqualAndAtMostOnePerThread) {
  ThreadPool pool(4);
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> chunks;
  pool.parallel_for(10, [&](int64_t begin, int64_t end) {
    std::lock_guard<std::mutex> lock(mu);
    chunks.emplace_back(begin, end);
  });
  std::sort(chunks.begin(), chunks.end());
  const std::vector<std::pair<int64_t, int64_t>> want = {{0, 3}, {3, 6}, {6, 8}, {8, 10}};
  EXPECT_EQ(chunks, want);
  EXPECT_EQ(ThreadPool::chunk(10, 4, 2), (std::pair<int64_t, int64_t>{6, 8}));
}

TEST(ThreadPoolTest, ChunksRunConcurrentlyOnDistinctThreadsIncludingTheCaller) {
  // Every chunk waits until all three have started: only three threads running
  // at once get past it (the timeout turns a hang into a failure).
  ThreadPool pool(3);
  std::mutex mu;
  std::vector<std::thread::id> ids;
  std::atomic<int> started{0};
  std::atomic<bool> timed_out{false};
  pool.parallel_for(3, [&](int64_t, int64_t) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ids.push_back(std::this_thread::get_id());
    }
    started.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (started.load() < 3) {
      if (std::chrono::steady_clock::now() > deadline) {
        timed_out = true;
        return;
      }
      std::this_thread::yield();
    }
  });
  ASSERT_FALSE(timed_out.load());
  ASSERT_EQ(ids.size(), 3u);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::unique(ids.begin(), ids.end()) - ids.begin(), 3);
  EXPECT_NE(std::find(ids.begin(), ids.end(), std::this_thread::get_id()), ids.end());
}

TEST(ThreadPoolTest, ManyBackToBackCallsEachSeeThePreviousCallsWrites) {
  ThreadPool pool(4);
  std::vector<int64_t> data(64, 0);
  for (int round = 0; round < 5000; ++round) {
    pool.parallel_for(64, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) data[static_cast<size_t>(i)] += 1;
    });
  }
  for (int64_t v : data) ASSERT_EQ(v, 5000);
}

TEST(ThreadPoolTest, CallsAfterTheWorkersFellAsleepStillComplete) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // past the spin phase
    pool.parallel_for(300, [&](int64_t begin, int64_t end) { sum.fetch_add(end - begin); });
  }
  EXPECT_EQ(sum.load(), 900);
}

TEST(ThreadPoolTest, NestedParallelForRunsSeriallyInsideAChunk) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(3, [&](int64_t, int64_t) {
    pool.parallel_for(10, [&](int64_t begin, int64_t end) { sum.fetch_add(end - begin); });
  });
  EXPECT_EQ(sum.load(), 30);
}

TEST(ThreadPoolTest, CallersOnDifferentThreadsAreServedOneAtATime) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int r = 0; r < 500; ++r) {
        pool.parallel_for(30, [&](int64_t begin, int64_t end) { sum.fetch_add(end - begin); });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(sum.load(), 4 * 500 * 30);
}

TEST(ThreadPoolTest, ZeroThreadsMeansTheHardwareThreadCount) {
  ThreadPool pool;
  const unsigned hw = std::thread::hardware_concurrency();
  EXPECT_EQ(pool.num_threads(), hw == 0 ? 1 : static_cast<int>(hw));
}

}  // namespace
}  // namespace cellm::cpu
