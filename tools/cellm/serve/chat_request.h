// The chat endpoint's conversation fields, parsed from the body as an
// nlohmann::ordered_json so that key order (of tools' schemas, of tool-call
// arguments sent as objects) reaches the chat template as the client sent it:
//   messages             {role, content, name, tool_calls, tool_call_id,
//                        reasoning_content} objects; content a string, null or a
//                        list of {"type": "text", "text"} parts
//   tools                [{type: "function", function: {name, description,
//                        parameters (a JSON schema object), strict}}]
//   tool_choice          "none" | "auto" | "required" | {"type": "function",
//                        "function": {"name": N}} naming a declared tool
//   parallel_tool_calls  boolean (false: at most one call)
//   chat_template_kwargs an object; each key becomes a template variable
// Every error is a 400 naming the field and what is wrong with it.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "serve/api_error.h"

namespace cellm::cli {

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

// One declared function: its name and parameters schema ({} when absent).
struct ToolFunction {
  std::string name;
  nlohmann::ordered_json parameters;
};

struct ChatConversation {
  nlohmann::ordered_json messages;  // validated; keys whose value is null dropped
  nlohmann::ordered_json tools;     // null (the template sees None) or the tools as sent
  nlohmann::ordered_json kwargs;    // null or chat_template_kwargs
  std::vector<ToolFunction> functions;
  // Default: kAuto when tools are given, else kNone.
  ToolChoice tool_choice = ToolChoice::kNone;
  std::string named_function;  // with kNamed
  bool parallel_tool_calls = true;
};

// Parses and validates the body text's conversation fields (the body itself is
// already known to be a JSON object).
ApiResult<ChatConversation> parse_chat_conversation(const std::string& body_text);

}  // namespace cellm::cli
