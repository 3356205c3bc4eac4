#include "cpu/kernels/thread_pool.h"

#include "cellm/status.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CELLM_CPU_RELAX() _mm_pause()
#else
#define CELLM_CPU_RELAX() std::this_thread::yield()
#endif

namespace cellm::cpu {
namespace {

// Spin iterations (each one pause, ~30-100 ns on x86) before a waiter sleeps.
constexpr int kSpinIterations = 2000;

thread_local bool t_inside_pool = false;

int resolve_threads(int num_threads) {
  CELLM_CHECK_MSG(num_threads >= 0, "ThreadPool needs num_threads >= 0");
  if (num_threads > 0) return num_threads;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(resolve_threads(num_threads)) {
  // REQUIRES: a chunk count that fits the ticket's 16-bit fields.
  CELLM_CHECK_MSG(num_threads_ < (1 << 16), "ThreadPool: too many threads");
  workers_.reserve(static_cast<size_t>(num_threads_ - 1));
  for (int w = 1; w < num_threads_; ++w) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::run(int64_t n, void* ctx, Trampoline call) {
  if (n <= 0) return;
  const int parts = static_cast<int>(n < num_threads_ ? n : num_threads_);
  if (parts == 1 || t_inside_pool) {
    call(ctx, 0, n);
    return;
  }
  std::lock_guard<std::mutex> lock(call_mutex_);
  job_ctx_ = ctx;
  job_call_ = call;
  job_n_ = n;
  chunks_done_.store(0, std::memory_order_relaxed);
  const uint64_t job = (ticket_.load(std::memory_order_relaxed) >> 32) + 1;
  ticket_.store((job << 32) | (uint64_t(parts) << 16), std::memory_order_release);
  // seq_cst on generation_ and sleepers_ (here and in worker_loop): either this
  // load sees a sleeper, or that sleeper's wait() sees the new generation.
  generation_.fetch_add(1);
  if (sleepers_.load() > 0) generation_.notify_all();

  t_inside_pool = true;
  run_chunks();
  t_inside_pool = false;

  // Chunks claimed by workers may still be running.
  int done = chunks_done_.load(std::memory_order_acquire);
  for (int spin = 0; done != parts && spin < kSpinIterations; ++spin) {
    CELLM_CPU_RELAX();
    done = chunks_done_.load(std::memory_order_acquire);
  }
  while (done != parts) {
    chunks_done_.wait(done, std::memory_order_acquire);
    done = chunks_done_.load(std::memory_order_acquire);
  }
}

void ThreadPool::run_chunks() {
  uint64_t ticket = ticket_.load(std::memory_order_acquire);
  for (;;) {
    const auto parts = static_cast<int>((ticket >> 16) & 0xffffu);
    const auto next = static_cast<int>(ticket & 0xffffu);
    if (next >= parts) return;
    // A successful claim means the job's chunk `next` is not done, so its caller
    // is still waiting and the job fields stay as published (acquire via the CAS).
    if (!ticket_.compare_exchange_weak(ticket, ticket + 1, std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
      continue;
    }
    const auto [begin, end] = chunk(job_n_, parts, next);
    job_call_(job_ctx_, begin, end);
    if (chunks_done_.fetch_add(1, std::memory_order_acq_rel) + 1 == parts) {
      chunks_done_.notify_one();
    }
    ticket = ticket_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_loop() {
  t_inside_pool = true;
  uint64_t seen = 0;
  for (;;) {
    uint64_t now = generation_.load(std::memory_order_acquire);
    for (int spin = 0; now == seen && spin < kSpinIterations; ++spin) {
      CELLM_CPU_RELAX();
      now = generation_.load(std::memory_order_acquire);
    }
    while (now == seen) {
      sleepers_.fetch_add(1);
      // A publisher that missed this count has already bumped the generation,
      // so wait() returns at once.
      generation_.wait(seen);
      sleepers_.fetch_sub(1);
      now = generation_.load(std::memory_order_acquire);
    }
    seen = now;
    if (stop_.load(std::memory_order_acquire)) return;
    run_chunks();
  }
}

}  // namespace cellm::cpu
