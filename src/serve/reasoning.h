// Reasoning parsing: splits a reasoning model's generated text into OpenAI's
// reasoning_content and content at its <think>...</think> block, one-shot or
// incrementally.
//
// A reply that opens with <think> (after optional whitespace) has its reasoning up
// to </think> and its content after it. When the prompt already opened the block
// (Qwen3-style templates that end the generation prompt with "<think>\n", see
// prompt_opens_reasoning), the reply starts inside it: everything up to </think> is
// reasoning. A block that never closes (the reply was cut off) is all reasoning. A
// reply with no block is all content, verbatim. Newlines at both ends of the
// reasoning and at the start of the content after </think> are dropped, as the
// templates strip them when the history is rendered again.
//
// ReasoningStreamParser releases text as soon as it cannot be part of a marker or of
// newlines still to be dropped; feeding any split of a text gives exactly
// split_reasoning of the whole text (split_reasoning is one push and finish).
// Not thread-safe: one parser per generated stream.
#pragma once

#include <string>
#include <string_view>

#include "cellm/chat_output.h"

namespace cellm::serve {

// template_uses_reasoning and prompt_opens_reasoning are declared in
// cellm/chat_output.h.

struct ReasoningChunk {
  std::string reasoning;
  std::string content;
  bool empty() const { return reasoning.empty() && content.empty(); }
};

class ReasoningStreamParser {
 public:
  // starts_in_reasoning: the prompt opened the block (prompt_opens_reasoning).
  explicit ReasoningStreamParser(bool starts_in_reasoning);

  ReasoningChunk push(std::string_view text);
  ReasoningChunk finish();

 private:
  enum class State { kStart, kReasoning, kAfterReasoning, kContent };
  void run(bool at_end);

  State state_;
  bool reasoning_started_ = false;  // a non-newline byte of reasoning was released
  std::string buf_;
  ReasoningChunk out_;
};

// One-shot split of a whole reply: the fuzz-friendly pure entry point.
ReasoningChunk split_reasoning(std::string_view text, bool starts_in_reasoning);

}  // namespace cellm::serve
