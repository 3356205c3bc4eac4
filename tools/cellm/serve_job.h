// ServeEngine and Job: one request's generations, from its admitted session
// slots to its last token, on the HTTP handler thread that serves it.
//
// ServeEngine::start() takes the request's first session, from the prefix
// cache (the longest cached prefix of the prompt, cloned) or freshly opened,
// and starts choice 0 on it with a prompt capture, so the prompt becomes a
// cached snapshot at its first output. Job::run() then drives everything on
// the calling thread:
//   - Runner callbacks (engine thread) only append to the job's event queue
//     under its mutex and notify; the handler thread waits on it.
//   - When choice 0 delivers its first token the prompt is in the KV cache;
//     choices 1..n-1 are clones of it at prompt length - 1 (Session::clone_async,
//     cells shared) that feed the last prompt token and sample with seed + i.
//   - Tokens become text through an IncrementalDecoder (special tokens skipped)
//     and a StopMatcher; a stop string cancels that choice at once.
//   - The sink reports a client that has gone (a failed write or a closed
//     socket): every choice is cancelled and the job ends within one step.
// When run() returns, every generation has ended, the prompt snapshot has been
// collected into the cache and the sessions are destroyed (their cells go back
// to the pool); the admission ticket is released with the Job.
//
// The PrefixCache is used only on handler threads, under ServeEngine's mutex,
// never from a runner callback.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cellm/prefix_cache.h"
#include "cellm/runner.h"
#include "cellm/tokenizer.h"
#include "serve_admission.h"
#include "serve_error.h"
#include "serve_metrics.h"
#include "stop_matcher.h"

namespace cellm::cli {

struct JobSpec {
  std::vector<Token> prompt;       // non-empty, fits a session with max_tokens
  int32_t max_tokens = 16;         // per choice
  SamplingParams sampling;         // num_logprobs set when logprobs were asked for
  std::vector<Token> stop_tokens;  // EOS unless ignore_eos
  std::optional<uint64_t> seed;    // choice i: seed + i
  int32_t n = 1;
  std::vector<std::string> stop;  // stop strings
};

// What one choice produced since its previous delta.
struct ChoiceDelta {
  int32_t index = 0;
  std::string text;                     // safe to send: no part of a stop string
  std::vector<Token> tokens;            // delivered with this delta
  std::vector<TokenLogprobs> logprobs;  // parallel to tokens when asked for
  // On the last delta: "stop", "length", "cancelled" or "error".
  std::optional<std::string> finish_reason;
  std::string error_message;  // with "error"
};

// Where a job's output goes. Both calls return false once the client is gone.
class JobSink {
 public:
  virtual ~JobSink() = default;
  virtual bool deliver(const ChoiceDelta& delta) = 0;
  // Polled while the job runs (about every 50 ms).
  virtual bool alive() = 0;
};

struct JobSummary {
  int64_t prompt_tokens = 0;
  int64_t prompt_tokens_cached = 0;  // served by the prefix cache
  int64_t completion_tokens = 0;     // over all choices
  bool client_gone = false;
};

class ServeEngine;

class Job {
 public:
  ~Job();  // cancels whatever still runs and waits for it to end
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  // Drives the job to its end on the calling thread. Call once.
  JobSummary run(JobSink& sink);
  // From any thread: ends every generation of the job within one step.
  void cancel();

 private:
  friend class ServeEngine;
  struct Event {
    int32_t index = 0;
    GenerationUpdate update;
    int64_t t_us = 0;  // delivery time on the engine thread
  };
  // The queue the runner callbacks feed; shared with them.
  struct Channel {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Event> events;  // guarded by mu
  };
  struct Choice {
    explicit Choice(const Tokenizer& tok, std::vector<std::string> stops)
        : decoder(tok, /*skip_special_tokens=*/true), matcher(std::move(stops)) {}
    Session session;
    GenerationHandle handle;
    IncrementalDecoder decoder;
    StopMatcher matcher;
    bool started = false;
    bool ended = false;       // its terminal update arrived (or it never started)
    bool stop_found = false;  // a stop string ended it; later tokens are dropped
    int64_t n_tokens = 0;
    int64_t t_last_token_us = 0;
  };

  Job(ServeEngine& engine, JobSpec spec, Admission::Ticket ticket, int64_t t_arrival_us);
  GenerationCallback callback_for(int32_t index) const;
  GenConfig config_for(int32_t index) const;
  void start_clones();
  // Turns one event into a delta (nullopt: nothing to say).
  std::optional<ChoiceDelta> process(Event& event);
  void settle();  // cancel + wait for every started generation

  ServeEngine& engine_;
  const JobSpec spec_;
  Admission::Ticket ticket_;
  const int64_t t_arrival_us_;
  std::shared_ptr<Channel> channel_ = std::make_shared<Channel>();
  std::vector<std::unique_ptr<Choice>> choices_;
  PromptCapture capture_;
  int64_t prompt_tokens_cached_ = 0;
  bool clones_started_ = false;

  std::mutex cancel_mu_;
  bool cancelled_ = false;                 // guarded by cancel_mu_
  std::vector<GenerationHandle> handles_;  // guarded by cancel_mu_; started generations
};

class ServeEngine {
 public:
  ServeEngine(Runner& runner, Tokenizer tokenizer, size_t prefix_cache_entries,
              ServeMetrics& metrics);
  ~ServeEngine();

  // Takes the first session and starts choice 0. 503 when the executor has no
  // session to give (or the runner is stopping).
  ApiResult<std::unique_ptr<Job>> start(JobSpec spec, Admission::Ticket ticket,
                                        int64_t t_arrival_us);
  // Shutdown: cancels every job now running; later jobs are refused (503).
  void cancel_all();

  const Tokenizer& tokenizer() const { return tokenizer_; }
  Runner& runner() { return runner_; }
  ServeMetrics& metrics() { return metrics_; }
  // Prefix-cache counters for /metrics: lookups, hits, matched tokens, entries.
  void prefix_stats(ServeGauges& g);

 private:
  friend class Job;
  void enroll(Job* job);
  void withdraw(Job* job);

  Runner& runner_;
  const Tokenizer tokenizer_;
  ServeMetrics& metrics_;

  std::mutex cache_mu_;
  PrefixCache cache_;  // guarded by cache_mu_

  std::mutex jobs_mu_;
  std::set<Job*> jobs_;    // guarded by jobs_mu_
  bool stopping_ = false;  // guarded by jobs_mu_
};

}  // namespace cellm::cli
