// Chat output: what the serving library makes of a chat model's generated text
// and what it asks of its decoding, for OpenAI-style tool calls and reasoning.
//
// ChatOutputParser splits one choice's text, incrementally, into reasoning (the
// <think>...</think> block of templates that use one), content, and tool calls in
// the format the chat template teaches (ToolCallFormat). Feeding any split of a
// text gives the same reasoning, content and calls as feeding it whole.
//
// compile_tool_call_grammar makes a grammar (grammar.h) whose sentences are
// well-formed calls in a format, each naming one of the allowed functions with
// arguments valid against that function's parameters schema: constrained
// decoding of tool_choice "required" or a named function.
//
// Not thread-safe: one parser per generated stream.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cellm/grammar.h"
#include "cellm/status.h"

namespace cellm::serve {

// Tool-call formats of the families cellm loads:
//   kHermes   <tool_call>{"name": N, "arguments": {...}}</tool_call> (Qwen2.5, Qwen3,
//             Hermes-style templates), any number of them, text around.
//   kLlama3   {"name": N, "parameters": {...}} as the whole reply, or after
//             <|python_tag|>; several separated by ';' (Llama 3.1/3.2).
//   kMistral  [TOOL_CALLS][{"name": N, "arguments": {...}}, ...] (v0.3), or the array
//             alone opening the reply (the marker is a special token, skipped in text).
enum class ToolCallFormat { kHermes, kLlama3, kMistral };

// "hermes", "llama3" (or "llama3_json"), "mistral"; else InvalidArgument listing them.
Result<ToolCallFormat> tool_call_format_named(std::string_view name);
std::string_view tool_call_format_name(ToolCallFormat format);
// The format a chat template teaches its model, from markers in its source:
// "<tool_call>" -> kHermes, "[TOOL_CALLS]" -> kMistral, "<|python_tag|>" or a Llama 3
// header with a "parameters" call format -> kLlama3; nullopt when it shows none.
std::optional<ToolCallFormat> detect_tool_call_format(std::string_view template_source);

// Whether a chat template uses <think> blocks (then its replies go through the parser).
bool template_uses_reasoning(std::string_view template_source);
// Whether a rendered prompt leaves the generation inside an open <think> block: its
// last "<think>" comes after its last "</think>".
bool prompt_opens_reasoning(std::string_view prompt);

// One streamed tool call, as an OpenAI delta.tool_calls[] entry: index (0-based, per
// message), id and name (sent with the call's only delta), and the arguments (a JSON
// object as text, OpenAI's function.arguments).
struct ToolCallDelta {
  int index = 0;
  std::string id;
  std::string name;
  std::string arguments;
};

struct ChatOutputOptions {
  // Set when the template uses <think> blocks: whether the prompt opened one.
  std::optional<bool> reasoning_starts_open;
  // Set when tool calls are parsed (tools given, tool_choice not "none").
  std::optional<ToolCallFormat> tool_format;
  bool parallel_tool_calls = true;  // false: calls after the first are dropped
};

class ChatOutputParser {
 public:
  struct Output {
    std::string reasoning;
    std::string content;
    std::vector<ToolCallDelta> calls;
    void append(Output more);
  };

  explicit ChatOutputParser(const ChatOutputOptions& options);
  ~ChatOutputParser();
  ChatOutputParser(ChatOutputParser&&) noexcept;
  ChatOutputParser& operator=(ChatOutputParser&&) noexcept;

  Output push(std::string_view text);
  // Ends the stream: releases held text and a call completed at the end.
  Output finish();
  // Calls released so far (at most one without parallel_tool_calls).
  int calls() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The grammar of calls in `format` to one of `functions` (non-empty): one call, or
// with allow_many one or more (Hermes: several <tool_call> blocks; Llama 3: calls
// separated by "; "; Mistral: the array holds one or more). `marker_in_text`: the
// format's opening marker ("<tool_call>", "[TOOL_CALLS]") is generated as text; false
// for Mistral when [TOOL_CALLS] is a special token the tokenizer never puts in text
// (the grammar then starts at the array, which the parser accepts at the start of a
// reply). Errors name the function whose schema does not compile.
Result<Grammar> compile_tool_call_grammar(ToolCallFormat format,
                                          std::span<const ToolCallSchema> functions,
                                          bool allow_many, bool marker_in_text,
                                          const GrammarLimits& limits = {});

}  // namespace cellm::serve
