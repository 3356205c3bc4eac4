// Tests of the tool-call parsers (src/serve/tool_calls.h): each format with one
// and several calls, text around them, malformed calls kept as content, format
// detection from the real chat templates, ids, and the streaming parser fed every
// split of each text giving exactly the one-shot result.
#include "serve/tool_calls.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cellm::serve {
namespace {

using nlohmann::json;

constexpr uint64_t kSeed = 7;

ParsedToolCalls parse(ToolCallFormat format, std::string_view text) {
  return parse_tool_calls(format, text, ToolCallIds(kSeed));
}

struct Expected {
  std::string name;
  std::string arguments;
};

void expect_calls(const ParsedToolCalls& got, const std::string& content,
                  const std::vector<Expected>& calls) {
  EXPECT_EQ(got.content, content);
  ASSERT_EQ(got.calls.size(), calls.size()) << "content: " << got.content;
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(got.calls[i].name, calls[i].name) << i;
    EXPECT_EQ(got.calls[i].arguments, calls[i].arguments) << i;
    // Arguments are always a JSON object text.
    EXPECT_TRUE(json::parse(got.calls[i].arguments).is_object()) << got.calls[i].arguments;
  }
}

// Feeds `text` in the pieces split at `cuts` and reassembles what the parser released.
ParsedToolCalls stream(ToolCallFormat format, std::string_view text,
                       const std::vector<size_t>& cuts) {
  ToolCallStreamParser parser(format, ToolCallIds(kSeed));
  ParsedToolCalls out;
  size_t at = 0;
  int next_index = 0;
  const auto take = [&](ToolCallChunk chunk) {
    out.content += chunk.content;
    for (ToolCallDelta& d : chunk.calls) {
      EXPECT_EQ(d.index, next_index++);
      EXPECT_FALSE(d.id.empty());
      EXPECT_FALSE(d.name.empty());
      out.calls.push_back(ToolCall{d.id, d.name, d.arguments});
    }
  };
  for (size_t cut : cuts) {
    take(parser.push(text.substr(at, cut - at)));
    at = cut;
  }
  take(parser.push(text.substr(at)));
  take(parser.finish());
  EXPECT_EQ(parser.calls(), static_cast<int>(out.calls.size()));
  return out;
}

void expect_same(const ParsedToolCalls& a, const ParsedToolCalls& b, const std::string& where) {
  EXPECT_EQ(a.content, b.content) << where;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << where;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].id, b.calls[i].id) << where;
    EXPECT_EQ(a.calls[i].name, b.calls[i].name) << where;
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments) << where;
  }
}

// Every split into two pieces, every split into one-byte pieces, and every pair of cuts
// for short texts: all give the one-shot result.
void expect_split_invariant(ToolCallFormat format, std::string_view text) {
  const ParsedToolCalls whole = parse(format, text);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    expect_same(stream(format, text, {cut}), whole,
                std::string(text) + " | split at " + std::to_string(cut));
  }
  std::vector<size_t> bytes;
  for (size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
  expect_same(stream(format, text, bytes), whole, std::string(text) + " | byte by byte");
  if (text.size() <= 160) {
    for (size_t a = 1; a < text.size(); ++a) {
      for (size_t b = a; b < text.size(); b += 3) {
        expect_same(stream(format, text, {a, b}), whole,
                    std::string(text) + " | cuts " + std::to_string(a) + "," + std::to_string(b));
      }
    }
  }
}

const std::vector<std::string> kHermesTexts = {
    "plain text, no calls",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
    "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, {\"y\": \"}\"}]}}\n</tool_call>",
    "<tool_call>{\"name\": \"a\", \"arguments\": {\"s\": \"</tool\"}}</tool_call> and after",
    "<tool_call>{\"name\": \"a\", \"arguments\": {broken}</tool_call> tail",
    "<tool_call>{\"name\": \"a\", \"arguments\": {\"q\": 1}}",
    "<tool_call>{\"name\": \"a\", \"argu",
    "text <tool_ca",
    "  \n<tool_call>{\"name\": \"a\"}</tool_call>  \n",
    "<<tool_call>{\"name\": \"a\", \"arguments\": \"{\\\"k\\\": 2}\"}</tool_call>",
};

