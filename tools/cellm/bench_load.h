// The serving load of `cellm bench --requests`: B clients, each sending requests one
// after another, so sessions join and leave the decode batch as a server's do.
//
// A request opens a session, prefills its prompt, generates between TG/2 and 3 TG/2
// tokens (uniform, seeded per request) and closes the session. Two workloads
// exercise the prefix cache:
//   --shared-prefix S  every prompt starts with the same S tokens (a system prompt),
//                      followed by its own PP tokens;
//   --turns T          a request is a conversation of T turns: turn k's prompt is
//                      turn k-1's prompt, its reply and PP new tokens.
// With either, the KV pool is shared by need (ExecutorLimits::capacity_rule off, a
// pool sized by memory, KvPolicy overcommit unless --kv-policy says otherwise) and
// every row runs twice, without and with the prefix cache, so the TTFT columns show
// what the cache buys. Sessions open on their prompt's cached prefix
// (Runner::open_session_async(prompt)).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cellm/engine.h"
#include "cellm/runner.h"

namespace cellm::cli {

struct LoadSpec {
  int64_t pp = 0, tg = 0, b = 0, requests = 0;
  uint64_t seed = 1;
  SamplingParams sampling;
  int64_t shared_prefix = 0;  // S common tokens before each prompt's own
  int64_t turns = 1;          // turns per request (a conversation)
  // The pool shared by need under `policy`; off: fixed slots sized for b sessions
  // (the classic serving rows).
  bool shared_pool = false;
  KvPolicy policy = KvPolicy::kOvercommit;
  bool prefix_cache = false;
};

// One row of the serving load.
struct LoadRow {
  LoadSpec spec;
  int64_t prompt_tokens = 0, generated_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens served by the prefix cache
  double t = 0;               // seconds, first request sent to last one done
  // Per generation: time to first token, and time per output token after it (the mean
  // gap between its tokens; generations of one token have none).
  std::vector<double> ttft_ms, tpot_ms;
  EngineMetrics engine;  // the runner's steps: how the batches formed
  std::optional<StepTimeReport> steps;
};

// Sizes an engine for `b` sessions of up to `tokens` positions each (fixed slots).
EngineOptions options_for(EngineOptions options, int64_t b, int64_t tokens);

Result<LoadRow> load_one(const std::shared_ptr<const LoadedModel>& model,
                         const EngineOptions& options, const LoadSpec& spec);

void print_load_header(bool with_steps, bool with_cache);
void print_load_row(const LoadRow& r, bool with_cache);
void print_load_json(const LoadRow& r, const std::string& device);

// The decode steps' columns of a JSON row (--step-times on the CUDA executor).
void add_step_json(nlohmann::json& j, const std::optional<StepTimeReport>& steps);

}  // namespace cellm::cli
