#include "serve/chat_tools.h"

#include <string>
#include <vector>

namespace cellm::cli {

namespace {

// Whether `marker` is one special token of the tokenizer (then decoded text never
// holds it).
bool special_token(const Tokenizer& tokenizer, const std::string& marker) {
  const std::vector<Token> ids = tokenizer.encode(marker, /*add_special_tokens=*/false);
  return ids.size() == 1 && tokenizer.is_special(ids[0]);
}

}  // namespace

ApiResult<std::optional<Grammar>> tool_choice_grammar(const Tokenizer& tokenizer,
                                                      const ChatConversation& conversation,
                                                      std::optional<serve::ToolCallFormat> format) {
  const bool named = conversation.tool_choice == ToolChoice::kNamed;
  if (!named && conversation.tool_choice != ToolChoice::kRequired) {
    return std::optional<Grammar>();
  }
  if (!format) {
    return invalid_field("tool_choice", "this model's chat template shows no tool-call format");
  }
  std::vector<ToolCallSchema> functions;
  for (const ToolFunction& f : conversation.functions) {
    if (named && f.name != conversation.named_function) continue;
    functions.push_back(ToolCallSchema{f.name, f.parameters.dump()});
  }
  const bool marker_in_text =
      !(*format == serve::ToolCallFormat::kMistral && special_token(tokenizer, "[TOOL_CALLS]"));
  const bool allow_many = !named && conversation.parallel_tool_calls;
  Result<Grammar> g =
      serve::compile_tool_call_grammar(*format, functions, allow_many, marker_in_text);
  if (!g.ok()) {
    return invalid_field(
        "tools", "tool_choice needs a grammar of the tools' calls, but " + g.status().message());
  }
  return std::optional<Grammar>(std::move(*g));
}

}  // namespace cellm::cli
