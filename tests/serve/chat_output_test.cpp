// Tests of ChatOutputParser and compile_tool_call_grammar (cellm/chat_output.h):
// reasoning, content and tool calls split from one reply, whole and fed in every
// split; parallel_tool_calls false keeps only the first call; and for each format
// the constrained grammar's sentences (random walks over a byte vocabulary) parse
// back into calls of the allowed functions, with Mistral's special-token marker
// left out.
#include "cellm/chat_output.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace cellm::serve {
namespace {

ChatOutputParser::Output feed(const ChatOutputOptions& options, std::string_view text,
                              const std::vector<size_t>& cuts) {
  ChatOutputParser parser(options);
  ChatOutputParser::Output out;
  size_t at = 0;
  for (size_t cut : cuts) {
    out.append(parser.push(text.substr(at, cut - at)));
    at = cut;
  }
  out.append(parser.push(text.substr(at)));
  out.append(parser.finish());
  EXPECT_EQ(parser.calls(), static_cast<int>(out.calls.size()));
  return out;
}

void expect_same(const ChatOutputParser::Output& a, const ChatOutputParser::Output& b) {
  EXPECT_EQ(a.reasoning, b.reasoning);
  EXPECT_EQ(a.content, b.content);
  ASSERT_EQ(a.calls.size(), b.calls.size());
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].index, b.calls[i].index);
    EXPECT_EQ(a.calls[i].name, b.calls[i].name);
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments);
  }
}

TEST(ChatOutputParser, SplitsReasoningContentAndCalls) {
  const ChatOutputOptions options{false, ToolCallFormat::kHermes, true};
  const std::string text =
      "<think>\nI should look it up.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": "
      "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n"
      "{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  const ChatOutputParser::Output whole = feed(options, text, {});
  EXPECT_EQ(whole.reasoning, "I should look it up.");
  EXPECT_EQ(whole.content, "Let me check.");
  ASSERT_EQ(whole.calls.size(), 2u);
  EXPECT_EQ(whole.calls[0].name, "get_weather");
  EXPECT_EQ(whole.calls[0].arguments, "{\"city\":\"Paris\"}");
  EXPECT_EQ(whole.calls[1].index, 1);
  EXPECT_FALSE(whole.calls[0].id.empty());
  // Every split into three pieces gives the same.
  for (size_t i = 0; i <= text.size(); i += 3) {
    for (size_t j = i; j <= text.size(); j += 7) expect_same(feed(options, text, {i, j}), whole);
  }
}

TEST(ChatOutputParser, WithoutParallelCallsKeepsTheFirstCall) {
  const ChatOutputOptions options{std::nullopt, ToolCallFormat::kHermes, false};
  const std::string call = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>";
  const ChatOutputParser::Output out = feed(options, call + "\n" + call, {5, 40});
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "a");
}

TEST(ChatOutputParser, WithoutToolsOrReasoningTheTextIsContent) {
  const std::string text =
      "<think>x</think><tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>";
  const ChatOutputParser::Output out = feed(ChatOutputOptions{}, text, {3});
  EXPECT_EQ(out.content, text);
  EXPECT_TRUE(out.reasoning.empty());
  EXPECT_TRUE(out.calls.empty());
  // A prompt that opened the block: everything up to </think> is reasoning.
  const ChatOutputParser::Output open =
      feed(ChatOutputOptions{true, std::nullopt, true}, "thinking\n</think>\n\nhi", {4});
  EXPECT_EQ(open.reasoning, "thinking");
  EXPECT_EQ(open.content, "hi");
}

// Random walks over a byte vocabulary through the grammar of `format`; each finished
// walk must parse into calls of the allowed functions with valid arguments.
void walk_and_parse(ToolCallFormat format, bool marker_in_text) {
  const std::vector<ToolCallSchema> functions = {
      {"get_weather", R"({"type": "object", "properties": {"city": {"type": "string",
        "maxLength": 5}, "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"],
        "additionalProperties": false})"},
      {"ping", R"({"type": "object", "properties": {}, "additionalProperties": false})"}};
  Result<Grammar> g =
      compile_tool_call_grammar(format, functions, /*allow_many=*/true, marker_in_text);
  ASSERT_TRUE(g.ok()) << g.status().message();
  std::vector<std::string> bytes;
  for (int b = 1; b < 128; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  const Token eos = static_cast<Token>(bytes.size());
  bytes.push_back("");
  TokenVocabulary vocab = TokenVocabulary::build(bytes, {eos}).value();
  int parsed = 0;
  for (uint64_t seed = 0; seed < 30; ++seed) {
    GrammarMatcher m(*g, vocab);
    std::mt19937_64 rng(seed);
    std::string out;
    for (int step = 0; step < 3000 && !m.ended(); ++step) {
      const std::vector<uint64_t>& mask = m.next_token_mask();
      std::vector<Token> allowed;
      for (Token id = 0; id < static_cast<Token>(vocab.size()); ++id) {
        if ((mask[id >> 6] >> (id & 63)) & 1) allowed.push_back(id);
      }
      ASSERT_FALSE(allowed.empty());
      Token t = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      if (m.can_end() && rng() % 2 == 0) t = eos;
      ASSERT_TRUE(m.accept_token(t));
      if (t != eos) out += vocab.bytes(t);
    }
    if (!m.ended()) continue;
    if (format == ToolCallFormat::kMistral) {
      EXPECT_EQ(out.rfind("[TOOL_CALLS]", 0) == 0, marker_in_text) << out;
    }
    const ChatOutputParser::Output calls =
        feed(ChatOutputOptions{std::nullopt, format, true}, out, {out.size() / 2});
    EXPECT_TRUE(calls.content.empty()) << out;
    ASSERT_FALSE(calls.calls.empty()) << out;
    for (const ToolCallDelta& c : calls.calls) {
      const nlohmann::json args = nlohmann::json::parse(c.arguments);
      if (c.name == "get_weather") {
        EXPECT_TRUE(args.at("city").is_string());
        EXPECT_TRUE(args.at("unit") == "c" || args.at("unit") == "f");
      } else {
        EXPECT_EQ(c.name, "ping");
        EXPECT_TRUE(args.is_object() && args.empty());
      }
    }
    ++parsed;
  }
  EXPECT_GE(parsed, 15);
}

TEST(ToolCallGrammarFormats, HermesCallsParseBack) {
  walk_and_parse(ToolCallFormat::kHermes, true);
}
TEST(ToolCallGrammarFormats, Llama3CallsParseBack) {
  walk_and_parse(ToolCallFormat::kLlama3, true);
}
TEST(ToolCallGrammarFormats, MistralCallsParseBack) {
  walk_and_parse(ToolCallFormat::kMistral, true);
}
TEST(ToolCallGrammarFormats, MistralCallsWithASpecialMarkerParseBack) {
  walk_and_parse(ToolCallFormat::kMistral, false);
}

}  // namespace
}  // namespace cellm::serve
