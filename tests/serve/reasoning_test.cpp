// Tests of the reasoning parser (src/serve/reasoning.h): <think> blocks split into
// reasoning and content, a block opened by the prompt, cut-off blocks, replies
// without one, detection from templates and prompts, and the streaming parser fed
// every split of each text giving exactly the one-shot result.
#include "serve/reasoning.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace cellm::serve {
namespace {

ReasoningChunk stream(std::string_view text, bool starts_in_reasoning,
                      const std::vector<size_t>& cuts) {
  ReasoningStreamParser parser(starts_in_reasoning);
  ReasoningChunk out;
  size_t at = 0;
  const auto take = [&](const ReasoningChunk& c) {
    // Reasoning never follows content.
    if (!out.content.empty()) {
      EXPECT_TRUE(c.reasoning.empty()) << text;
    }
    out.reasoning += c.reasoning;
    out.content += c.content;
  };
  for (size_t cut : cuts) {
    take(parser.push(text.substr(at, cut - at)));
    at = cut;
  }
  take(parser.push(text.substr(at)));
  take(parser.finish());
  return out;
}

void expect_split(std::string_view text, bool starts_in_reasoning, const std::string& reasoning,
                  const std::string& content) {
  const ReasoningChunk whole = split_reasoning(text, starts_in_reasoning);
  EXPECT_EQ(whole.reasoning, reasoning) << text;
  EXPECT_EQ(whole.content, content) << text;
  for (size_t a = 0; a <= text.size(); ++a) {
    const ReasoningChunk one = stream(text, starts_in_reasoning, {a});
    EXPECT_EQ(one.reasoning, reasoning) << text << " | split at " << a;
    EXPECT_EQ(one.content, content) << text << " | split at " << a;
    for (size_t b = a; b <= text.size(); ++b) {
      const ReasoningChunk two = stream(text, starts_in_reasoning, {a, b});
      EXPECT_EQ(two.reasoning, reasoning) << text << " | cuts " << a << "," << b;
      EXPECT_EQ(two.content, content) << text << " | cuts " << a << "," << b;
    }
  }
  std::vector<size_t> bytes;
  for (size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
  const ReasoningChunk each = stream(text, starts_in_reasoning, bytes);
  EXPECT_EQ(each.reasoning, reasoning) << text << " | byte by byte";
  EXPECT_EQ(each.content, content) << text << " | byte by byte";
}

TEST(ReasoningTest, AThinkBlockSplitsReasoningFromContent) {
  expect_split("<think>\nLet me add.\n2+2=4\n</think>\n\nThe answer is 4.", false,
               "Let me add.\n2+2=4", "The answer is 4.");
}

TEST(ReasoningTest, AnEmptyBlockAsQwen3WritesWithThinkingOff) {
  expect_split("<think>\n\n</think>\n\nHello!", false, "", "Hello!");
}

TEST(ReasoningTest, LeadingWhitespaceBeforeTheBlockIsDropped) {
  expect_split("  \n<think>r</think>c", false, "r", "c");
}

TEST(ReasoningTest, APromptThatOpenedTheBlockStartsInReasoning) {
  expect_split("\nI should greet.\n</think>\n\nHi there.", true, "I should greet.", "Hi there.");
  expect_split("No think tags at all", true, "No think tags at all", "");
}

TEST(ReasoningTest, ACutOffBlockIsAllReasoning) {
  expect_split("<think>\nstill thinking\n\n", false, "still thinking", "");
  expect_split("<think>partial </thi", false, "partial </thi", "");
}

TEST(ReasoningTest, RepliesWithoutABlockAreContentVerbatim) {
  expect_split("Just an answer.\n", false, "", "Just an answer.\n");
  expect_split("  \nAnswer with <think> later</think>", false, "",
               "  \nAnswer with <think> later</think>");
  expect_split("<thin", false, "", "<thin");
  expect_split("", false, "", "");
  expect_split("", true, "", "");
}

TEST(ReasoningTest, OnlyTheFirstCloseEndsTheBlock) {
  expect_split("<think>a</think>b</think>\n", false, "a", "b</think>\n");
  expect_split("<think>x</think>\n\n<tool_call>{}</tool_call>", false, "x",
               "<tool_call>{}</tool_call>");
}

TEST(ReasoningTest, InnerNewlinesAndNearMarkersAreKept) {
  expect_split("<think>\n\na\n\nb <\\think> </thinker>\n\n</think>\n\n\nc\n", false,
               "a\n\nb <\\think> </thinker>", "c\n");
}

TEST(ReasoningTest, DetectionFromTemplatesAndPrompts) {
  EXPECT_TRUE(template_uses_reasoning("{{ '<think>\\n' + r + '\\n</think>' }}"));
  EXPECT_FALSE(template_uses_reasoning("{{ messages }}"));
  // Qwen3 with enable_thinking false closes the block in the prompt.
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  // Templates that open the block for the model.
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_TRUE(prompt_opens_reasoning("<think>old</think> ... <think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
}

// Random texts of markers, marker fragments, newlines and prose: random splits stream
// to the one-shot result, and nothing is lost (reasoning and content come from the text).
TEST(ReasoningTest, RandomPiecesAreSplitInvariant) {
  const std::vector<std::string> pieces = {"<think>", "</think>", "\n",  "\n\n", " ",  "a",
                                           "<",       "</thi",    "nk>", "<th",  "b\n"};
  std::mt19937 rng(4321);
  for (int round = 0; round < 2000; ++round) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) text += pieces[rng() % pieces.size()];
    for (bool starts_in : {false, true}) {
      const ReasoningChunk whole = split_reasoning(text, starts_in);
      EXPECT_LE(whole.reasoning.size() + whole.content.size(), text.size()) << text;
      std::vector<size_t> cuts;
      for (size_t at = 0; at < text.size();) {
        at += 1 + rng() % 4;
        if (at < text.size()) cuts.push_back(at);
      }
      const ReasoningChunk streamed = stream(text, starts_in, cuts);
      EXPECT_EQ(streamed.reasoning, whole.reasoning) << text;
      EXPECT_EQ(streamed.content, whole.content) << text;
    }
  }
}

}  // namespace
}  // namespace cellm::serve
