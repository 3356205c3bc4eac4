#include "serve/reasoning.h"

#include <algorithm>
#include <utility>

namespace cellm::serve {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// Length of the longest tail of `text` that is a proper prefix of `marker`.
size_t marker_prefix_suffix(std::string_view text, std::string_view marker) {
  for (size_t len = std::min(marker.size() - 1, text.size()); len > 0; --len) {
    if (text.substr(text.size() - len) == marker.substr(0, len)) return len;
  }
  return 0;
}

}  // namespace

bool template_uses_reasoning(std::string_view template_source) {
  return template_source.find(kOpen) != std::string_view::npos &&
         template_source.find(kClose) != std::string_view::npos;
}

bool prompt_opens_reasoning(std::string_view prompt) {
  const size_t open = prompt.rfind(kOpen);
  if (open == std::string_view::npos) return false;
  const size_t close = prompt.rfind(kClose);
  return close == std::string_view::npos || close < open;
}

ReasoningStreamParser::ReasoningStreamParser(bool starts_in_reasoning)
    : state_(starts_in_reasoning ? State::kReasoning : State::kStart) {}

ReasoningChunk ReasoningStreamParser::push(std::string_view text) {
  buf_.append(text);
  run(/*at_end=*/false);
  return std::exchange(out_, ReasoningChunk{});
}

ReasoningChunk ReasoningStreamParser::finish() {
  run(/*at_end=*/true);
  buf_.clear();
  return std::exchange(out_, ReasoningChunk{});
}

void ReasoningStreamParser::run(bool at_end) {
  for (;;) {
    switch (state_) {
      case State::kStart: {
        // Whitespace, then <think> or not.
        size_t i = 0;
        while (i < buf_.size() && is_ws(buf_[i])) ++i;
        const std::string_view rest = std::string_view(buf_).substr(i);
        if (rest.substr(0, kOpen.size()) == kOpen) {
          buf_.erase(0, i + kOpen.size());
          state_ = State::kReasoning;
          continue;
        }
        if (!at_end && rest.size() < kOpen.size() && kOpen.substr(0, rest.size()) == rest) {
          return;  // may still become <think>
        }
        state_ = State::kContent;
        continue;
      }
      case State::kReasoning: {
        if (!reasoning_started_) {
          size_t i = 0;
          while (i < buf_.size() && buf_[i] == '\n') ++i;
          buf_.erase(0, i);
          if (buf_.empty()) return;
        }
        const size_t close = buf_.find(kClose);
        if (close != std::string::npos) {
          size_t end = close;
          while (end > 0 && buf_[end - 1] == '\n') --end;
          out_.reasoning.append(buf_, 0, end);
          buf_.erase(0, close + kClose.size());
          state_ = State::kAfterReasoning;
          continue;
        }
        // Hold a tail that may start </think>, with the newlines before it.
        size_t keep = at_end ? 0 : marker_prefix_suffix(buf_, kClose);
        size_t cut = buf_.size() - keep;
        while (cut > 0 && buf_[cut - 1] == '\n') --cut;
        if (at_end) {
          out_.reasoning.append(buf_, 0, cut);  // trailing newlines dropped
          buf_.clear();
          return;
        }
        if (cut > 0) reasoning_started_ = true;
        out_.reasoning.append(buf_, 0, cut);
        buf_.erase(0, cut);
        return;
      }
      case State::kAfterReasoning: {
        size_t i = 0;
        while (i < buf_.size() && buf_[i] == '\n') ++i;
        buf_.erase(0, i);
        if (buf_.empty()) return;
        state_ = State::kContent;
        continue;
      }
      case State::kContent:
        out_.content += buf_;
        buf_.clear();
        return;
    }
  }
}

ReasoningChunk split_reasoning(std::string_view text, bool starts_in_reasoning) {
  ReasoningStreamParser parser(starts_in_reasoning);
  ReasoningChunk a = parser.push(text);
  ReasoningChunk b = parser.finish();
  a.reasoning += b.reasoning;
  a.content += b.content;
  return a;
}

}  // namespace cellm::serve