TEST(HermesToolCallsTest, OneCall) {
  expect_calls(parse(ToolCallFormat::kHermes, kHermesTexts[1]), "",
               {{"get_weather", R"({"city":"Paris"})"}});
}

TEST(HermesToolCallsTest, SeveralCallsWithTextBeforeThem) {
  expect_calls(parse(ToolCallFormat::kHermes, kHermesTexts[2]), "Let me check.",
               {{"a", "{}"}, {"b", R"({"x":[1,{"y":"}"}]})"}});
}

TEST(HermesToolCallsTest, TextAfterACallAndMarkersInsideStrings) {
  expect_calls(parse(ToolCallFormat::kHermes, kHermesTexts[3]), "and after",
               {{"a", R"({"s":"</tool"})"}});
}

TEST(HermesToolCallsTest, NoCallIsContentVerbatim) {
  expect_calls(parse(ToolCallFormat::kHermes, kHermesTexts[0]), "plain text, no calls", {});
  expect_calls(parse(ToolCallFormat::kHermes, kHermesTexts[7]), "text <tool_ca", {});
}

TEST(HermesToolCallsTest, BrokenJsonStaysContent) {
  expect_calls(parse(ToolCallFormat::kHermes, kHermesTexts[4]), kHermesTexts[4], {});
  expect_calls(parse(ToolCallFormat::kHermes, kHermesTexts[6]), kHermesTexts[6], {});
}

TEST(HermesToolCallsTest, AnUnclosedButCompleteCallAtTheEndCounts) {
  expect_calls(parse(ToolCallFormat::kHermes, kHermesTexts[5]), "", {{"a", R"({"q":1})"}});
}

TEST(HermesToolCallsTest, MissingArgumentsAreEmptyAndStringArgumentsAreDecoded) {
  expect_calls(parse(ToolCallFormat::kHermes, kHermesTexts[8]), "", {{"a", "{}"}});
  expect_calls(parse(ToolCallFormat::kHermes, kHermesTexts[9]), "<", {{"a", R"({"k":2})"}});
}

TEST(HermesToolCallsTest, NotACallShapeStaysContent) {
  for (const std::string text : {
           "<tool_call>{\"arguments\": {}}</tool_call>",                  // no name
           "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>",  // empty name
           "<tool_call>{\"name\": 3}</tool_call>",                        // name not a string
           "<tool_call>{\"name\": \"a\", \"arguments\": [1]}</tool_call>",
           "<tool_call>{\"name\": \"a\", \"arguments\": \"not json\"}</tool_call>",
           "<tool_call>[\"a\"]</tool_call>",
           "<tool_call>{\"name\": \"a\"} trailing</tool_call>",
       }) {
    expect_calls(parse(ToolCallFormat::kHermes, text), text, {});
  }
}

TEST(HermesToolCallsTest, StreamingAtEverySplitMatchesOneShot) {
  for (const std::string& text : kHermesTexts)
    expect_split_invariant(ToolCallFormat::kHermes, text);
}

const std::vector<std::string> kLlamaTexts = {
    "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}",
    "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}",
    "{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {\"y\": "
    "\"; {\"}}",
    "  {\"name\": \"a\", \"arguments\": {\"x\": 1}}\n{\"name\": \"b\", \"parameters\": {}}  ",
    "Sure. <|python_tag|>{\"name\": \"a\", \"parameters\": {\"q\": \"x\"}}",
    "{\"answer\": 4}",
    "{\"name\": \"a\", \"parameters\": {\"x\": 1}",
    "The answer is {\"name\": \"a\"}",
    "{\"name\": \"a\", \"parameters\": {}} and then prose",
    "{\"name\": \"a\", \"parameters\": {}}; oops",
    "<|python_tag|>brave_search.call(query=\"x\")",
    "{\"name\": \"a\", \"parameters\": {]}",
};

TEST(Llama3ToolCallsTest, TheWholeReplyIsACall) {
  expect_calls(parse(ToolCallFormat::kLlama3, kLlamaTexts[0]), "",
               {{"get_weather", R"({"city":"Paris","unit":"celsius"})"}});
}

