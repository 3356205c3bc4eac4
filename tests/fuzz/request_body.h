// Request bodies of /v1/completions and /v1/chat/completions built from fuzzer
// bytes: an object holding a random subset of the fields the endpoints read,
// each mostly of its expected type with values near the edges, sometimes of any
// type, plus now and then an unknown field.
#pragma once

#include <utility>

#include "fuzz_check.h"
#include "fuzz_json.h"
#include "serve/request.h"

namespace cellm::fuzz {

using nlohmann::json;

// The fields both endpoints read, with an example of the expected type.
inline const std::vector<std::pair<const char*, json>>& generation_fields() {
  static const std::vector<std::pair<const char*, json>> fields = {{"model", "kjv-small"},
                                                                   {"max_tokens", 16},
                                                                   {"max_completion_tokens", 16},
                                                                   {"temperature", 0.5},
                                                                   {"top_p", 0.9},
                                                                   {"min_p", 0.1},
                                                                   {"top_k", 40},
                                                                   {"seed", 1},
                                                                   {"n", 1},
                                                                   {"best_of", 1},
                                                                   {"stream", true},
                                                                   {"ignore_eos", true},
                                                                   {"logprobs", 1},
                                                                   {"top_logprobs", 2},
                                                                   {"echo", true},
                                                                   {"user", "u"},
                                                                   {"presence_penalty", 0.0},
                                                                   {"frequency_penalty", 0.0},
                                                                   {"suffix", "s"},
                                                                   {"logit_bias", json::object()}};
  return fields;
}

inline json stop_value(FuzzedDataProvider& fdp) {
  if (fdp.ConsumeBool()) return utf8_string(fdp, 300);
  json list = json::array();
  const int n = fdp.ConsumeIntegralInRange<int>(0, 18);
  for (int i = 0; i < n; ++i) list.push_back(utf8_string(fdp, 32));
  return list;
}

inline void add_generation_fields(FuzzedDataProvider& fdp, json& body) {
  for (const auto& [name, like] : generation_fields()) {
    if (fdp.ConsumeIntegralInRange<int>(0, 3) != 0) continue;
    if (std::string_view(name) == "logprobs" && fdp.ConsumeBool()) {
      body[name] = fdp.ConsumeBool();  // the chat endpoint's form
    } else {
      body[name] = value_like(fdp, like);
    }
  }
  if (fdp.ConsumeIntegralInRange<int>(0, 3) == 0) body["stop"] = stop_value(fdp);
  if (fdp.ConsumeIntegralInRange<int>(0, 3) == 0) {
    body["stream_options"] =
        fdp.ConsumeBool() ? json{{"include_usage", value_like(fdp, true)}} : any_value(fdp, 1);
  }
  if (fdp.ConsumeIntegralInRange<int>(0, 7) == 0) body[utf8_string(fdp, 12)] = any_value(fdp, 2);
}

// A completion prompt: text, token ids (some out of range), or a batch.
inline json prompt_value(FuzzedDataProvider& fdp) {
  switch (fdp.ConsumeIntegralInRange<int>(0, 4)) {
    case 0:
      return utf8_string(fdp, 200);
    case 1:
    case 2: {
      json ids = json::array();
      const int n = fdp.ConsumeIntegralInRange<int>(0, 12);
      for (int i = 0; i < n; ++i) {
        ids.push_back(fdp.ConsumeBool() ? json(fdp.ConsumeIntegralInRange<int>(0, 600))
                                        : edge_integer(fdp));
      }
      return ids;
    }
    case 3: {
      json batch = json::array();
      const int n = fdp.ConsumeIntegralInRange<int>(0, 3);
      for (int i = 0; i < n; ++i) batch.push_back(prompt_value(fdp));
      return batch;
    }
    default:
      return any_value(fdp, 2);
  }
}

// Chat messages: roles from the usual set or fuzzed, content as a string, null,
// a list of text parts (sometimes malformed), or anything.
inline json messages_value(FuzzedDataProvider& fdp) {
  static const char* const kRoles[] = {"system", "user", "assistant", "tool", ""};
  json list = json::array();
  const int n = fdp.ConsumeIntegralInRange<int>(0, 8);
  for (int i = 0; i < n; ++i) {
    json m = json::object();
    if (fdp.ConsumeIntegralInRange<int>(0, 9) != 0) {
      m["role"] = fdp.ConsumeBool() ? json(kRoles[fdp.ConsumeIntegralInRange<int>(0, 4)])
                                    : value_like(fdp, "role");
    }
    switch (fdp.ConsumeIntegralInRange<int>(0, 4)) {
      case 0:
      case 1:
        m["content"] = utf8_string(fdp, 200);
        break;
      case 2:
        m["content"] = nullptr;
        break;
      case 3: {
        json parts = json::array();
        const int k = fdp.ConsumeIntegralInRange<int>(0, 4);
        for (int j = 0; j < k; ++j) {
          json part = {
              {"type", fdp.ConsumeIntegralInRange<int>(0, 4) ? json("text") : any_value(fdp, 0)}};
          if (fdp.ConsumeIntegralInRange<int>(0, 5)) part["text"] = value_like(fdp, "t");
          parts.push_back(fdp.ConsumeIntegralInRange<int>(0, 9) ? part : any_value(fdp, 1));
        }
        m["content"] = parts;
        break;
      }
      default:
        m["content"] = any_value(fdp, 2);
    }
    list.push_back(fdp.ConsumeIntegralInRange<int>(0, 15) ? m : any_value(fdp, 1));
  }
  return list;
}

// The limits both request targets parse under.
inline cli::RequestLimits request_limits() {
  cli::RequestLimits limits;
  limits.max_n = 4;
  limits.max_session_tokens = 256;
  limits.vocab_size = 512;
  return limits;
}

// What every refused body must be: a 400 that says what is wrong and serializes.
inline void check_request_error(const cli::ApiError& e) {
  FUZZ_CHECK(e.status == 400, "a request parse error is a 400");
  FUZZ_CHECK(!e.message.empty(), "an error says what is wrong");
  (void)e.to_json().dump();  // throws (a crash here) if the error body is not UTF-8
}

}  // namespace cellm::fuzz
