#include "serve/streaming.h"

#include "serve/api_error.h"
#include "serve/http.h"

namespace cellm::cli {

namespace {

// OpenAI's finish reasons are stop, length, tool_calls, content_filter and
// function_call; a generation that failed or that the server cancelled (its
// shutdown: a client that left sees nothing) gets an error object instead.
std::optional<ApiError> failure_of(const std::string& finish_reason,
                                   const std::string& error_message) {
  if (finish_reason == "error") {
    return ApiError{
        500, "generation failed: " + (error_message.empty() ? "unknown error" : error_message),
        "server_error", "", ""};
  }
  if (finish_reason == "cancelled") {
    return ApiError{503, "the generation was cancelled: the server is shutting down",
                    "server_error", "", "shutting_down"};
  }
  return std::nullopt;
}

}  // namespace

SseSink::SseSink(httplib::DataSink& sink, PeerWatch peer, Format format)
    : sink_(sink), peer_(peer), format_(std::move(format)) {}

bool SseSink::write(const std::string& text) {
  if (ok_ && !sink_.write(text.data(), text.size())) ok_ = false;
  return ok_;
}

bool SseSink::send(const nlohmann::json& event) {
  return write("data: " + dump_json(event) + "\n\n");
}

bool SseSink::deliver(const ChoiceDelta& delta) {
  if (delta.finish_reason) {
    if (auto e = failure_of(*delta.finish_reason, delta.error_message)) return send(e->to_json());
  }
  const nlohmann::json event = format_(delta);
  if (event.is_null()) return alive();  // nothing to send for this delta
  return send(event);
}

bool SseSink::alive() {
  return ok_ && !peer_.closed() && sink_.is_writable();
}

bool SseSink::finish() {
  write("data: [DONE]\n\n");
  if (ok_) sink_.done();
  return ok_;
}

bool CollectSink::deliver(const ChoiceDelta& delta) {
  CollectedChoice& c = choices_[static_cast<size_t>(delta.index)];
  c.text += delta.text;
  c.tokens.insert(c.tokens.end(), delta.tokens.begin(), delta.tokens.end());
  c.logprobs.insert(c.logprobs.end(), delta.logprobs.begin(), delta.logprobs.end());
  if (delta.finish_reason) c.finish_reason = *delta.finish_reason;
  if (!delta.error_message.empty()) c.error_message = delta.error_message;
  return alive();
}

std::optional<ApiError> CollectSink::failure() const {
  for (const CollectedChoice& c : choices_) {
    if (auto e = failure_of(c.finish_reason, c.error_message)) return e;
  }
  return std::nullopt;
}

nlohmann::json usage_json(const JobSummary& s) {
  return {{"prompt_tokens", s.prompt_tokens},
          {"completion_tokens", s.completion_tokens},
          {"total_tokens", s.prompt_tokens + s.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", s.prompt_tokens_cached}}}};
}

void send_usage_chunk(SseSink& sink, nlohmann::json head, const JobSummary& summary) {
  if (summary.client_gone) return;
  head["choices"] = nlohmann::json::array();
  head["usage"] = usage_json(summary);
  sink.send(head);
}

}  // namespace cellm::cli