TEST(Llama3ToolCallsTest, AfterThePythonTag) {
  expect_calls(parse(ToolCallFormat::kLlama3, kLlamaTexts[1]), "", {{"a", "{}"}});
  expect_calls(parse(ToolCallFormat::kLlama3, kLlamaTexts[4]), "Sure.", {{"a", R"({"q":"x"})"}});
}

TEST(Llama3ToolCallsTest, SeveralCallsSeparatedBySemicolonsOrNewlines) {
  expect_calls(parse(ToolCallFormat::kLlama3, kLlamaTexts[2]), "",
               {{"a", R"({"x":1})"}, {"b", R"({"y":"; {"})"}});
  expect_calls(parse(ToolCallFormat::kLlama3, kLlamaTexts[3]), "",
               {{"a", R"({"x":1})"}, {"b", "{}"}});
}

TEST(Llama3ToolCallsTest, JsonThatIsNotACallAndProseStayContent) {
  expect_calls(parse(ToolCallFormat::kLlama3, kLlamaTexts[5]), kLlamaTexts[5], {});
  expect_calls(parse(ToolCallFormat::kLlama3, kLlamaTexts[7]), kLlamaTexts[7], {});
  expect_calls(parse(ToolCallFormat::kLlama3, kLlamaTexts[10]), kLlamaTexts[10], {});
}

TEST(Llama3ToolCallsTest, BrokenJsonStaysContent) {
  expect_calls(parse(ToolCallFormat::kLlama3, kLlamaTexts[6]), kLlamaTexts[6], {});
  expect_calls(parse(ToolCallFormat::kLlama3, kLlamaTexts[11]), kLlamaTexts[11], {});
}

TEST(Llama3ToolCallsTest, TextAfterTheCallsIsContent) {
  expect_calls(parse(ToolCallFormat::kLlama3, kLlamaTexts[8]), "and then prose", {{"a", "{}"}});
  expect_calls(parse(ToolCallFormat::kLlama3, kLlamaTexts[9]), "; oops", {{"a", "{}"}});
}

TEST(Llama3ToolCallsTest, StreamingAtEverySplitMatchesOneShot) {
  for (const std::string& text : kLlamaTexts) expect_split_invariant(ToolCallFormat::kLlama3, text);
}

const std::vector<std::string> kMistralTexts = {
    "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
    "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}, \"id\": \"abcdefghi\"}, {\"name\": \"b\", "
    "\"arguments\": {\"k\": \"]\"}}]",
    "I will call it.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}",
    "[TOOL_CALLS]a[ARGS]{}[TOOL_CALLS]b[ARGS]{\"x\": [1, 2]} done",
    "[TOOL_CALLS]a[CALL_ID]Xy12Zw34Q[ARGS]{\"x\": 1}",
    "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}]",
    "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}, {\"oops\": 1}]",
    "[TOOL_CALLS]bad name[ARGS]{}",
    "[TOOL_CALLS][ARGS]{}",
    "[TOOL_CALLS]a[ARGS]not json",
    "[TOOL_CALLS]a[ARGS]{\"x\": ",
    "no calls [TOOL_CALL",
    "[TOOL_CALLS]broken {[TOOL_CALLS]ok[ARGS]{\"v\": true}",
    " [{\"name\": \"a\", \"arguments\": {\"k\": 1}}]",
    "[1, 2, 3]",
    "Text then [{\"name\": \"a\", \"arguments\": {}}]",
};

TEST(MistralToolCallsTest, AJsonArrayAfterTheMarker) {
  expect_calls(parse(ToolCallFormat::kMistral, kMistralTexts[0]), "",
               {{"get_weather", R"({"city":"Paris"})"}});
  expect_calls(parse(ToolCallFormat::kMistral, kMistralTexts[1]), "",
               {{"a", "{}"}, {"b", R"({"k":"]"})"}});
}

TEST(MistralToolCallsTest, ABareArrayOpeningTheReplyCountsAsDecodedWithoutSpecialTokens) {
  expect_calls(parse(ToolCallFormat::kMistral, kMistralTexts[13]), "", {{"a", R"({"k":1})"}});
  expect_calls(parse(ToolCallFormat::kMistral, kMistralTexts[14]), "[1, 2, 3]", {});
  expect_calls(parse(ToolCallFormat::kMistral, kMistralTexts[15]), kMistralTexts[15], {});
}

