#include "cellm/metrics.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

namespace cellm {

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {

constexpr double kUsPerSec = 1e6;

// b - a when both timestamps happened, else 0.
int64_t span(int64_t a, int64_t b) {
  return (a != 0 && b != 0) ? b - a : 0;
}

double ratio(double num, double den) {
  return den > 0 ? num / den : 0.0;
}

// Per second over a microsecond span; 0 without a span.
double rate(int64_t count, int64_t us) {
  return us > 0 ? count * kUsPerSec / us : 0.0;
}

// Builds one line per field for format_report and one member per field for
// to_json, from the same list.
class Writer {
 public:
  explicit Writer(bool json) : json_(json) {}

  void i(const char* name, int64_t v) { add(name, std::to_string(v)); }
  void d(const char* name, double v) {
    if (!std::isfinite(v)) {
      add(name, json_ ? "null" : (std::isnan(v) ? "nan" : "inf"));
      return;
    }
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.9g", v);
    add(name, buf);
  }

  std::string finish(const char* title) {
    if (json_) return "{" + body_ + "}";
    return std::string(title) + "\n" + body_;
  }

 private:
  void add(const char* name, const std::string& value) {
    if (json_) {
      if (!body_.empty()) body_ += ",";
      body_ += "\"" + std::string(name) + "\":" + value;
    } else {
      char buf[48];
      std::snprintf(buf, sizeof(buf), "  %-32s ", name);
      body_ += buf + value + "\n";
    }
  }

  bool json_;
  std::string body_;
};

void write(Writer& w, const GenerationMetrics& m) {
  w.i("sid", m.sid);
  w.i("t_submit_us", m.t_submit_us);
  w.i("t_first_step_us", m.t_first_step_us);
  w.i("t_first_token_us", m.t_first_token_us);
  w.i("t_end_us", m.t_end_us);
  w.i("n_prompt_tokens", m.n_prompt_tokens);
  w.i("n_generated_tokens", m.n_generated_tokens);
  w.i("n_prefill_steps", m.n_prefill_steps);
  w.i("n_decode_steps", m.n_decode_steps);
  w.i("n_preemptions", m.n_preemptions);
  w.i("itl_count", m.itl_count);
  w.i("itl_sum_us", m.itl_sum_us);
  w.i("itl_min_us", m.min_itl_us());
  w.i("itl_max_us", m.itl_max_us);
  w.i("ttft_us", m.ttft_us());
  w.i("queue_wait_us", m.queue_wait_us());
  w.i("prefill_span_us", m.prefill_span_us());
  w.i("decode_span_us", m.decode_span_us());
  w.i("e2e_us", m.e2e_us());
  w.d("itl_mean_us", m.itl_mean_us());
  w.d("decode_tokens_per_sec", m.decode_tokens_per_sec());
  w.d("prefill_tokens_per_sec", m.prefill_tokens_per_sec());
}

void write(Writer& w, const EngineMetrics& m) {
  w.i("steps", m.steps);
  w.i("steps_failed", m.steps_failed);
  w.i("decode_sessions_total", m.decode_sessions_total);
  w.i("prefill_sessions_total", m.prefill_sessions_total);
  w.i("ready_total", m.ready_total);
  w.i("step_latency_sum_us", m.step_latency_sum_us);
  w.i("step_latency_max_us", m.step_latency_max_us);
  w.i("decode_tokens_total", m.decode_tokens_total);
  w.i("prefill_tokens_total", m.prefill_tokens_total);
  w.i("decode_only_tokens", m.decode_only_tokens);
  w.i("steps_with_decode", m.steps_with_decode);
  w.i("steps_with_prefill", m.steps_with_prefill);
  w.i("decode_only_latency_sum_us", m.decode_only_latency_sum_us);
  w.i("mixed_latency_sum_us", m.mixed_latency_sum_us);
  w.i("prefill_only_latency_sum_us", m.prefill_only_latency_sum_us);
  w.i("context_sum", m.context_sum);
  w.i("context_max", m.context_max);
  w.i("decode_session_time_sum_us", m.decode_session_time_sum_us);
  w.i("sessions_refused", m.sessions_refused);
  w.i("peak_concurrent_generations", m.peak_concurrent_generations);
  w.i("generations_started", m.generations_started);
  w.i("generations_completed", m.generations_completed);
  w.i("finished_stop_token", m.finished_stop_token);
  w.i("finished_token_limit", m.finished_token_limit);
  w.i("finished_cancelled", m.finished_cancelled);
  w.i("finished_failed", m.finished_failed);
  w.i("ttft_count", m.ttft_count);
  w.i("ttft_sum_us", m.ttft_sum_us);
  w.i("ttft_min_us", m.min_ttft_us());
  w.i("ttft_max_us", m.ttft_max_us);
  w.i("total_prompt_tokens", m.total_prompt_tokens);
  w.i("total_generated_tokens", m.total_generated_tokens);
  w.i("t_first_step_us", m.t_first_step_us);
  w.i("t_last_step_us", m.t_last_step_us);
  w.i("init_us", m.init_us);
  w.i("generations_waiting", m.generations_waiting);
  w.i("admission_waits", m.admission_waits);
  w.i("admission_wait_us_sum", m.admission_wait_us_sum);
  w.i("preemptions", m.preemptions);
  w.i("recomputed_tokens", m.recomputed_tokens);
  w.i("wall_us", m.wall_us());
  w.d("idle_fraction", m.idle_fraction());
  w.i("model_input_tokens", m.model_input_tokens());
  w.i("total_tokens", m.total_tokens());
  w.d("mean_step_tokens", m.mean_step_tokens());
  w.d("generated_tokens_per_sec", m.generated_tokens_per_sec());
  w.d("model_input_tokens_per_sec", m.model_input_tokens_per_sec());
  w.d("mean_admitted_decode_sessions", m.mean_admitted_decode_sessions());
  w.d("mean_ready_decode_sessions", m.mean_ready_decode_sessions());
  w.d("mean_decode_step_sessions", m.mean_decode_step_sessions());
  w.d("mean_step_sessions", m.mean_step_sessions());
  w.d("admitted_ratio", m.admitted_ratio());
  w.i("mixed_steps", m.mixed_steps());
  w.i("decode_only_steps", m.decode_only_steps());
  w.i("prefill_only_steps", m.prefill_only_steps());
  w.d("mean_decode_only_step_us", m.mean_decode_only_step_us());
  w.d("mean_mixed_step_us", m.mean_mixed_step_us());
  w.d("mean_prefill_only_step_us", m.mean_prefill_only_step_us());
  w.d("decode_only_tokens_per_sec", m.decode_only_tokens_per_sec());
  w.d("mean_decode_us_per_token", m.mean_decode_us_per_token());
  w.d("mean_context_per_step", m.mean_context_per_step());
  w.d("mean_ttft_us", m.mean_ttft_us());
}

void write(Writer& w, const KvMetrics& m) {
  w.i("cells_capacity", m.cells_capacity);
  w.i("cells_in_use", m.cells_in_use);
  w.i("cells_cached", m.cells_cached);
  w.i("cells_reserved", m.cells_reserved);
  w.i("used_end", m.used_end);
  w.i("rows_allocated", m.rows_allocated);
  w.i("allocated_bytes", m.allocated_bytes);
  w.i("bytes_per_cell", m.bytes_per_cell);
  w.i("growth_count", m.growth_count);
  w.i("prefix_lookups", m.prefix_lookups);
  w.i("prefix_hits", m.prefix_hits);
  w.i("prefix_hit_tokens", m.prefix_hit_tokens);
  w.i("evicted_cells", m.evicted_cells);
}

template <typename M>
std::string render(const M& m, bool json, const char* title) {
  Writer w(json);
  write(w, m);
  return w.finish(title);
}

}  // namespace

// ---------------------------------------------------------------------------
// GenerationMetrics

int64_t GenerationMetrics::ttft_us() const {
  return span(t_submit_us, t_first_token_us);
}
int64_t GenerationMetrics::queue_wait_us() const {
  return span(t_submit_us, t_first_step_us);
}
int64_t GenerationMetrics::prefill_span_us() const {
  return span(t_first_step_us, t_first_token_us);
}
int64_t GenerationMetrics::decode_span_us() const {
  return span(t_first_token_us, t_end_us);
}
int64_t GenerationMetrics::e2e_us() const {
  return span(t_submit_us, t_end_us);
}

double GenerationMetrics::itl_mean_us() const {
  return itl_count > 0 ? static_cast<double>(itl_sum_us) / static_cast<double>(itl_count) : 0.0;
}

int64_t GenerationMetrics::min_itl_us() const {
  return itl_count > 0 ? itl_min_us : 0;
}

double GenerationMetrics::decode_tokens_per_sec() const {
  if (itl_count == 0) return 0.0;
  if (itl_sum_us == 0) return std::numeric_limits<double>::infinity();
  return rate(itl_count, itl_sum_us);
}

double GenerationMetrics::prefill_tokens_per_sec() const {
  return rate(n_prompt_tokens, prefill_span_us());
}

// ---------------------------------------------------------------------------
// EngineMetrics

int64_t EngineMetrics::wall_us() const {
  return span(t_first_step_us, t_last_step_us);
}

double EngineMetrics::idle_fraction() const {
  const int64_t wall = wall_us();
  if (wall <= 0) return 0.0;
  return std::max(0.0, 1.0 - static_cast<double>(step_latency_sum_us) / wall);
}

int64_t EngineMetrics::model_input_tokens() const {
  return decode_tokens_total + prefill_tokens_total;
}
int64_t EngineMetrics::total_tokens() const {
  return total_prompt_tokens + total_generated_tokens;
}

double EngineMetrics::mean_step_tokens() const {
  return ratio(static_cast<double>(model_input_tokens()), static_cast<double>(steps));
}
double EngineMetrics::generated_tokens_per_sec() const {
  return rate(total_generated_tokens, wall_us());
}
double EngineMetrics::model_input_tokens_per_sec() const {
  return rate(model_input_tokens(), wall_us());
}
double EngineMetrics::mean_admitted_decode_sessions() const {
  return ratio(static_cast<double>(decode_sessions_total), static_cast<double>(steps_with_decode));
}
double EngineMetrics::mean_ready_decode_sessions() const {
  return ratio(static_cast<double>(ready_total), static_cast<double>(steps));
}
double EngineMetrics::mean_decode_step_sessions() const {
  return ratio(static_cast<double>(decode_sessions_total), static_cast<double>(steps));
}
double EngineMetrics::mean_step_sessions() const {
  return ratio(static_cast<double>(decode_sessions_total + prefill_sessions_total),
               static_cast<double>(steps));
}
double EngineMetrics::admitted_ratio() const {
  return ratio(static_cast<double>(decode_sessions_total), static_cast<double>(ready_total));
}

int64_t EngineMetrics::mixed_steps() const {
  return steps_with_decode + steps_with_prefill - steps;
}
int64_t EngineMetrics::decode_only_steps() const {
  return steps_with_decode - mixed_steps();
}
int64_t EngineMetrics::prefill_only_steps() const {
  return steps_with_prefill - mixed_steps();
}

double EngineMetrics::mean_decode_only_step_us() const {
  return ratio(static_cast<double>(decode_only_latency_sum_us),
               static_cast<double>(decode_only_steps()));
}
double EngineMetrics::mean_mixed_step_us() const {
  return ratio(static_cast<double>(mixed_latency_sum_us), static_cast<double>(mixed_steps()));
}
double EngineMetrics::mean_prefill_only_step_us() const {
  return ratio(static_cast<double>(prefill_only_latency_sum_us),
               static_cast<double>(prefill_only_steps()));
}

double EngineMetrics::decode_only_tokens_per_sec() const {
  return rate(decode_only_tokens, decode_only_latency_sum_us);
}
// The inverse of decode_only_tokens_per_sec: decode-only step time per token.
double EngineMetrics::mean_decode_us_per_token() const {
  return ratio(static_cast<double>(decode_only_latency_sum_us),
               static_cast<double>(decode_only_tokens));
}
double EngineMetrics::mean_context_per_step() const {
  return ratio(static_cast<double>(context_sum), static_cast<double>(steps));
}
double EngineMetrics::mean_ttft_us() const {
  return ratio(static_cast<double>(ttft_sum_us), static_cast<double>(ttft_count));
}
int64_t EngineMetrics::min_ttft_us() const {
  return ttft_count > 0 ? ttft_min_us : 0;
}

// ---------------------------------------------------------------------------
// Reports

std::string format_report(const GenerationMetrics& m) {
  return render(m, false, "generation");
}
std::string format_report(const EngineMetrics& m) {
  return render(m, false, "engine");
}
std::string format_report(const KvMetrics& m) {
  return render(m, false, "kv cache");
}
std::string to_json(const GenerationMetrics& m) {
  return render(m, true, "");
}
std::string to_json(const EngineMetrics& m) {
  return render(m, true, "");
}
std::string to_json(const KvMetrics& m) {
  return render(m, true, "");
}

}  // namespace cellm
