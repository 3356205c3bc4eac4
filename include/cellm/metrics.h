// Metrics: per generation (GenerationMetrics, on GenerationHandle::metrics()),
// per engine (EngineMetrics, on Runner::metrics()) and of the KV cache
// (KvMetrics, from Executor::kv_metrics()). Plain counters filled by the runner;
// every rate is derived on demand. Timestamps are steady-clock microseconds;
// 0 means "never happened".
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "cellm/types.h"

namespace cellm {

// Steady-clock microseconds since an arbitrary epoch (never 0 in practice).
int64_t now_us();

struct GenerationMetrics {
  SessionId sid = 0;
  int64_t t_submit_us = 0;       // caller thread, before queueing
  int64_t t_first_step_us = 0;   // first batch the generation appeared in
  int64_t t_first_token_us = 0;  // first output delivered
  int64_t t_end_us = 0;          // terminal update published

  int64_t n_prompt_tokens = 0;     // the caller's delta (not a carried pending token)
  int64_t n_generated_tokens = 0;  // tokens delivered
  int64_t n_prefill_steps = 0;     // steps with this generation's prefill chunks
  int64_t n_decode_steps = 0;      // steps with this generation's decode
  int64_t n_preemptions = 0;       // times its cells were taken back (KvPolicy::kOvercommit)

  // Inter-token latency. The first burst sets t_first_token and contributes
  // (emitted - 1) zero-time samples; each later burst adds `emitted` samples,
  // the gap since the previous delivery to the sum, min 0 for a multi-token
  // burst (else the gap), and the gap to max.
  int64_t itl_count = 0;
  int64_t itl_sum_us = 0;
  int64_t itl_min_us = std::numeric_limits<int64_t>::max();  // no samples yet
  int64_t itl_max_us = 0;

  int64_t ttft_us() const;                // first token - submit
  int64_t queue_wait_us() const;          // first step - submit
  int64_t prefill_span_us() const;        // first token - first step
  int64_t decode_span_us() const;         // end - first token
  int64_t e2e_us() const;                 // end - submit
  double itl_mean_us() const;             // 0 without samples
  int64_t min_itl_us() const;             // 0 without samples
  double decode_tokens_per_sec() const;   // itl_count / itl_sum (inf if sum 0, count > 0)
  double prefill_tokens_per_sec() const;  // prompt tokens / prefill span
};

struct EngineMetrics {
  int64_t steps = 0;
  int64_t steps_failed = 0;

  int64_t decode_sessions_total = 0;   // per step, sessions with a decode
  int64_t prefill_sessions_total = 0;  // per step, sessions with prefill (once per step)
  int64_t ready_total = 0;             // per step, live generations past their first token

  int64_t step_latency_sum_us = 0;
  int64_t step_latency_max_us = 0;

  int64_t decode_tokens_total = 0;   // credited only for successful steps
  int64_t prefill_tokens_total = 0;  // credited only for successful steps
  int64_t decode_only_tokens = 0;    // decode tokens of steps without prefill

  int64_t steps_with_decode = 0;
  int64_t steps_with_prefill = 0;

  // These three sum to step_latency_sum_us.
  int64_t decode_only_latency_sum_us = 0;
  int64_t mixed_latency_sum_us = 0;
  int64_t prefill_only_latency_sum_us = 0;

  int64_t context_sum = 0;  // per step, each session's furthest chunk end, summed
  int64_t context_max = 0;
  int64_t decode_session_time_sum_us = 0;  // step latency x decode sessions

  int64_t sessions_refused = 0;
  int64_t peak_concurrent_generations = 0;  // sampled per step

  int64_t generations_started = 0;
  int64_t generations_completed = 0;  // = the four below; = started after shutdown
  int64_t finished_stop_token = 0;
  int64_t finished_token_limit = 0;
  int64_t finished_cancelled = 0;
  int64_t finished_failed = 0;

  int64_t ttft_count = 0;  // generations that reached a first token
  int64_t ttft_sum_us = 0;
  int64_t ttft_min_us = std::numeric_limits<int64_t>::max();
  int64_t ttft_max_us = 0;

  int64_t total_prompt_tokens = 0;
  int64_t total_generated_tokens = 0;

  int64_t t_first_step_us = 0;
  int64_t t_last_step_us = 0;
  int64_t init_us = 0;  // executor initialize(); outside the wall time

  // KV policies (RunnerOptions::policy); all 0 under KvPolicy::kNone.
  int64_t generations_waiting = 0;    // waiting for cells now (queued or preempted)
  int64_t admission_waits = 0;        // generations not admitted as soon as they started
  int64_t admission_wait_us_sum = 0;  // their time from start to first admission
  int64_t preemptions = 0;            // generations whose cells were taken back
  int64_t recomputed_tokens = 0;      // committed tokens fed again at a resume

  int64_t wall_us() const;             // last step - first step
  double idle_fraction() const;        // 1 - step latency / wall
  int64_t model_input_tokens() const;  // decode + prefill tokens
  int64_t total_tokens() const;        // prompt + generated
  double mean_step_tokens() const;
  double generated_tokens_per_sec() const;
  double model_input_tokens_per_sec() const;
  double mean_admitted_decode_sessions() const;  // decode sessions / steps with decode
  double mean_ready_decode_sessions() const;     // ready / steps
  double mean_decode_step_sessions() const;      // decode sessions / steps
  double mean_step_sessions() const;             // (decode + prefill sessions) / steps
  double admitted_ratio() const;                 // decode sessions / ready
  int64_t mixed_steps() const;                   // steps_with_decode + steps_with_prefill - steps
  int64_t decode_only_steps() const;
  int64_t prefill_only_steps() const;
  double mean_decode_only_step_us() const;
  double mean_mixed_step_us() const;
  double mean_prefill_only_step_us() const;
  double decode_only_tokens_per_sec() const;  // the rate to compare across engines
  double mean_decode_us_per_token() const;
  double mean_context_per_step() const;
  double mean_ttft_us() const;
  int64_t min_ttft_us() const;  // 0 without samples
};

// The KV cache as an executor reports it.
struct KvMetrics {
  int64_t cells_capacity = 0;     // cells the pool may ever hand out
  int64_t cells_in_use = 0;       // cells owned by at least one session
  int64_t cells_cached = 0;       // cells only the prefix cache holds
  int64_t cells_reserved = 0;     // reserved cells not yet taken
  int64_t used_end = 0;           // every occupied cell lies below this
  int64_t rows_allocated = 0;     // cells backed by storage now
  int64_t allocated_bytes = 0;    // KV storage bytes, all layers, K and V
  int64_t bytes_per_cell = 0;     // one token's K and V over all layers
  int64_t growth_count = 0;       // storage growths so far
  int64_t prefix_lookups = 0;     // attach_prefix calls with the prefix cache on
  int64_t prefix_hits = 0;        // those that attached at least one token
  int64_t prefix_hit_tokens = 0;  // tokens attached (not recomputed)
  int64_t evicted_cells = 0;      // cached cells evicted for a step short of cells
};

std::string format_report(const GenerationMetrics& m);
std::string format_report(const EngineMetrics& m);
std::string format_report(const KvMetrics& m);
// One JSON object each, counters and derived rates, keys as the field names.
std::string to_json(const GenerationMetrics& m);
std::string to_json(const EngineMetrics& m);
std::string to_json(const KvMetrics& m);

}  // namespace cellm
