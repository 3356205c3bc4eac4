// compile_tool_calls: the grammar of tool calls accepts exactly well-formed calls
// (literal syntax around {"name": <allowed>, "<key>": <arguments per schema>}),
// one or, with allow_many, several; random walks over a byte vocabulary always
// end in calls that parse and name a declared function with its required
// arguments; errors name the function.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cellm/grammar.h"

namespace cellm {
namespace {

const std::vector<ToolCallSchema>& weather_tools() {
  static const std::vector<ToolCallSchema> k = {
      {"get_weather",
       R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
           "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"],
           "additionalProperties": false})"},
      {"get_time", R"({"type": "object", "properties": {"utc": {"type": "boolean"}},
                       "required": ["utc"], "additionalProperties": false})"}};
  return k;
}

ToolCallSyntax hermes() {
  ToolCallSyntax s;
  s.call_open = "<tool_call>\n";
  s.call_close = "\n</tool_call>";
  s.separator = "\n";
  return s;
}

// Whether `text` is a whole sentence of `g`.
bool accepts(const Grammar& g, const std::string& text) {
  std::vector<std::string> bytes(256);
  for (int b = 0; b < 256; ++b) bytes[b] = std::string(1, static_cast<char>(b));
  bytes.push_back("");  // EOS
  TokenVocabulary vocab = TokenVocabulary::build(bytes, {256}).value();
  GrammarMatcher m(g, vocab);
  return m.accept_bytes(text) && m.can_end();
}

TEST(ToolCallGrammar, AcceptsOneWellFormedCallOfADeclaredFunction) {
  Result<Grammar> g = compile_tool_calls(hermes(), weather_tools(), /*allow_many=*/false);
  ASSERT_TRUE(g.ok()) << g.status().message();
  const std::string call =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
      "\"unit\": \"c\"}}\n</tool_call>";
  EXPECT_TRUE(accepts(*g, call));
  EXPECT_TRUE(accepts(*g,
                      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"utc\": true}}\n"
                      "</tool_call>"));
  // Unknown function, a missing required argument, an undeclared one, a bad enum value.
  EXPECT_FALSE(
      accepts(*g, "<tool_call>\n{\"name\": \"get_news\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(accepts(*g,
                       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                       "\"Paris\"}}\n</tool_call>"));
  EXPECT_FALSE(accepts(*g,
                       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"utc\": true, "
                       "\"x\": 1}}\n</tool_call>"));
  EXPECT_FALSE(accepts(*g,
                       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                       "\"Paris\", \"unit\": \"k\"}}\n</tool_call>"));
  // Arguments of the other function under this name.
  EXPECT_FALSE(accepts(*g,
                       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": "
                       "\"Paris\", \"unit\": \"c\"}}\n</tool_call>"));
  // No text before or after, and only one call.
  EXPECT_FALSE(accepts(*g, "Sure. " + call));
  EXPECT_FALSE(accepts(*g, call + "\n" + call));
}

TEST(ToolCallGrammar, AllowManyAcceptsSeveralCallsSeparated) {
  Result<Grammar> g = compile_tool_calls(hermes(), weather_tools(), /*allow_many=*/true);
  ASSERT_TRUE(g.ok()) << g.status().message();
  const std::string a =
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"utc\": false}}\n</tool_call>";
  EXPECT_TRUE(accepts(*g, a));
  EXPECT_TRUE(accepts(*g, a + "\n" + a + "\n" + a));
  EXPECT_FALSE(accepts(*g, a + a));  // the separator is required
  EXPECT_FALSE(accepts(*g, ""));     // at least one call
}

TEST(ToolCallGrammar, SyntaxOfOtherFormats) {
  ToolCallSyntax mistral;
  mistral.prefix = "[TOOL_CALLS][";
  mistral.separator = ", ";
  mistral.suffix = "]";
  Result<Grammar> m = compile_tool_calls(mistral, weather_tools(), true);
  ASSERT_TRUE(m.ok()) << m.status().message();
  const std::string t = "{\"name\": \"get_time\", \"arguments\": {\"utc\": true}}";
  EXPECT_TRUE(accepts(*m, "[TOOL_CALLS][" + t + "]"));
  EXPECT_TRUE(accepts(*m, "[TOOL_CALLS][" + t + ", " + t + "]"));
  EXPECT_FALSE(accepts(*m, t));

  ToolCallSyntax llama;
  llama.arguments_key = "parameters";
  llama.separator = "; ";
  Result<Grammar> l = compile_tool_calls(llama, weather_tools(), false);
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_TRUE(accepts(*l, "{\"name\": \"get_time\", \"parameters\": {\"utc\": true}}"));
  EXPECT_FALSE(accepts(*l, t));
}

