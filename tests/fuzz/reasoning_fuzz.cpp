// Fuzzes the reasoning parser (src/serve/reasoning.h) on arbitrary generated
// text, starting outside and inside a <think> block:
//   - split_reasoning of the whole text;
//   - ReasoningStreamParser fed the same text in fuzzer-chosen pieces, which must
//     give exactly the one-shot split (the header's documented equivalence);
//   - a text with no <think> (not started inside one) is all content, verbatim;
//   - nothing is invented: reasoning and content together are no longer than the
//     text, and each is a run of the text's bytes in order (a subsequence).
// Input: the text, then (read from the end by FuzzedDataProvider) whether the
// prompt opened the block and the split points.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.h"
#include "serve/reasoning.h"

namespace {

// Whether `part` is a subsequence of `whole`.
bool subsequence(std::string_view part, std::string_view whole) {
  size_t i = 0;
  for (char c : whole) {
    if (i < part.size() && part[i] == c) ++i;
  }
  return i == part.size();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 16384) return 0;  // the parser is linear; longer texts only slow the search
  FuzzedDataProvider fdp(data, size);
  const bool inside = fdp.ConsumeBool();
  const int pieces = fdp.ConsumeIntegralInRange<int>(0, 24);
  std::vector<uint16_t> raw;
  for (int i = 0; i < pieces; ++i) raw.push_back(fdp.ConsumeIntegral<uint16_t>());
  const std::string text = fdp.ConsumeRemainingBytesAsString();
  std::vector<size_t> cuts;
  for (uint16_t r : raw) cuts.push_back(text.empty() ? 0 : r % (text.size() + 1));
  std::sort(cuts.begin(), cuts.end());

  const cellm::serve::ReasoningChunk one = cellm::serve::split_reasoning(text, inside);
  FUZZ_CHECK(one.reasoning.size() + one.content.size() <= text.size(), "nothing is added");
  FUZZ_CHECK(subsequence(one.reasoning, text) && subsequence(one.content, text),
             "reasoning and content are the text's bytes in order");
  if (!inside && text.find("<think>") == std::string::npos) {
    FUZZ_CHECK(one.reasoning.empty() && one.content == text, "no block: all content, verbatim");
  }

  cellm::serve::ReasoningStreamParser stream(inside);
  cellm::serve::ReasoningChunk streamed;
  const auto take = [&](const cellm::serve::ReasoningChunk& chunk) {
    streamed.reasoning += chunk.reasoning;
    streamed.content += chunk.content;
  };
  size_t from = 0;
  for (size_t cut : cuts) {
    take(stream.push(std::string_view(text).substr(from, cut - from)));
    from = cut;
  }
  take(stream.push(std::string_view(text).substr(from)));
  take(stream.finish());
  FUZZ_CHECK(streamed.reasoning == one.reasoning, "streamed reasoning == one-shot reasoning");
  FUZZ_CHECK(streamed.content == one.content, "streamed content == one-shot content");

  (void)cellm::serve::template_uses_reasoning(text);
  (void)cellm::serve::prompt_opens_reasoning(text);
  return 0;
}
