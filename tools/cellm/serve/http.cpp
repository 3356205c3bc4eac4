#include "serve/http.h"

#include <algorithm>
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

namespace {

std::vector<std::pair<std::string, std::string>>& redactions() {
  static std::vector<std::pair<std::string, std::string>> list;
  return list;
}

}  // namespace

void set_error_redactions(std::vector<std::pair<std::string, std::string>> list) {
  // Longest first, so a path is replaced before a shorter one inside it.
  std::sort(list.begin(), list.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  std::erase_if(list, [](const auto& r) { return r.first.empty(); });
  redactions() = std::move(list);
}

void send_error(httplib::Response& res, const ApiError& error) {
  ApiError redacted = error;
  for (const auto& [text, replacement] : redactions()) {
    for (size_t at = redacted.message.find(text); at != std::string::npos;
         at = redacted.message.find(text, at + replacement.size())) {
      redacted.message.replace(at, text.size(), replacement);
    }
  }
  send_json(res, redacted.status, redacted.to_json());
}

bool constant_time_equals(std::string_view expected, std::string_view given) {
  // Every byte of `given` is compared (against `expected` repeated), whatever
  // differs first; the lengths take part without a branch.
  volatile unsigned char diff = expected.size() == given.size() ? 0 : 1;
  if (expected.empty()) return given.empty();
  for (size_t i = 0; i < given.size(); ++i) {
    diff = diff | static_cast<unsigned char>(expected[i % expected.size()] ^ given[i]);
  }
  return diff == 0;
}

std::optional<ApiError> check_json_depth(std::string_view body, int max_depth) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (const char c : body) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return ApiError{400,
                        "the request body nests JSON arrays and objects deeper than the "
                        "server's limit of " +
                            std::to_string(max_depth) + " levels",
                        "invalid_request_error", "", "json_too_deep"};
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::nullopt;
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
