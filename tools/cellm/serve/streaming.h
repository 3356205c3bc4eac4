// The two JobSinks: SseSink streams each delta as a Server-Sent Event
// ("data: <json>\n\n", ending with "data: [DONE]\n\n"); CollectSink gathers
// every choice for one JSON answer. Both report a client that has gone: a
// failed write, a socket the peer closed (PeerWatch), or a writer httplib no
// longer accepts.
//
// Not thread-safe: used on the request's handler thread only.
#pragma once

#include <httplib.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve/connection.h"
#include "serve/http.h"

namespace cellm::cli {

class SseSink final : public JobSink {
 public:
  // One chunk per delta (none when the format gives null: a delta whose text a
  // parser still holds); an "error" delta is sent as an OpenAI error object.
  using Format = std::function<nlohmann::json(const ChoiceDelta&)>;
  SseSink(httplib::DataSink& sink, PeerWatch peer, Format format);

  bool deliver(const ChoiceDelta& delta) override;
  bool alive() override;

  bool send(const nlohmann::json& event);
  // "data: [DONE]" and the end of the chunked body; false if the client is
  // gone (the content provider then returns false so httplib stops).
  bool finish();

 private:
  bool write(const std::string& text);
  httplib::DataSink& sink_;
  PeerWatch peer_;
  Format format_;
  bool ok_ = true;
};

struct CollectedChoice {
  std::string text;
  std::vector<Token> tokens;
  std::vector<TokenLogprobs> logprobs;  // parallel to tokens when asked for
  std::string finish_reason;
  std::string error_message;
};

class CollectSink final : public JobSink {
 public:
  CollectSink(PeerWatch peer, int32_t n) : peer_(peer), choices_(static_cast<size_t>(n)) {}
  bool deliver(const ChoiceDelta& delta) override;
  bool alive() override { return !peer_.closed(); }
  const std::vector<CollectedChoice>& choices() const { return choices_; }
  // The answer instead of the choices when one of them did not end with one of
  // OpenAI's finish reasons: 500 for a failed generation, 503 for one cancelled by
  // the server's shutdown.
  std::optional<ApiError> failure() const;

 private:
  PeerWatch peer_;
  std::vector<CollectedChoice> choices_;
};

// OpenAI's "usage" object.
nlohmann::json usage_json(const JobSummary& summary);

// A stream's closing usage chunk (stream_options.include_usage): `head` (id, object,
// created, model) with no choices and the usage; nothing when the client has gone.
void send_usage_chunk(SseSink& sink, nlohmann::json head, const JobSummary& summary);

}  // namespace cellm::cli
