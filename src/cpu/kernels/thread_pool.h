// ThreadPool: a small persistent pool for the CPU kernels' data parallelism.
//
// `parallel_for(n, fn)` splits [0, n) into min(n, num_threads()) contiguous chunks
// of near-equal size (static chunking: the chunk boundaries depend only on n and
// the thread count) and runs fn(begin, end) once per chunk; it returns when every
// chunk is done. Chunks are claimed from a shared counter by the caller and the
// workers alike, so a worker that is slow to wake (or descheduled on a busy
// machine) never holds a call up: the caller runs the chunks nobody took.
// Built for many short calls (about ten per layer per step): idle workers spin a
// while on the job counter, then sleep on it (futex via std::atomic::wait), so
// back-to-back calls cost microseconds and an idle pool costs no CPU.
//
// Thread-safety: parallel_for may be called from any thread; calls from different
// threads are serialised. A parallel_for issued from inside a chunk (nesting) runs
// serially on the calling thread. fn must not throw.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace cellm::cpu {

class ThreadPool {
 public:
  // num_threads: threads that run chunks, the caller included; 0 means
  // std::thread::hardware_concurrency(). REQUIRES: num_threads >= 0.
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Runs fn(begin, end) over a static partition of [0, n) into
  // min(n, num_threads()) chunks. n <= 0 does nothing.
  template <typename Fn>
  void parallel_for(int64_t n, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    // F keeps fn's constness; the pointer is cast back to F* before the call.
    run(n, const_cast<void*>(static_cast<const void*>(&fn)),
        [](void* ctx, int64_t begin, int64_t end) { (*static_cast<F*>(ctx))(begin, end); });
  }

  // Runs fn(begin, end) over [0, n) in pieces of `grain` (the last may be shorter)
  // that the threads claim in order from a shared counter (dynamic chunking): for
  // work whose pieces cost unequal time, or whose threads may lose their core for a
  // while on a busy machine. n <= grain runs fn(0, n) on the caller. REQUIRES: grain > 0.
  template <typename Fn>
  void parallel_for_dynamic(int64_t n, int64_t grain, Fn&& fn) {
    if (n <= 0) return;
    if (n <= grain) {
      fn(int64_t{0}, n);
      return;
    }
    std::atomic<int64_t> next{0};
    parallel_for(num_threads_, [&](int64_t, int64_t) {
      for (;;) {
        const int64_t begin = next.fetch_add(grain, std::memory_order_relaxed);
        if (begin >= n) return;
        fn(begin, begin + grain < n ? begin + grain : n);
      }
    });
  }

  // Chunk t of a static partition of [0, n) into `parts` chunks: [begin, end).
  static std::pair<int64_t, int64_t> chunk(int64_t n, int parts, int t) {
    const int64_t base = n / parts, extra = n % parts;
    const int64_t begin = t * base + (t < extra ? t : extra);
    return {begin, begin + base + (t < extra ? 1 : 0)};
  }

 private:
  using Trampoline = void (*)(void* ctx, int64_t begin, int64_t end);

  void run(int64_t n, void* ctx, Trampoline call);
  // Claims and runs chunks of the current job until none is left.
  void run_chunks();
  void worker_loop();

  const int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // serialises parallel_for callers

  // The current job; written only while no chunk of the previous job is claimed
  // or running, read only by a thread holding a claimed chunk.
  void* job_ctx_ = nullptr;
  Trampoline job_call_ = nullptr;
  int64_t job_n_ = 0;

  // (job id << 32) | (chunk count << 16) | next unclaimed chunk.
  std::atomic<uint64_t> ticket_{0};
  std::atomic<int> chunks_done_{0};      // chunks of the current job finished
  std::atomic<uint64_t> generation_{0};  // bumped per job and at shutdown; workers wait on it
  std::atomic<int> sleepers_{0};         // workers blocked in generation_.wait
  std::atomic<bool> stop_{false};
};

}  // namespace cellm::cpu
