#include "cellm/serve.h"

#include <algorithm>
#include <cstdio>

namespace cellm::serve {
namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void line(std::string& out, const std::string& name, double value) {
  out += name + " " + number(value) + "\n";
}

void head(std::string& out, const std::string& name, const char* type, const std::string& help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

// Prometheus label values escape backslash, quote and newline.
std::string label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds_s)
    : bounds_(std::move(upper_bounds_s)), counts_(bounds_.size() + 1, 0) {
  std::sort(bounds_.begin(), bounds_.end());
}

void Histogram::observe(double seconds) {
  const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), seconds);
  counts_[static_cast<size_t>(it - bounds_.begin())]++;
  sum_ += seconds;
  count_++;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  head(out, name, "histogram", help);
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += name + "_bucket{le=\"" + number(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  line(out, name + "_sum", sum_);
  out += name + "_count " + std::to_string(count_) + "\n";
}

ServeMetrics::ServeMetrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5}) {}

void ServeMetrics::count_http(const std::string& path, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  http_[{path, status}]++;
}

void ServeMetrics::count_finish(const std::string& finish_reason) {
  std::lock_guard<std::mutex> lock(mu_);
  finished_[finish_reason]++;
}

void ServeMetrics::add_tokens(int64_t prompt_tokens, int64_t generated_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += prompt_tokens;
  generated_tokens_ += generated_tokens;
}

void ServeMetrics::observe_ttft(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.observe(seconds);
}

void ServeMetrics::observe_itl(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  itl_.observe(seconds);
}

std::string ServeMetrics::render(const ServeGauges& g) const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  head(out, "cellm_http_requests_total", "counter", "HTTP requests answered, by path and status.");
  for (const auto& [key, n] : http_) {
    out += "cellm_http_requests_total{path=\"" + label(key.first) + "\",code=\"" +
           std::to_string(key.second) + "\"} " + std::to_string(n) + "\n";
  }
  head(out, "cellm_requests_finished_total", "counter",
       "Generations (one per choice) by finish reason.");
  for (const char* reason : {"stop", "length", "cancelled", "error"}) {
    const auto it = finished_.find(reason);
    out += std::string("cellm_requests_finished_total{finish_reason=\"") + reason + "\"} " +
           std::to_string(it == finished_.end() ? 0 : it->second) + "\n";
  }
  head(out, "cellm_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.");
  line(out, "cellm_prompt_tokens_total", static_cast<double>(prompt_tokens_));
  head(out, "cellm_generation_tokens_total", "counter", "Tokens generated.");
  line(out, "cellm_generation_tokens_total", static_cast<double>(generated_tokens_));
  ttft_.render(out, "cellm_time_to_first_token_seconds",
               "From request arrival to its first generated token.");
  itl_.render(out, "cellm_inter_token_latency_seconds", "Gaps between delivered tokens.");

  const std::pair<const char*, double> gauges[] = {
      {"cellm_requests_waiting", g.requests_waiting},
      {"cellm_requests_running", g.requests_running},
      {"cellm_sessions_running", g.sessions_running},
      {"cellm_kv_cells_used", static_cast<double>(g.kv.cells_in_use)},
      {"cellm_kv_cells_in_use", static_cast<double>(g.kv.cells_in_use)},
      {"cellm_kv_cells_cached", static_cast<double>(g.kv.cells_cached)},
      {"cellm_kv_cells_free",
       static_cast<double>(g.kv.cells_capacity - g.kv.cells_in_use - g.kv.cells_cached)},
      {"cellm_kv_cells_capacity", static_cast<double>(g.kv.cells_capacity)},
      {"cellm_kv_cells_reserved", static_cast<double>(g.kv.cells_reserved)},
      {"cellm_kv_allocated_bytes", static_cast<double>(g.kv.allocated_bytes)},
      {"cellm_engine_queued_tasks", static_cast<double>(g.queued_tasks)},
      {"cellm_generations_waiting_for_kv", static_cast<double>(g.engine.generations_waiting)},
  };
  const char* gauge_help[] = {
      "Requests waiting for session slots (the admission queue).",
      "Requests holding session slots.",
      "Session slots held by generations.",
      "KV cells held by sessions (running generations).",
      "KV cells held by sessions (the same as cellm_kv_cells_used).",
      "KV cells only the prefix cache holds (evicted when cells are needed).",
      "KV cells nobody holds.",
      "KV cells the pool may hand out.",
      "KV cells reserved for admitted generations and not yet taken.",
      "KV storage allocated, bytes.",
      "Tasks queued in the scheduler.",
      "Generations waiting for KV cells (not yet admitted, or preempted).",
  };
  for (size_t i = 0; i < std::size(gauges); ++i) {
    head(out, gauges[i].first, "gauge", gauge_help[i]);
    line(out, gauges[i].first, gauges[i].second);
  }
  const std::pair<const char*, double> counters[] = {
      {"cellm_prefix_cache_lookups_total", static_cast<double>(g.kv.prefix_lookups)},
      {"cellm_prefix_cache_hits_total", static_cast<double>(g.kv.prefix_hits)},
      {"cellm_prefix_cache_matched_tokens_total", static_cast<double>(g.kv.prefix_hit_tokens)},
      {"cellm_prefix_cache_evicted_cells_total", static_cast<double>(g.kv.evicted_cells)},
      {"cellm_engine_steps_total", static_cast<double>(g.engine.steps)},
      {"cellm_engine_steps_failed_total", static_cast<double>(g.engine.steps_failed)},
      {"cellm_preemptions_total", static_cast<double>(g.engine.preemptions)},
      {"cellm_recomputed_tokens_total", static_cast<double>(g.engine.recomputed_tokens)},
  };
  const char* counter_help[] = {
      "Sessions opened on the prefix cache.",
      "Those that shared at least one cached token.",
      "Prompt tokens served from the prefix cache instead of forwarded.",
      "Cached cells evicted because a step needed cells.",
      "Engine steps (forwards).",
      "Engine steps whose forward failed.",
      "Generations whose cells were taken back to let others run (overcommit).",
      "Committed tokens forwarded again when a preempted generation resumed.",
  };
  for (size_t i = 0; i < std::size(counters); ++i) {
    head(out, counters[i].first, "counter", counter_help[i]);
    line(out, counters[i].first, counters[i].second);
  }
  return out;
}

}  // namespace cellm::serve
