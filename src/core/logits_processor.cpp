// The row transform every executor applies for a LogitsProcessor (the CUDA
// sampler's twin must give the same row), the sampling penalties as a
// processor, and the chain of several processors.
#include "cellm/logits_processor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace cellm {

void apply_logit_adjustments(std::span<float> logits, const LogitAdjustments& adjustments) {
  const size_t vocab = logits.size();
  for (const LogitEdit& e : adjustments.edits) {
    if (e.token < 0 || static_cast<size_t>(e.token) >= vocab) continue;
    float& x = logits[static_cast<size_t>(e.token)];
    x = (x > 0.0f ? x / e.scale : x * e.scale) + e.bias;
  }
  if (adjustments.allowed.empty()) return;
  constexpr float kForbidden = -std::numeric_limits<float>::infinity();
  const std::vector<uint64_t>& mask = adjustments.allowed;
  for (size_t t = 0; t < vocab; ++t) {
    const size_t word = t / 64;
    const bool allowed = word < mask.size() && ((mask[word] >> (t % 64)) & 1u) != 0;
    if (!allowed) logits[t] = kForbidden;
  }
}

namespace {

std::string format_float(float value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(value));
  return buf;
}

bool in_range(float v, float lo, float hi) {
  return std::isfinite(v) && v >= lo && v <= hi;
}

// The penalties of one generation, kept incrementally: one entry per token that
// can ever carry an edit (prompt tokens under a repetition penalty, logit_bias
// ids, stop tokens under min_tokens, output tokens), so accept() touches one
// entry and prepare() is linear in the entries, never in the prompt's length or
// the vocabulary.
class PenaltyProcessor final : public LogitsProcessor {
 public:
  PenaltyProcessor(const PenaltyParams& params, std::span<const Token> prompt)
      : presence_(params.presence_penalty),
        frequency_(params.frequency_penalty),
        repetition_(params.repetition_penalty),
        min_tokens_(params.min_tokens),
        track_output_(params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f ||
                      params.repetition_penalty != 1.0f) {
    if (repetition_ != 1.0f) {
      for (Token t : prompt) entry(t).in_prompt = true;
    }
    for (const auto& [token, bias] : params.logit_bias) {
      if (bias != 0.0f) entry(token).logit_bias = bias;
    }
    if (min_tokens_ > 0) {
      for (Token t : params.stop_tokens) entry(t).is_stop = true;
    }
  }

  void prepare(LogitAdjustments& out) override {
    out.clear();
    out.edits.reserve(entries_.size());
    const bool stops_forbidden = output_len_ < min_tokens_;
    for (const Entry& e : entries_) {
      const bool seen = e.count > 0;
      LogitEdit edit;
      edit.token = e.token;
      edit.scale = (e.in_prompt || seen) ? repetition_ : 1.0f;
      // -(frequency * count + presence * [count > 0]) + logit_bias
      edit.bias =
          e.logit_bias - (frequency_ * static_cast<float>(e.count) + (seen ? presence_ : 0.0f));
      if (e.is_stop && stops_forbidden) edit.bias = -std::numeric_limits<float>::infinity();
      if (edit.scale != 1.0f || edit.bias != 0.0f) out.edits.push_back(edit);
    }
  }

  void accept(Token token) override {
    if (output_len_ < std::numeric_limits<int64_t>::max()) ++output_len_;
    if (track_output_) ++entry(token).count;
  }

 private:
  struct Entry {
    Token token = 0;
    int32_t count = 0;  // times the output holds the token
    float logit_bias = 0.0f;
    bool in_prompt = false;  // counted by the repetition penalty
    bool is_stop = false;    // forbidden while the output is shorter than min_tokens
  };

  Entry& entry(Token token) {
    auto [it, inserted] = index_.try_emplace(token, entries_.size());
    if (inserted) entries_.push_back(Entry{.token = token});
    return entries_[it->second];
  }

  float presence_;
  float frequency_;
  float repetition_;
  int64_t min_tokens_;
  bool track_output_;
  int64_t output_len_ = 0;
  std::vector<Entry> entries_;
  std::unordered_map<Token, size_t> index_;
};

