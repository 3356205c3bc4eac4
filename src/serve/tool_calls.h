// Tool-call parsing: splits a model's generated text into OpenAI message content
// and tool calls {id, name, arguments JSON text}, one-shot or incrementally.
//
// Formats (ToolCallFormat), as the families cellm loads emit them:
//   kHermes   <tool_call>{"name": N, "arguments": {...}}</tool_call>, any number of
//             them, text around (Qwen2.5, Qwen3, Hermes-style templates).
//   kLlama3   {"name": N, "parameters": {...}} (or "arguments") as the whole reply,
//             or after <|python_tag|>; several separated by ';' (Llama 3.1/3.2).
//   kMistral  [TOOL_CALLS][{"name": N, "arguments": {...}}, ...] (v0.3; a space may
//             follow the marker; the array alone also counts when it opens the reply,
//             for text decoded without special tokens) and [TOOL_CALLS]N[ARGS]{...}
//             (newer templates, one marker per call; N[CALL_ID]id[ARGS]{...} keeps the
//             model's id).
// The format comes from the chat template's source (detect_tool_call_format) or a
// name (tool_call_format_named, for --tool-call-parser).
//
// Content is the text outside the calls, with the whitespace that touches a call
// dropped (the templates add it back when rendering). A call that does not parse
// (broken JSON, no name, arguments not an object) stays in the content verbatim;
// nothing here throws or crashes on any input. Arguments come back as compact JSON
// text (keys in the model's order, invalid UTF-8 replaced).
//
// ToolCallStreamParser takes text deltas and releases content as soon as it cannot
// be part of a call marker (a held tail is at most a marker prefix plus whitespace),
// and each call once it is complete and valid, as one OpenAI tool-call delta
// (index, id, name and the whole arguments). Feeding any split of a text gives
// exactly parse_tool_calls of the whole text: parse_tool_calls is one push and finish.
//
// Not thread-safe: one parser per generated stream.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "cellm/chat_output.h"
#include "cellm/status.h"

namespace cellm::serve {

// ToolCallFormat, tool_call_format_named/_name, detect_tool_call_format and
// ToolCallDelta are declared in cellm/chat_output.h.

// Call ids: "call_" + 24 random letters and digits, or for kMistral 9 letters and digits
// (Mistral templates refuse any other id when the history is sent back).
class ToolCallIds {
 public:
  // Deterministic from the seed (tests, fuzzing).
  explicit ToolCallIds(uint64_t seed) : rng_(seed) {}
  // Seeded from std::random_device.
  static ToolCallIds random();
  std::string next(ToolCallFormat format);

 private:
  std::mt19937_64 rng_;
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object as text, OpenAI's function.arguments
};

struct ParsedToolCalls {
  std::string content;  // empty when the reply was only calls
  std::vector<ToolCall> calls;
};

// What one push()/finish() releases: content first, then the calls completed by it.
struct ToolCallChunk {
  std::string content;
  std::vector<ToolCallDelta> calls;
  bool empty() const { return content.empty() && calls.empty(); }
};

class ToolCallStreamParser {
 public:
  ToolCallStreamParser(ToolCallFormat format, ToolCallIds ids);

  ToolCallChunk push(std::string_view text);
  // Ends the stream: releases held text; an unfinished call is content unless what
  // was generated already is a complete, valid call.
  ToolCallChunk finish();
  // Calls released so far (finish_reason is "tool_calls" when > 0).
  int calls() const { return calls_; }

 private:
  enum class State { kContent, kCall, kLlamaAfterCall };
  // Where a Mistral call segment is: before its first byte, in a JSON array, in a
  // name (before [ARGS]), or in the arguments object after [ARGS].
  enum class MistralPhase { kStart, kArray, kName, kArgs };
  struct JsonScan {
    size_t pos = 0;  // next byte of buf_ to scan
    std::string closers;
    bool in_string = false;
    bool escape = false;
    bool started = false;
  };
  enum class ScanResult { kComplete, kIncomplete, kInvalid };

  void run(bool at_end);
  bool step_content(bool at_end);
  bool step_hermes(bool at_end);
  bool step_mistral(bool at_end);
  bool step_llama(bool at_end);
  bool step_llama_after(bool at_end);
  // Scans buf_ from scan_.pos for the JSON value starting at `start`; on kComplete or
  // kInvalid, *end is one past its last byte (or the offending byte).
  ScanResult scan_json(size_t start, size_t* end);
  // The call segment buf_[0, n) is not a call: it becomes content with the marker and
  // the whitespace held before it.
  void reject(size_t n);
  void emit_call(std::string name, std::string arguments, std::string id);
  void begin_call(std::string marker);

  ToolCallFormat format_;
  ToolCallIds ids_;
  State state_ = State::kContent;
  std::string buf_;       // text not yet released
  std::string marker_;    // the marker that opened the current call segment
  std::string held_ws_;   // whitespace before the current call (content again if it fails)
  bool at_start_ = true;  // only whitespace so far (a bare Llama 3 / Mistral call may start)
  bool after_call_ = false;
  size_t search_from_ = 0;  // bytes of buf_ already searched for a closing marker
  JsonScan scan_;
  MistralPhase phase_ = MistralPhase::kStart;
  size_t json_start_ = 0;  // where the segment's JSON value (or name) starts in buf_
  std::string name_;
  std::string model_id_;
  ToolCallChunk out_;
  int calls_ = 0;
};

// One-shot parse of a whole reply: the fuzz-friendly pure entry point (ids from
// ToolCallIds(seed) make it deterministic; ToolCallIds::random() for serving).
ParsedToolCalls parse_tool_calls(ToolCallFormat format, std::string_view text, ToolCallIds ids);

}  // namespace cellm::serve
