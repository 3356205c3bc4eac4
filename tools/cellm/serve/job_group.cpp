#include "serve/job_group.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace cellm::cli {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(50);

// What the worker threads share with the calling thread.
struct Funnel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<ChoiceDelta> deltas;  // guarded by mu
  int32_t running = 0;             // guarded by mu
  std::atomic<bool> alive{true};   // false once the client is gone
};

// A worker's sink: renumbers the job's choices and queues its deltas.
class FunnelSink final : public JobSink {
 public:
  FunnelSink(Funnel& funnel, int32_t offset) : funnel_(funnel), offset_(offset) {}
  bool deliver(const ChoiceDelta& delta) override {
    ChoiceDelta d = delta;
    d.index += offset_;
    {
      std::lock_guard<std::mutex> lock(funnel_.mu);
      funnel_.deltas.push_back(std::move(d));
    }
    funnel_.cv.notify_one();
    return funnel_.alive.load();
  }
  bool alive() override { return funnel_.alive.load(); }

 private:
  Funnel& funnel_;
  const int32_t offset_;
};

}  // namespace

std::vector<JobSummary> run_job_group(const std::vector<std::shared_ptr<Job>>& jobs, int32_t n,
                                      JobSink& sink) {
  std::vector<JobSummary> summaries(jobs.size());
  if (jobs.size() == 1) {
    summaries[0] = run_logged(*jobs[0], sink);
    return summaries;
  }
  Funnel funnel;
  funnel.running = static_cast<int32_t>(jobs.size());
  std::vector<std::thread> workers;
  for (size_t k = 0; k < jobs.size(); ++k) {
    workers.emplace_back([&, k] {
      FunnelSink worker_sink(funnel, static_cast<int32_t>(k) * n);
      summaries[k] = jobs[k]->run(worker_sink);
      {
        std::lock_guard<std::mutex> lock(funnel.mu);
        funnel.running--;
      }
      funnel.cv.notify_one();
    });
  }
  auto t_next_poll = std::chrono::steady_clock::now() + kPollInterval;
  while (true) {
    std::deque<ChoiceDelta> deltas;
    bool done = false;
    {
      std::unique_lock<std::mutex> lock(funnel.mu);
      funnel.cv.wait_until(lock, t_next_poll,
                           [&] { return !funnel.deltas.empty() || funnel.running == 0; });
      deltas.swap(funnel.deltas);
      done = funnel.running == 0;
    }
    for (const ChoiceDelta& d : deltas) {
      if (funnel.alive.load() && !sink.deliver(d)) funnel.alive.store(false);
    }
    if (done) break;
    if (std::chrono::steady_clock::now() >= t_next_poll) {
      if (!sink.alive()) funnel.alive.store(false);
      t_next_poll = std::chrono::steady_clock::now() + kPollInterval;
    }
  }
  for (std::thread& w : workers) w.join();
  const JobSummary total = sum_summaries(summaries);
  request_log().completion_tokens = total.completion_tokens;
  request_log().client_gone = total.client_gone;
  return summaries;
}

JobSummary sum_summaries(const std::vector<JobSummary>& summaries) {
  JobSummary total;
  for (const JobSummary& s : summaries) {
    total.prompt_tokens += s.prompt_tokens;
    total.prompt_tokens_cached += s.prompt_tokens_cached;
    total.completion_tokens += s.completion_tokens;
    total.client_gone = total.client_gone || s.client_gone;
  }
  return total;
}

}  // namespace cellm::cli
