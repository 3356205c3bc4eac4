// ServeEngine: the prefix cache and the first session of every job (serve.h).
#include <utility>

#include "cellm/serve.h"
#include "serve/job_choice.h"

namespace cellm::serve {

ServeEngine::ServeEngine(Runner& runner, Tokenizer tokenizer, size_t prefix_cache_entries,
                         ServeMetrics& metrics)
    : runner_(runner),
      tokenizer_(std::move(tokenizer)),
      metrics_(metrics),
      cache_(prefix_cache_entries) {}

ServeEngine::~ServeEngine() {
  std::lock_guard<std::mutex> lock(cache_mu_);
  cache_.clear();
}

void ServeEngine::enroll(Job* job) {
  std::lock_guard<std::mutex> lock(jobs_mu_);
  jobs_.insert(job);
}

void ServeEngine::withdraw(Job* job) {
  std::lock_guard<std::mutex> lock(jobs_mu_);
  jobs_.erase(job);
}

void ServeEngine::cancel_all() {
  std::lock_guard<std::mutex> lock(jobs_mu_);
  stopping_ = true;
  for (Job* job : jobs_) job->cancel();
}

void ServeEngine::prefix_stats(ServeGauges& g) {
  std::lock_guard<std::mutex> lock(cache_mu_);
  g.prefix_lookups = cache_.lookups();
  g.prefix_hits = cache_.hits();
  g.prefix_matched_tokens = cache_.matched_tokens_total();
  g.prefix_entries = static_cast<int64_t>(cache_.size());
}

Result<std::unique_ptr<Job>> ServeEngine::start(JobSpec spec, Admission::Ticket ticket,
                                                int64_t t_arrival_us) {
  {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    if (stopping_) return InvalidState("the server is shutting down");
  }
  std::unique_ptr<Job> job(new Job(*this, std::move(spec), std::move(ticket), t_arrival_us));
  const std::vector<Token>& prompt = job->spec_.prompt;
  Job::Choice& first = *job->choices_[0];

  std::optional<PrefixMatch> hit;
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    hit = cache_.lookup(prompt);
  }
  std::vector<Token> delta;
  if (hit) {
    first.session = std::move(hit->session);
    job->prompt_tokens_cached_ = static_cast<int64_t>(hit->matched_tokens);
    delta.assign(prompt.begin() + static_cast<std::ptrdiff_t>(hit->matched_tokens), prompt.end());
  } else {
    std::optional<Session> session = runner_.open_session_async().get();
    if (!session) {
      const Status init = runner_.initialize_status();
      if (!init.ok()) return OutOfResources("the executor failed to start: " + init.message());
      return OutOfResources("no session is available (the executor is at capacity or stopping)");
    }
    first.session = std::move(*session);
    delta = prompt;
  }
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    job->capture_ = cache_.capture_prompt(first.session, prompt);
  }
  metrics_.add_tokens(static_cast<int64_t>(prompt.size()), 0);
  first.started = true;
  GenerationHandle h = first.session.generate_async(std::move(delta), job->config_for(0),
                                                    job->capture_.wrap(job->callback_for(0)));
  first.handle = h;
  {
    std::lock_guard<std::mutex> lock(job->cancel_mu_);
    job->handles_.push_back(h);
    if (job->cancelled_) h.cancel();
  }
  return job;
}

}  // namespace cellm::serve
