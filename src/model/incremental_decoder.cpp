#include <string>

#include "cellm/tokenizer.h"
#include "tokenizer_impl.h"

namespace cellm {
namespace {

bool ends_with_replacement(const std::string& text) {
  return text.ends_with("\xEF\xBF\xBD");
}

}  // namespace

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : impl_(tokenizer.impl_), skip_special_tokens_(skip_special_tokens) {}

// The held tokens are decoded as a continuation of everything sent so far. Text
// that ends in U+FFFD may still be an incomplete character, so it is held until
// a later token completes it; sending only text that ends on a complete
// character keeps the segments' concatenation equal to the whole decode.
std::string IncrementalDecoder::feed(Token id) {
  held_.push_back(id);
  DecodeState state{at_first_token_, text_started_};
  std::string text = impl_->decode(held_, skip_special_tokens_, state);
  if (ends_with_replacement(text) && held_.size() < kMaxHeldTokens) return {};
  held_.clear();
  at_first_token_ = state.at_first_token;
  text_started_ = state.text_started;
  return text;
}

std::string IncrementalDecoder::flush() {
  if (held_.empty()) return {};
  DecodeState state{at_first_token_, text_started_};
  std::string text = impl_->decode(held_, skip_special_tokens_, state);
  held_.clear();
  at_first_token_ = state.at_first_token;
  text_started_ = state.text_started;
  return text;
}

}  // namespace cellm