class ChainProcessor final : public LogitsProcessor {
 public:
  explicit ChainProcessor(std::vector<std::unique_ptr<LogitsProcessor>> members)
      : members_(std::move(members)) {}

  void prepare(LogitAdjustments& out) override {
    out.clear();
    bool masked = false;
    for (const auto& member : members_) {
      member->prepare(scratch_);
      out.edits.insert(out.edits.end(), scratch_.edits.begin(), scratch_.edits.end());
      if (scratch_.allowed.empty()) continue;
      if (!masked) {
        out.allowed = scratch_.allowed;
        masked = true;
        continue;
      }
      // A shorter mask forbids what it does not cover: the intersection is as
      // long as the shorter one.
      const size_t words = std::min(out.allowed.size(), scratch_.allowed.size());
      out.allowed.resize(words);
      for (size_t w = 0; w < words; ++w) out.allowed[w] &= scratch_.allowed[w];
      // An empty mask would allow everything; keep "nothing allowed" as one zero word.
      if (out.allowed.empty()) out.allowed.push_back(0);
    }
  }

  void accept(Token token) override {
    for (const auto& member : members_) member->accept(token);
  }

 private:
  std::vector<std::unique_ptr<LogitsProcessor>> members_;
  LogitAdjustments scratch_;
};

}  // namespace

Status validate_penalties(const PenaltyParams& params, int32_t vocab_size) {
  if (vocab_size <= 0) {
    return InvalidArgument("vocab_size must be > 0, got " + std::to_string(vocab_size));
  }
  if (!in_range(params.presence_penalty, -2.0f, 2.0f)) {
    return InvalidArgument("presence_penalty must be finite and in [-2, 2], got " +
                           format_float(params.presence_penalty));
  }
  if (!in_range(params.frequency_penalty, -2.0f, 2.0f)) {
    return InvalidArgument("frequency_penalty must be finite and in [-2, 2], got " +
                           format_float(params.frequency_penalty));
  }
  if (!std::isfinite(params.repetition_penalty) || params.repetition_penalty <= 0.0f) {
    return InvalidArgument("repetition_penalty must be finite and > 0, got " +
                           format_float(params.repetition_penalty));
  }
  if (params.min_tokens < 0) {
    return InvalidArgument("min_tokens must be >= 0, got " + std::to_string(params.min_tokens));
  }
  std::unordered_set<Token> seen;
  for (const auto& [token, bias] : params.logit_bias) {
    if (token < 0 || token >= vocab_size) {
      return InvalidArgument("logit_bias: token " + std::to_string(token) + " is outside [0, " +
                             std::to_string(vocab_size) + ")");
    }
    if (!seen.insert(token).second) {
      return InvalidArgument("logit_bias: token " + std::to_string(token) + " appears twice");
    }
    if (!in_range(bias, -100.0f, 100.0f)) {
      return InvalidArgument("logit_bias: the bias of token " + std::to_string(token) +
                             " must be finite and in [-100, 100], got " + format_float(bias));
    }
  }
  for (Token token : params.stop_tokens) {
    if (token < 0 || token >= vocab_size) {
      return InvalidArgument("stop_tokens: token " + std::to_string(token) + " is outside [0, " +
                             std::to_string(vocab_size) + ")");
    }
  }
  return Status::Ok();
}

bool penalties_are_neutral(const PenaltyParams& params) {
  if (params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f ||
      params.repetition_penalty != 1.0f) {
    return false;
  }
  for (const auto& entry : params.logit_bias) {
    if (entry.second != 0.0f) return false;
  }
  return params.min_tokens == 0 || params.stop_tokens.empty();
}

std::unique_ptr<LogitsProcessor> make_penalty_processor(const PenaltyParams& params,
                                                        std::span<const Token> prompt) {
  return std::make_unique<PenaltyProcessor>(params, prompt);
}

std::unique_ptr<LogitsProcessor> chain_logits_processors(
    std::vector<std::unique_ptr<LogitsProcessor>> processors) {
  std::erase(processors, nullptr);
  if (processors.size() == 1) return std::move(processors.front());
  return std::make_unique<ChainProcessor>(std::move(processors));
}

}  // namespace cellm
