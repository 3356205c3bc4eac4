// Fuzzes the tool-call parsers (src/serve/tool_calls.h) on arbitrary generated
// text, in each format (hermes, llama3, mistral):
//   - parse_tool_calls of the whole text;
//   - ToolCallStreamParser fed the same text in fuzzer-chosen pieces, which must
//     give exactly the one-shot result (the header's documented equivalence):
//     the same content and the same calls (index, id, name, arguments) in order;
//   - every call has a name and its arguments are the text of a JSON object;
//   - a text in which no call was found comes back as content verbatim;
//   - content is released promptly: while the text so far holds no byte that may
//     open a call ('<' of a marker, '[' for mistral, '{' for llama3), everything
//     but its trailing whitespace has been released.
// Input: the text, then (read from the end by FuzzedDataProvider) the id seed
// and the split points, so that mutations of the seeds mostly change the text.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.h"
#include "serve/tool_calls.h"

namespace {

using cellm::serve::ToolCallFormat;

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// The bytes that may start a call (or its marker) in `format`.
std::string_view openers(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "<";
    case ToolCallFormat::kMistral:
      return "[";
    case ToolCallFormat::kLlama3:
      return "<{";
  }
  return "<";
}

void check_format(ToolCallFormat format, const std::string& text, const std::vector<size_t>& cuts,
                  uint64_t seed) {
  const cellm::serve::ParsedToolCalls one =
      cellm::serve::parse_tool_calls(format, text, cellm::serve::ToolCallIds(seed));
  for (const cellm::serve::ToolCall& call : one.calls) {
    FUZZ_CHECK(!call.name.empty(), "a call has a name");
    FUZZ_CHECK(!call.id.empty(), "a call has an id");
    const nlohmann::json args = nlohmann::json::parse(call.arguments, nullptr, false);
    FUZZ_CHECK(!args.is_discarded() && args.is_object(), "arguments are a JSON object's text");
  }
  if (one.calls.empty()) FUZZ_CHECK(one.content == text, "no call: the text is the content");

  cellm::serve::ToolCallStreamParser stream(format, cellm::serve::ToolCallIds(seed));
  std::string content;
  std::vector<cellm::serve::ToolCallDelta> calls;
  const auto take = [&](cellm::serve::ToolCallChunk chunk) {
    content += chunk.content;
    for (cellm::serve::ToolCallDelta& d : chunk.calls) calls.push_back(std::move(d));
  };
  size_t from = 0;
  for (size_t cut : cuts) {
    take(stream.push(std::string_view(text).substr(from, cut - from)));
    from = cut;
    const std::string_view so_far = std::string_view(text).substr(0, cut);
    if (so_far.find_first_of(openers(format)) == std::string_view::npos) {
      size_t end = so_far.size();
      while (end > 0 && is_ws(so_far[end - 1])) --end;
      FUZZ_CHECK(content == so_far.substr(0, end), "content without openers is released");
    }
  }
  take(stream.push(std::string_view(text).substr(from)));
  take(stream.finish());

  FUZZ_CHECK(content == one.content, "streamed content == one-shot content");
  FUZZ_CHECK(calls.size() == one.calls.size(), "streamed calls == one-shot calls");
  FUZZ_CHECK(stream.calls() == static_cast<int>(calls.size()), "calls() counts the calls");
  for (size_t i = 0; i < calls.size(); ++i) {
    FUZZ_CHECK(calls[i].index == static_cast<int>(i), "call indices count from 0");
    FUZZ_CHECK(calls[i].id == one.calls[i].id, "streamed id == one-shot id");
    FUZZ_CHECK(calls[i].name == one.calls[i].name, "streamed name == one-shot name");
    FUZZ_CHECK(calls[i].arguments == one.calls[i].arguments,
               "streamed arguments == one-shot arguments");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 16384) return 0;  // the parsers are linear; longer texts only slow the search
  FuzzedDataProvider fdp(data, size);
  // Controls come from the end of the input; the text is what is left at its front.
  const uint64_t seed = fdp.ConsumeIntegral<uint8_t>();
  const int pieces = fdp.ConsumeIntegralInRange<int>(0, 24);
  std::vector<uint16_t> raw;
  for (int i = 0; i < pieces; ++i) raw.push_back(fdp.ConsumeIntegral<uint16_t>());
  const std::string text = fdp.ConsumeRemainingBytesAsString();
  std::vector<size_t> cuts;
  for (uint16_t r : raw) cuts.push_back(text.empty() ? 0 : r % (text.size() + 1));
  std::sort(cuts.begin(), cuts.end());  // repeated cuts push empty pieces
  for (ToolCallFormat format :
       {ToolCallFormat::kHermes, ToolCallFormat::kLlama3, ToolCallFormat::kMistral}) {
    check_format(format, text, cuts, seed);
  }
  return 0;
}
