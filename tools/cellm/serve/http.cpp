#include "serve/http.h"

#include <chrono>
#include <random>

namespace cellm::cli {

RequestLog& request_log() {
  thread_local RequestLog log;
  return log;
}

JobSummary run_logged(Job& job, JobSink& sink) {
  const JobSummary summary = job.run(sink);
  request_log().completion_tokens = summary.completion_tokens;
  request_log().client_gone = summary.client_gone;
  return summary;
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void send_json(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& error) {
  send_json(res, error.status, error.to_json());
}

std::optional<ApiError> check_model(const ServeContext& ctx,
                                    const std::optional<std::string>& model) {
  if (!model || *model == ctx.model_id || *model == ctx.model_dir) return std::nullopt;
  for (const std::string& alias : ctx.model_aliases) {
    if (*model == alias) return std::nullopt;
  }
  return ApiError{
      404, "The model '" + *model + "' does not exist; this server serves '" + ctx.model_id + "'",
      "invalid_request_error", "model", "model_not_found"};
}

JobSpec make_job_spec(const ServeContext& ctx, const GenerationFields& fields,
                      std::vector<Token> prompt, int32_t max_tokens) {
  JobSpec spec;
  spec.prompt = std::move(prompt);
  spec.max_tokens = max_tokens;
  spec.sampling = fields.sampling;
  // The runner reports the sampled token and num_logprobs alternatives; 0
  // alternatives still needs the sampled token's logprob.
  if (fields.top_logprobs) spec.sampling.num_logprobs = std::max(1, *fields.top_logprobs);
  if (!fields.ignore_eos) spec.stop_tokens = ctx.tokenizer.eos_ids();
  spec.seed = fields.seed;
  spec.n = fields.n;
  spec.stop = fields.stop;
  return spec;
}

ApiResult<std::shared_ptr<Job>> admit_and_start(const ServeContext& ctx, JobSpec spec) {
  const int64_t t_arrival = request_log().t_start_us;
  request_log().prompt_tokens = static_cast<int64_t>(spec.prompt.size());
  std::variant<Admission::Ticket, Admission::Refusal> admitted = ctx.admission->acquire(spec.n);
  if (auto* refusal = std::get_if<Admission::Refusal>(&admitted)) {
    if (*refusal == Admission::Refusal::kQueueFull) {
      return ApiError{429, "too many requests are waiting for a session; retry later",
                      "rate_limit_error", "", "queue_full"};
    }
    return ApiError{503, "the server is shutting down", "server_error", "", ""};
  }
  Result<std::unique_ptr<Job>> job = ctx.engine->start(
      std::move(spec), std::move(std::get<Admission::Ticket>(admitted)), t_arrival);
  if (!job.ok()) {
    // Shutting down (InvalidState) or no session to give: the server is unavailable.
    const bool no_session = job.status().code() != StatusCode::kInvalidState;
    return ApiError{503, job.status().message(), "server_error", "",
                    no_session ? "no_session" : ""};
  }
  return std::shared_ptr<Job>(std::move(*job));
}

std::string make_id(const char* prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* kHex = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kHex[rng() % 16];
  return id;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace cellm::cli