TEST(ToolCallGrammar, ErrorsNameTheFunction) {
  EXPECT_FALSE(compile_tool_calls(hermes(), {}, false).ok());
  std::vector<ToolCallSchema> dup = {weather_tools()[1], weather_tools()[1]};
  Result<Grammar> d = compile_tool_calls(hermes(), dup, false);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("get_time"), std::string::npos);
  std::vector<ToolCallSchema> bad = {weather_tools()[0],
                                     {"broken", R"({"type": "object", "patternProperties": {}})"}};
  Result<Grammar> b = compile_tool_calls(hermes(), bad, false);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("'broken'"), std::string::npos) << b.status().message();
  EXPECT_NE(b.status().message().find("patternProperties"), std::string::npos);
}

// Random walks: each step a token drawn uniformly from the mask over a vocabulary of
// single bytes, a few multi-byte pieces and EOS. Every walk that ends is one call
// whose JSON parses, names a declared function and has its required arguments.
TEST(ToolCallGrammar, RandomWalksEndInValidCalls) {
  Result<Grammar> g = compile_tool_calls(hermes(), weather_tools(), /*allow_many=*/true);
  ASSERT_TRUE(g.ok());
  std::vector<std::string> bytes;
  for (int b = 0; b < 128; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  for (const char* piece : {"<tool_call>", "\n</tool_call>", "\"get_weather\"", "\"Paris\"",
                            "{\"name\": \"", "true", "}}"}) {
    bytes.push_back(piece);
  }
  const Token eos = static_cast<Token>(bytes.size());
  bytes.push_back("");
  TokenVocabulary vocab = TokenVocabulary::build(bytes, {eos}).value();
  int ended = 0;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    GrammarMatcher m(*g, vocab);
    std::mt19937_64 rng(seed);
    std::string out;
    for (int step = 0; step < 4000 && !m.ended(); ++step) {
      const std::vector<uint64_t>& mask = m.next_token_mask();
      std::vector<Token> allowed;
      for (Token id = 0; id < static_cast<Token>(vocab.size()); ++id) {
        if ((mask[id >> 6] >> (id & 63)) & 1) allowed.push_back(id);
      }
      ASSERT_FALSE(allowed.empty()) << out;
      // EOS as soon as it is allowed, half the time, so walks end.
      Token t = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      if (m.can_end() && rng() % 2 == 0) t = eos;
      ASSERT_TRUE(m.accept_token(t));
      if (t != eos) out += vocab.bytes(t);
    }
    if (!m.ended()) continue;
    ++ended;
    size_t pos = 0;
    int calls = 0;
    while (pos < out.size()) {
      ASSERT_EQ(out.compare(pos, 12, "<tool_call>\n"), 0) << out;
      const size_t close = out.find("\n</tool_call>", pos);
      ASSERT_NE(close, std::string::npos) << out;
      const nlohmann::json call = nlohmann::json::parse(out.substr(pos + 12, close - pos - 12));
      const std::string name = call.at("name");
      if (name == "get_weather") {
        EXPECT_TRUE(call["arguments"].at("city").is_string());
        EXPECT_LE(call["arguments"]["city"].get<std::string>().size(), 12u * 4);
        EXPECT_TRUE(call["arguments"].at("unit") == "c" || call["arguments"]["unit"] == "f");
      } else {
        EXPECT_EQ(name, "get_time");
        EXPECT_TRUE(call["arguments"].at("utc").is_boolean());
      }
      ++calls;
      pos = close + 13;
      if (pos < out.size()) {
        ASSERT_EQ(out[pos], '\n') << out;
        ++pos;
      }
    }
    EXPECT_GE(calls, 1);
  }
  EXPECT_GE(ended, 20);
}

}  // namespace
}  // namespace cellm
