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
//   kv_cells_in_use, kv_cells_capacity   gauges (Runner::kv_metrics())
//   prefix_cache_lookups_total, prefix_cache_hits_total,
//   prefix_cache_matched_tokens_total, prefix_cache_entries
//   engine_steps_total, engine_queued_tasks
//
// Thread-safe: every method may be called from any handler thread (never from
// a runner callback; they take a mutex).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cellm/metrics.h"

namespace cellm::cli {

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
  int64_t prefix_lookups = 0;
  int64_t prefix_hits = 0;
  int64_t prefix_matched_tokens = 0;
  int64_t prefix_entries = 0;
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

}  // namespace cellm::cli
