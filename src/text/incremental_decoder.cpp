#include <string>

#include "cellm/tokenizer.h"
#include "tokenizer_impl.h"
#include "unicode.h"

namespace cellm {
namespace {

bool ends_with_replacement(const std::string& text) {
  return text.ends_with("\xEF\xBF\xBD");
}

// The byte offset where the last `max_chars` or fewer trailing `content`
// characters of `text` begin.
size_t trailing_run_begin(const std::string& text, const TrailingStrip& strip) {
  std::string content;
  unicode::append_utf8(content, strip.content);
  size_t begin = text.size();
  for (size_t n = 0; n < strip.max_chars && begin >= content.size() &&
                     text.compare(begin - content.size(), content.size(), content) == 0;
       ++n) {
    begin -= content.size();
  }
  return begin;
}

}  // namespace

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : impl_(tokenizer.impl_), skip_special_tokens_(skip_special_tokens) {}

// The held tokens are decoded as a continuation of everything sent so far. Text
// that ends in U+FFFD may still be an incomplete character, so it is held until
// a later token completes it; sending only text that ends on a complete
// character keeps the segments' concatenation equal to the whole decode. When
// the decoder cuts characters from the end of the whole text, a trailing run of
// them is held back too, until later text shows it is not the end.
std::string IncrementalDecoder::feed(Token id) {
  held_.push_back(id);
  DecodeState state{at_first_token_, text_started_, /*apply_trailing_strip=*/false};
  std::string text = impl_->decode(held_, skip_special_tokens_, state);
  if (ends_with_replacement(text) && held_.size() < kMaxHeldTokens) return {};
  held_.clear();
  at_first_token_ = state.at_first_token;
  text_started_ = state.text_started;
  if (!impl_->decoder) return text;
  const std::optional<TrailingStrip> strip = impl_->decoder->trailing_strip();
  if (!strip) return text;
  text = held_text_ + text;
  const size_t keep = trailing_run_begin(text, *strip);
  held_text_ = text.substr(keep);
  text.resize(keep);
  return text;
}

std::string IncrementalDecoder::flush() {
  std::string text;
  if (!held_.empty()) {
    DecodeState state{at_first_token_, text_started_, /*apply_trailing_strip=*/false};
    text = impl_->decode(held_, skip_special_tokens_, state);
    held_.clear();
    at_first_token_ = state.at_first_token;
    text_started_ = state.text_started;
  }
  text = held_text_ + text;
  held_text_.clear();
  if (impl_->decoder) {
    if (const std::optional<TrailingStrip> strip = impl_->decoder->trailing_strip()) {
      text.resize(trailing_run_begin(text, *strip));
    }
  }
  return text;
}

}  // namespace cellm
