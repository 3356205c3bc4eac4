// ServeEngine: the first session of every job (serve.h).
#include <utility>

#include "cellm/serve.h"
#include "serve/job_choice.h"

namespace cellm::serve {

ServeEngine::ServeEngine(Runner& runner, Tokenizer tokenizer, ServeMetrics& metrics)
    : runner_(runner), tokenizer_(std::move(tokenizer)), metrics_(metrics) {}

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

Result<std::unique_ptr<Job>> ServeEngine::start(JobSpec spec, Admission::Ticket ticket,
                                                int64_t t_arrival_us) {
  {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    if (stopping_) return InvalidState("the server is shutting down");
  }
  std::unique_ptr<Job> job(new Job(*this, std::move(spec), std::move(ticket), t_arrival_us));
  const std::vector<Token>& prompt = job->spec_.prompt;
  Job::Choice& first = *job->choices_[0];

  // The session opens on the longest cached prefix of the prompt (never the whole
  // prompt: its last token is fed, so choice 0 samples its first token). A scored
  // prompt opens on none: only the tokens a generation feeds are scored.
  std::optional<Session> session = job->spec_.score_prompt
                                       ? runner_.open_session_async().get()
                                       : runner_.open_session_async(prompt).get();
  if (!session) {
    const Status init = runner_.initialize_status();
    if (!init.ok()) return OutOfResources("the executor failed to start: " + init.message());
    return OutOfResources("no session is available (the executor is at capacity or stopping)");
  }
  first.session = std::move(*session);
  const Position matched = first.session.position();
  job->prompt_tokens_cached_ = matched;
  std::vector<Token> delta(prompt.begin() + matched, prompt.end());
  metrics_.add_tokens(static_cast<int64_t>(prompt.size()), 0);
  first.started = true;
  GenerationHandle h =
      first.session.generate_async(std::move(delta), job->config_for(0), job->callback_for(0));
  first.handle = h;
  {
    std::lock_guard<std::mutex> lock(job->cancel_mu_);
    job->handles_.push_back(h);
    if (job->cancelled_) h.cancel();
  }
  return job;
}

}  // namespace cellm::serve
