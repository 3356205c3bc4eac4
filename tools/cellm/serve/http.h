// What every endpoint handler of `cellm serve` shares: the server context, JSON
// answers (errors in OpenAI's shape), the per-request log record, and the path
// from a validated JobSpec to a running Job (admission, then the first session).
//
// Threading: cpp-httplib runs a request's handler, its content provider and
// the logger on one worker thread, so the log record is thread-local.
#pragma once

#include <httplib.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cellm/serve.h"
#include "cellm/tokenizer.h"
#include "serve/api_error.h"
#include "serve/request.h"

namespace cellm::cli {

// The serving library's types, as the front end names them.
using serve::Admission;
using serve::ChoiceDelta;
using serve::Job;
using serve::JobSink;
using serve::JobSpec;
using serve::JobSummary;
using serve::ServeEngine;
using serve::ServeGauges;
using serve::ServeMetrics;

struct ServeContext {
  std::string model_id;                    // what /v1/models lists first
  std::vector<std::string> model_aliases;  // more names it lists and accepts (--served-model-name)
  std::string model_dir;                   // also accepted as the model name
  int64_t created_unix = 0;
  RequestLimits limits;
  std::optional<std::string> api_key;
  Tokenizer tokenizer;
  ServeEngine* engine = nullptr;
  Admission* admission = nullptr;
  ServeMetrics* metrics = nullptr;
};

// The request being served on this thread, for its log line.
struct RequestLog {
  int64_t t_start_us = 0;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  bool client_gone = false;
};
RequestLog& request_log();

// job.run(sink), with what the log line reports of it (the completion tokens, whether the
// client left) noted in request_log().
JobSummary run_logged(Job& job, JobSink& sink);

// JSON text; invalid UTF-8 (echoed prompts, split tokens) becomes U+FFFD.
std::string dump_json(const nlohmann::json& j);
void send_json(httplib::Response& res, int status, const nlohmann::json& body);
// The error as the answer, its message redacted (set_error_redactions).
void send_error(httplib::Response& res, const ApiError& error);

// What error answers must not reveal (the model folder's path, a chat template
// file's), each with the text that replaces it. Set once at start, before any
// request is served.
void set_error_redactions(std::vector<std::pair<std::string, std::string>> redactions);

// a == b, in a time that depends only on b's length (b: what the client sent), for
// secrets such as the API key.
bool constant_time_equals(std::string_view expected, std::string_view given);

// A 400 naming the limit when the JSON text nests arrays and objects deeper than
// `max_depth` levels (a scan of the bytes, strings skipped; nothing else is checked).
std::optional<ApiError> check_json_depth(std::string_view body, int max_depth);

// 404 unless `model` is absent or names the served model (its id, an alias or its path).
std::optional<ApiError> check_model(const ServeContext& ctx,
                                    const std::optional<std::string>& model);

// Admits the request (429 when the queue is full) and starts its first
// generation; the error answers the request otherwise.
ApiResult<std::shared_ptr<Job>> admit_and_start(const ServeContext& ctx, JobSpec spec);

// A JobSpec from validated fields and an encoded prompt.
JobSpec make_job_spec(const ServeContext& ctx, const GenerationFields& fields,
                      std::vector<Token> prompt, int32_t max_tokens);

// "cmpl-..." / "chatcmpl-...": a prefix and 24 random hex digits.
std::string make_id(const char* prefix);
int64_t unix_now();

}  // namespace cellm::cli
