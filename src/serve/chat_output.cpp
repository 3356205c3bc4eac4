#include "cellm/chat_output.h"

#include <algorithm>
#include <utility>

#include "serve/reasoning.h"
#include "serve/tool_calls.h"

namespace cellm::serve {

void ChatOutputParser::Output::append(Output more) {
  reasoning += more.reasoning;
  content += more.content;
  for (ToolCallDelta& c : more.calls) calls.push_back(std::move(c));
}

struct ChatOutputParser::Impl {
  std::optional<ReasoningStreamParser> reasoning;
  std::optional<ToolCallStreamParser> tools;
  bool parallel = true;

  // The content (after the reasoning parser) through the tool-call parser.
  Output take_content(std::string_view content, bool at_end) {
    Output out;
    if (!tools) {
      out.content = content;
      return out;
    }
    ToolCallChunk chunk = tools->push(content);
    if (at_end) {
      ToolCallChunk last = tools->finish();
      chunk.content += last.content;
      for (ToolCallDelta& c : last.calls) chunk.calls.push_back(std::move(c));
    }
    out.content = std::move(chunk.content);
    for (ToolCallDelta& c : chunk.calls) {
      if (!parallel && c.index > 0) continue;  // parallel_tool_calls false: the first only
      out.calls.push_back(std::move(c));
    }
    return out;
  }

  Output run(std::string_view text, bool at_end) {
    if (!reasoning) {
      Output out = take_content(text, false);
      if (at_end) out.append(take_content({}, true));
      return out;
    }
    ReasoningChunk r = reasoning->push(text);
    if (at_end) {
      ReasoningChunk last = reasoning->finish();
      r.reasoning += last.reasoning;
      r.content += last.content;
    }
    Output out = take_content(r.content, at_end);
    out.reasoning = std::move(r.reasoning);
    return out;
  }
};

ChatOutputParser::ChatOutputParser(const ChatOutputOptions& options)
    : impl_(std::make_unique<Impl>()) {
  impl_->parallel = options.parallel_tool_calls;
  if (options.reasoning_starts_open) impl_->reasoning.emplace(*options.reasoning_starts_open);
  if (options.tool_format) impl_->tools.emplace(*options.tool_format, ToolCallIds::random());
}

ChatOutputParser::~ChatOutputParser() = default;
ChatOutputParser::ChatOutputParser(ChatOutputParser&&) noexcept = default;
ChatOutputParser& ChatOutputParser::operator=(ChatOutputParser&&) noexcept = default;

ChatOutputParser::Output ChatOutputParser::push(std::string_view text) {
  return impl_->run(text, /*at_end=*/false);
}

ChatOutputParser::Output ChatOutputParser::finish() {
  return impl_->run({}, /*at_end=*/true);
}

int ChatOutputParser::calls() const {
  if (!impl_->tools) return 0;
  return impl_->parallel ? impl_->tools->calls() : std::min(impl_->tools->calls(), 1);
}

Result<Grammar> compile_tool_call_grammar(ToolCallFormat format,
                                          std::span<const ToolCallSchema> functions,
                                          bool allow_many, bool marker_in_text,
                                          const GrammarLimits& limits) {
  ToolCallSyntax syntax;
  switch (format) {
    case ToolCallFormat::kHermes:
      syntax.call_open = "<tool_call>\n";
      syntax.call_close = "\n</tool_call>";
      syntax.separator = "\n";
      break;
    case ToolCallFormat::kLlama3:
      syntax.arguments_key = "parameters";
      syntax.separator = "; ";
      break;
    case ToolCallFormat::kMistral:
      syntax.prefix = marker_in_text ? "[TOOL_CALLS][" : "[";
      syntax.separator = ", ";
      syntax.suffix = "]";
      break;
  }
  return compile_tool_calls(syntax, functions, allow_many, limits);
}

}  // namespace cellm::serve
