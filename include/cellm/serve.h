// The serving library (cellm_serve): requests to sessions without HTTP. An embedder
// links it beside cellm_engine, builds a ServeEngine over the engine's Runner and
// tokenizer, and runs each request as a Job that delivers text deltas to a JobSink:
//
//   cellm::serve::ServeMetrics metrics;
//   cellm::serve::ServeEngine serving(engine.runner(), *engine.tokenizer(), metrics);
//   auto job = serving.start(spec, {}, cellm::now_us());   // Result<unique_ptr<Job>>
//   (*job)->run(my_sink);                                   // on the caller's thread
//
// What it owns: n-choice requests (choices 1..n-1 are clones of choice 0's prompt),
// detokenization with stop strings, admission of requests to session slots, and the
// serving counters rendered as Prometheus text. The prefix cache is the executor's
// (every session opens on the longest cached prefix of its prompt: Runner::
// open_session_async(prompt)). The HTTP front end of `cellm serve` (tools/cellm/serve/)
// is one user of it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "cellm/metrics.h"
#include "cellm/runner.h"
#include "cellm/status.h"
#include "cellm/tokenizer.h"

namespace cellm::serve {

// Admission: who may hold generation sessions now, and who waits for them.
//
// The server has `max_sessions` session slots for generations (a request with
// n choices takes n). A request that cannot take its slots at once waits in a
// FIFO queue of at most `max_queued` requests; one more is refused at once (the
// caller refuses the request: HTTP 429 in `cellm serve`). Slots are handed out strictly in arrival
// order, so a request wanting several slots is never starved by later single ones. A Ticket
// (move-only) gives its slots back when destroyed. close() refuses every waiting and later request
// (shutdown).
//
// Thread-safe.
class Admission {
 public:
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept;
    Ticket& operator=(Ticket&& other) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket();
    int32_t slots() const { return slots_; }

   private:
    friend class Admission;
    Ticket(Admission* owner, int32_t slots) : owner_(owner), slots_(slots) {}
    Admission* owner_ = nullptr;
    int32_t slots_ = 0;
  };

  enum class Refusal { kQueueFull, kClosed };

  Admission(int32_t max_sessions, int32_t max_queued);

  // Blocks until `slots` slots are free and every earlier waiter is served.
  // REQUIRES: 1 <= slots <= max_sessions.
  // Returns the refusal instead when the queue is full or admission is closed.
  std::variant<Ticket, Refusal> acquire(int32_t slots);

  // Wakes every waiter with kClosed; later acquire() calls are refused.
  void close();

  int32_t waiting() const;
  int32_t slots_in_use() const;
  int32_t requests_admitted() const;  // tickets alive now

 private:
  void release(int32_t slots);

  const int32_t max_sessions_;
  const int32_t max_queued_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<uint64_t> queue_;  // guarded by mu_; waiter numbers, oldest first
  uint64_t next_waiter_ = 0;    // guarded by mu_
  int32_t in_use_ = 0;          // guarded by mu_
  int32_t admitted_ = 0;        // guarded by mu_
  bool closed_ = false;         // guarded by mu_
};

// ServeMetrics: the server's own counters and latency histograms, rendered with
// the Runner's engine and KV gauges as Prometheus text (GET /metrics).
//
// Names (all prefixed cellm_):
//   http_requests_total{path,code}       answered requests
//   requests_finished_total{finish_reason} generations by finish reason
//                                          (stop, length, cancelled, error)
//   prompt_tokens_total, generation_tokens_total
//   time_to_first_token_seconds          histogram, request arrival -> first token
//   inter_token_latency_seconds          histogram, gaps between delivered tokens
//   requests_waiting, requests_running, sessions_running   gauges (admission)
//   kv_cells_used, kv_cells_cached, kv_cells_free, kv_cells_capacity, kv_cells_reserved
//                                        gauges (Runner::kv_metrics()): cells generations
//                                        hold, cells only the prefix cache holds
//                                        (evictable), cells nobody holds; kv_cells_in_use
//                                        is used + sessions the server keeps idle
//   prefix_cache_lookups_total, prefix_cache_hits_total,
//   prefix_cache_matched_tokens_total, prefix_cache_evicted_cells_total
//   engine_steps_total, engine_steps_failed_total, engine_queued_tasks
//   generations_waiting_for_kv, preemptions_total, recomputed_tokens_total
//                                        the runner's KV policy (Runner::metrics())
//
// Thread-safe: every method may be called from any handler thread (never from
// a runner callback; they take a mutex).
// A cumulative histogram with fixed upper bounds, in seconds.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds_s);
  void observe(double seconds);
  // "# HELP", "# TYPE" and the _bucket/_sum/_count lines.
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket, not cumulative; one more for +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

// A point-in-time view of what the server does not own itself.
struct ServeGauges {
  int32_t requests_waiting = 0;
  int32_t requests_running = 0;
  int32_t sessions_running = 0;
  KvMetrics kv;
  EngineMetrics engine;
  int64_t queued_tasks = 0;
};

class ServeMetrics {
 public:
  ServeMetrics();

  void count_http(const std::string& path, int status);
  // One generation (one choice) ended: "stop", "length", "cancelled" or "error".
  void count_finish(const std::string& finish_reason);
  void add_tokens(int64_t prompt_tokens, int64_t generated_tokens);
  void observe_ttft(double seconds);
  void observe_itl(double seconds);