TEST(MistralToolCallsTest, TheNameArgsForm) {
  expect_calls(parse(ToolCallFormat::kMistral, kMistralTexts[2]), "I will call it.",
               {{"get_weather", R"({"city":"Paris"})"}});
  expect_calls(parse(ToolCallFormat::kMistral, kMistralTexts[3]), "done",
               {{"a", "{}"}, {"b", R"({"x":[1,2]})"}});
}

TEST(MistralToolCallsTest, TheModelsCallIdIsKept) {
  const ParsedToolCalls got = parse(ToolCallFormat::kMistral, kMistralTexts[4]);
  expect_calls(got, "", {{"a", R"({"x":1})"}});
  ASSERT_EQ(got.calls.size(), 1u);
  EXPECT_EQ(got.calls[0].id, "Xy12Zw34Q");
}

TEST(MistralToolCallsTest, MalformedCallsStayContent) {
  for (size_t i : {5u, 6u, 7u, 8u, 9u, 10u, 11u}) {
    expect_calls(parse(ToolCallFormat::kMistral, kMistralTexts[i]), kMistralTexts[i], {});
  }
}

TEST(MistralToolCallsTest, ABrokenSegmentDoesNotHideTheNextCall) {
  expect_calls(parse(ToolCallFormat::kMistral, kMistralTexts[12]), "[TOOL_CALLS]broken {",
               {{"ok", R"({"v":true})"}});
}

TEST(MistralToolCallsTest, StreamingAtEverySplitMatchesOneShot) {
  for (const std::string& text : kMistralTexts) {
    expect_split_invariant(ToolCallFormat::kMistral, text);
  }
}

TEST(ToolCallIdsTest, OpenAiAndMistralShapesDeterministicPerSeed) {
  ToolCallIds a(1);
  ToolCallIds b(1);
  std::set<std::string> seen;
  for (int i = 0; i < 50; ++i) {
    const std::string id = a.next(ToolCallFormat::kHermes);
    EXPECT_EQ(id, b.next(ToolCallFormat::kHermes));
    ASSERT_EQ(id.size(), 29u);
    EXPECT_EQ(id.substr(0, 5), "call_");
    for (char c : id.substr(5)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << id;
    seen.insert(id);
    const std::string m = a.next(ToolCallFormat::kMistral);
    EXPECT_EQ(m, b.next(ToolCallFormat::kMistral));
    ASSERT_EQ(m.size(), 9u);
    for (char c : m) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << m;
  }
  EXPECT_EQ(seen.size(), 50u);
  EXPECT_NE(ToolCallIds(1).next(ToolCallFormat::kHermes),
            ToolCallIds(2).next(ToolCallFormat::kHermes));
  const ParsedToolCalls two =
      parse(ToolCallFormat::kHermes,
            "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"a\"}</tool_call>");
  ASSERT_EQ(two.calls.size(), 2u);
  EXPECT_NE(two.calls[0].id, two.calls[1].id);
}

TEST(ToolCallFormatTest, NamesForTheCommandLineFlag) {
  EXPECT_EQ(*tool_call_format_named("hermes"), ToolCallFormat::kHermes);
  EXPECT_EQ(*tool_call_format_named("llama3"), ToolCallFormat::kLlama3);
  EXPECT_EQ(*tool_call_format_named("llama3_json"), ToolCallFormat::kLlama3);
  EXPECT_EQ(*tool_call_format_named("mistral"), ToolCallFormat::kMistral);
  const Result<ToolCallFormat> bad = tool_call_format_named("pythonic");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("pythonic"), std::string::npos);
  for (ToolCallFormat f :
       {ToolCallFormat::kHermes, ToolCallFormat::kLlama3, ToolCallFormat::kMistral}) {
    EXPECT_EQ(*tool_call_format_named(tool_call_format_name(f)), f);
  }
}

std::string fixture_template(const std::string& name) {
  std::ifstream in(std::filesystem::path(CELLM_SOURCE_DIR) /
                   ("tests/fixtures/chat_templates/openai/" + name + ".json"));
  EXPECT_TRUE(in.good()) << name;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return json::parse(buffer.str()).at("template").get<std::string>();
}

