#include "serve/streaming.h"

#include "serve/api_error.h"
#include "serve/http.h"

namespace cellm::cli {

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
  if (delta.finish_reason == "error") {
    return send(ApiError{500, "generation failed: " + delta.error_message, "server_error", "", ""}
                    .to_json());
  }
  return send(format_(delta));
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

std::string CollectSink::first_error() const {
  for (const CollectedChoice& c : choices_) {
    if (c.finish_reason == "error")
      return c.error_message.empty() ? "generation failed" : c.error_message;
  }
  return {};
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