  std::string render(const ServeGauges& gauges) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> http_;  // guarded by mu_
  std::map<std::string, int64_t> finished_;              // guarded by mu_
  int64_t prompt_tokens_ = 0;                            // guarded by mu_
  int64_t generated_tokens_ = 0;                         // guarded by mu_
  Histogram ttft_;                                       // guarded by mu_
  Histogram itl_;                                        // guarded by mu_
};

// ServeEngine and Job: one request's generations, from its admitted session
// slots to its last token, on the thread that runs it (in `cellm serve`, the HTTP
// handler thread that serves the request).
//
// ServeEngine::start() opens the request's first session on the longest cached
// prefix of its prompt (the executor's prefix cache: its cells are shared, not
// recomputed) and starts choice 0 with the rest. Job::run() then drives
// everything on the calling thread:
//   - Runner callbacks (engine thread) only append to the job's event queue
//     under its mutex and notify; the handler thread waits on it.
//   - When choice 0 delivers its first token the prompt is in the KV cache;
//     choices 1..n-1 are clones of it at prompt length - 1 (Session::clone_async,
//     cells shared) that feed the last prompt token and sample with seed + i.
//   - Tokens become text through an IncrementalDecoder (special tokens skipped)
//     and a StopMatcher; a stop string cancels that choice at once.
//   - The sink reports a client that has gone (a failed write or a closed
//     socket): every choice is cancelled and the job ends within one step.
//   - A choice's session is destroyed as soon as the choice has ended (and, for
//     choice 0, its clones are taken): its cells become the prefix cache's, so
//     a finished choice never holds cells another generation waits for.
// When run() returns, every generation has ended and every session is
// destroyed; the admission ticket is released with the Job.

// One request: its prompt and how to generate its choices.
struct JobSpec {
  std::vector<Token> prompt;       // non-empty, fits a session with max_tokens
  int32_t max_tokens = 16;         // per choice
  SamplingParams sampling;         // num_logprobs set when logprobs were asked for
  std::vector<Token> stop_tokens;  // e.g. the tokenizer's EOS ids
  std::optional<uint64_t> seed;    // choice i: seed + i
  int32_t n = 1;
  std::vector<std::string> stop;  // stop strings
  // Choice i's logits processor (GenConfig::processor), or none when unset. A stop
  // token never adds text, whether special or not.
  std::function<std::shared_ptr<LogitsProcessor>(int32_t choice)> processor_for;
  // Score the prompt (GenConfig::score_prompt): the first session opens without a
  // cached prefix, so the whole prompt is fed and scored, and every choice's first
  // delta carries ChoiceDelta::prompt_logprobs. The executor must support scoring.
  bool score_prompt = false;
};

// What one choice produced since its previous delta.
struct ChoiceDelta {
  int32_t index = 0;
  std::string text;                     // safe to send: no part of a stop string
  std::vector<Token> tokens;            // delivered with this delta
  std::vector<TokenLogprobs> logprobs;  // parallel to tokens when asked for
  // With JobSpec::score_prompt, on the choice's first delta: one entry per prompt
  // token after the first (sampling.num_logprobs alternatives each).
  std::vector<TokenLogprobs> prompt_logprobs;
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
  // One choice's session, generation, detokenizer and stop matcher (job.cpp).
  struct Choice;

  Job(ServeEngine& engine, JobSpec spec, Admission::Ticket ticket, int64_t t_arrival_us);
  GenerationCallback callback_for(int32_t index) const;
  GenConfig config_for(int32_t index) const;
  void start_clones();
  // Destroys the session of every choice that has ended (once the clones are
  // taken): its cells go to the prefix cache instead of waiting for the job's end.
  void release_ended_sessions();
  // Turns one event into a delta (nullopt: nothing to say).
  std::optional<ChoiceDelta> process(Event& event);
  void settle();  // cancel + wait for every started generation

  ServeEngine& engine_;
  const JobSpec spec_;
  Admission::Ticket ticket_;
  const int64_t t_arrival_us_;
  std::shared_ptr<Channel> channel_ = std::make_shared<Channel>();
  std::vector<std::unique_ptr<Choice>> choices_;
  int64_t prompt_tokens_cached_ = 0;
  std::vector<TokenLogprobs> prompt_logprobs_;  // choice 0's, for every choice's first delta
  bool clones_started_ = false;

  std::mutex cancel_mu_;
  bool cancelled_ = false;                 // guarded by cancel_mu_
  std::vector<GenerationHandle> handles_;  // guarded by cancel_mu_; started generations
};

class ServeEngine {
 public:
  ServeEngine(Runner& runner, Tokenizer tokenizer, ServeMetrics& metrics);

  // Takes the first session and starts choice 0; `ticket` is the request's admission
  // (an empty Ticket when the caller admits requests itself) and is released with the Job.
  // InvalidState once cancel_all() has run; OutOfResources when the executor has no
  // session to give (it is at capacity or the runner is stopping).
  Result<std::unique_ptr<Job>> start(JobSpec spec, Admission::Ticket ticket, int64_t t_arrival_us);
  // Shutdown: cancels every job now running; later jobs are refused (InvalidState).
  void cancel_all();

  const Tokenizer& tokenizer() const { return tokenizer_; }
  Runner& runner() { return runner_; }
  ServeMetrics& metrics() { return metrics_; }

 private:
  friend class Job;
  void enroll(Job* job);
  void withdraw(Job* job);

  Runner& runner_;
  const Tokenizer tokenizer_;
  ServeMetrics& metrics_;

  std::mutex jobs_mu_;
  std::set<Job*> jobs_;    // guarded by jobs_mu_
  bool stopping_ = false;  // guarded by jobs_mu_
};

}  // namespace cellm::serve