TEST(ToolCallFormatTest, DetectedFromTheRealChatTemplates) {
  EXPECT_EQ(detect_tool_call_format(fixture_template("qwen3")), ToolCallFormat::kHermes);
  EXPECT_EQ(detect_tool_call_format(fixture_template("llama3.1")), ToolCallFormat::kLlama3);
  EXPECT_EQ(detect_tool_call_format(fixture_template("llama3.2")), ToolCallFormat::kLlama3);
  EXPECT_EQ(detect_tool_call_format(fixture_template("mistral-v0.3")), ToolCallFormat::kMistral);
  // Llama 3's plain template teaches no call format.
  EXPECT_EQ(detect_tool_call_format(fixture_template("llama3")), std::nullopt);
  EXPECT_EQ(detect_tool_call_format("{{ messages }}"), std::nullopt);
}

TEST(ToolCallRobustnessTest, HostileInputsNeverCrashAndAreSplitInvariant) {
  std::string deep = "<tool_call>{\"name\": \"a\", \"arguments\": ";
  for (int i = 0; i < 5000; ++i) deep += "[";
  deep += "</tool_call>";
  const std::vector<std::string> hostile = {
      deep,
      std::string("[TOOL_CALLS]") + std::string(3000, '['),
      std::string(3000, '{'),
      "<tool_call>{\"name\": \"\xff\xfe\", \"arguments\": {}}</tool_call>",
      "[TOOL_CALLS]" + std::string(400, 'a') + "[ARGS]{}",
      std::string("\0<tool_call>\0", 13),
  };
  for (const std::string& text : hostile) {
    for (ToolCallFormat f :
         {ToolCallFormat::kHermes, ToolCallFormat::kLlama3, ToolCallFormat::kMistral}) {
      const ParsedToolCalls whole = parse(f, text);
      EXPECT_TRUE(whole.calls.empty());
      EXPECT_EQ(whole.content, text);
      std::vector<size_t> cuts;
      for (size_t i = 7; i < text.size(); i += 7) cuts.push_back(i);
      expect_same(stream(f, text, cuts), whole, "hostile input");
    }
  }
}

// Random texts built from the formats' own pieces (markers, JSON punctuation, call
// fields, whitespace, prose): one-shot parsing never fails, every call has a name and
// object arguments, and random splits stream to the same result.
TEST(ToolCallRobustnessTest, RandomPiecesAreSplitInvariant) {
  const std::vector<std::string> pieces = {"<tool_call>",
                                           "</tool_call>",
                                           "[TOOL_CALLS]",
                                           "[ARGS]",
                                           "[CALL_ID]",
                                           "<|python_tag|>",
                                           "{",
                                           "}",
                                           "[",
                                           "]",
                                           "\"name\": \"f\"",
                                           "\"arguments\": {\"a\": [1]}",
                                           "\"parameters\": {}",
                                           ",",
                                           ";",
                                           ":",
                                           " ",
                                           "\n",
                                           "x",
                                           "\"",
                                           "\\",
                                           "get",
                                           "<tool",
                                           "{\"name\": \"g\", \"arguments\": {}}"};
  std::mt19937 rng(12345);
  for (int round = 0; round < 600; ++round) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 24);
    for (int i = 0; i < n; ++i) text += pieces[rng() % pieces.size()];
    for (ToolCallFormat f :
         {ToolCallFormat::kHermes, ToolCallFormat::kLlama3, ToolCallFormat::kMistral}) {
      const ParsedToolCalls whole = parse(f, text);
      for (const ToolCall& call : whole.calls) {
        EXPECT_FALSE(call.name.empty());
        EXPECT_TRUE(json::parse(call.arguments).is_object()) << call.arguments;
      }
      std::vector<size_t> cuts;
      for (size_t at = 0; at < text.size();) {
        at += 1 + rng() % 6;
        if (at < text.size()) cuts.push_back(at);
      }
      expect_same(stream(f, text, cuts), whole,
                  std::string(tool_call_format_name(f)) + ": " + text);
    }
  }
}

}  // namespace
}  // namespace cellm::serve
