// Each front end (JSON Schema, json_object, regex, choice, GBNF) compiles and its
// grammar accepts exactly the strings it should; bad input gets an error naming
// the position or keyword.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "cellm/grammar.h"

namespace cellm {
namespace {

// A vocabulary of the 256 single bytes plus EOS (id 256).
TokenVocabulary byte_vocab() {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  bytes.emplace_back();
  return TokenVocabulary::build(std::move(bytes), {256}).value();
}

bool matches(const Grammar& g, std::string_view text) {
  GrammarMatcher m(g, byte_vocab());
  return m.accept_bytes(text) && m.can_end();
}

// A prefix of some sentence (accepted so far, may or may not end).
bool prefix(const Grammar& g, std::string_view text) {
  GrammarMatcher m(g, byte_vocab());
  return m.accept_bytes(text);
}

Grammar schema(const std::string& text) {
  auto g = compile_json_schema(text);
  EXPECT_TRUE(g.ok()) << g.status().to_string() << "\n" << text;
  return std::move(g).value();
}

std::string error_of(const Result<Grammar>& r) {
  EXPECT_FALSE(r.ok());
  return r.ok() ? std::string() : r.status().message();
}

TEST(JsonSchemaTest, ObjectWithRequiredAndOptionalPropertiesInOrder) {
  const Grammar g = schema(R"({"type":"object","properties":{
      "name":{"type":"string"},"age":{"type":"integer"},"ok":{"type":"boolean"}},
      "required":["name","ok"],"additionalProperties":false})");
  EXPECT_TRUE(matches(g, R"({"name":"x","age":3,"ok":true})"));
  EXPECT_TRUE(matches(g, R"({"name":"x","ok":false})"));
  EXPECT_TRUE(matches(g, "{ \"name\" : \"\\u00e9\\n\" ,\n  \"ok\":true }"));
  EXPECT_FALSE(matches(g, R"({"name":"x"})"));                      // ok is required
  EXPECT_FALSE(matches(g, R"({"ok":true,"name":"x"})"));            // schema order
  EXPECT_FALSE(matches(g, R"({"name":"x","age":3.5,"ok":true})"));  // integer
  EXPECT_FALSE(matches(g, R"({"name":"x","ok":true,"other":1})"));
  EXPECT_FALSE(matches(g, R"({"name":"x",,"ok":true})"));
}

TEST(JsonSchemaTest, WhitespaceIsBoundedPerGap) {
  const Grammar g = schema(R"({"type":"array","items":{"type":"integer"}})");
  const std::string spaces(kMaxJsonWhitespace, ' ');
  EXPECT_TRUE(matches(g, "[" + spaces + "1," + spaces + "2" + spaces + "]" + spaces));
  EXPECT_FALSE(prefix(g, "[" + spaces + " "));
  EXPECT_FALSE(prefix(g, "[1]" + spaces + " "));
  // Leading whitespace is not generated.
  EXPECT_FALSE(prefix(g, " "));
}

TEST(JsonSchemaTest, ArraysHonourMinAndMaxItems) {
  const Grammar g =
      schema(R"({"type":"array","items":{"enum":["a",1,null]},"minItems":1,"maxItems":3})");
  EXPECT_FALSE(matches(g, "[]"));
  EXPECT_TRUE(matches(g, R"(["a"])"));
  EXPECT_TRUE(matches(g, R"(["a",1,null])"));
  EXPECT_FALSE(matches(g, R"(["a",1,null,1])"));
  EXPECT_FALSE(matches(g, R"(["b"])"));
  const Grammar empty = schema(R"({"type":"array","maxItems":0})");
  EXPECT_TRUE(matches(empty, "[ ]"));
  EXPECT_FALSE(prefix(empty, "[1"));
}

TEST(JsonSchemaTest, EnumConstTypeListsAndStrings) {
  EXPECT_TRUE(matches(schema(R"({"const":{"a":[1,2.5,"x"]}})"), R"({"a":[1,2.5,"x"]})"));
  const Grammar types = schema(R"({"type":["string","null","number"]})");
  for (const char* ok : {R"("s")", "null", "-0.5e+10", "12", "0"}) {
    EXPECT_TRUE(matches(types, ok)) << ok;
  }
  for (const char* bad : {"01", "1.", ".5", "true", "+1", "1e", "\"\\x\"", "\"\\ud800\""}) {
    EXPECT_FALSE(matches(types, bad)) << bad;
  }
  const Grammar len = schema(R"({"type":"string","minLength":2,"maxLength":3})");
  EXPECT_FALSE(matches(len, R"("a")"));
  EXPECT_TRUE(matches(len, R"("a\n")"));
  EXPECT_TRUE(matches(len, "\"\xC3\xA9t\xC3\xA9\""));  // three code points
  EXPECT_FALSE(matches(len, R"("abcd")"));
  // Raw control characters and invalid UTF-8 are not string content.
  EXPECT_FALSE(prefix(schema(R"({"type":"string"})"), "\"\n"));
  EXPECT_FALSE(prefix(schema(R"({"type":"string"})"), "\"\xC0\x80"));
  EXPECT_FALSE(prefix(schema(R"({"type":"string"})"), "\"\xED\xA0\x80"));  // a surrogate
}

TEST(JsonSchemaTest, RecursiveRefsAnyOfAndDefs) {
  const Grammar g = schema(R"({
    "$defs": {"node": {"type":"object","properties":{
        "v":{"type":"integer"},
        "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},
      "required":["v"],"additionalProperties":false}},
    "anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]})");
  EXPECT_TRUE(matches(g, "null"));
  EXPECT_TRUE(matches(g, R"({"v":1,"kids":[{"v":2,"kids":[{"v":3}]},{"v":4}]})"));
  EXPECT_FALSE(matches(g, R"({"v":1,"kids":[{"kids":[]}]})"));
  const Grammar root_ref = schema(R"({"type":"object","properties":{"next":{"$ref":"#"}}})");
  EXPECT_TRUE(matches(root_ref, R"({"next":{"next":{}}})"));
}

TEST(JsonSchemaTest, OpenObjectsAndMaps) {
  const Grammar any = schema(R"({"type":"object"})");
  EXPECT_TRUE(matches(any, R"({"a":[1,{"b":null}],"c":"d"})"));
  EXPECT_FALSE(matches(any, "[1]"));
  const Grammar map = schema(R"({"type":"object","additionalProperties":{"type":"integer"}})");
  EXPECT_TRUE(matches(map, R"({"x":1,"y":2})"));
  EXPECT_FALSE(matches(map, R"({"x":"1"})"));
  EXPECT_TRUE(matches(schema("{}"), "[true, false, null]"));
}

TEST(JsonSchemaTest, ErrorsNameTheKeywordAndWhere) {
  EXPECT_NE(error_of(compile_json_schema(R"({"type":"string","pattern":"a+"})")).find("'pattern'"),
            std::string::npos);
  const std::string format = error_of(compile_json_schema(
      R"({"type":"object","properties":{"d":{"type":"string","format":"date"}}})"));
  EXPECT_NE(format.find("'format'"), std::string::npos) << format;
  EXPECT_NE(format.find("/properties/d"), std::string::npos) << format;
  EXPECT_NE(
      error_of(compile_json_schema(R"({"$ref":"#/$defs/missing"})")).find("points to nothing"),
      std::string::npos);
  EXPECT_NE(error_of(compile_json_schema(R"({"type":"strng"})")).find("unknown type 'strng'"),
            std::string::npos);
  EXPECT_NE(error_of(compile_json_schema("{\"type\":")).find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of(compile_json_schema(R"({"enum":[]})")).find("/enum"), std::string::npos);
  EXPECT_NE(error_of(compile_json_schema(R"({"$ref":"#"})")).find("can never finish"),
            std::string::npos);
  EXPECT_NE(error_of(compile_json_schema(R"({"type":"object","properties":{},"required":["a"]})"))
                .find("'a'"),
            std::string::npos);
  EXPECT_FALSE(compile_json_schema("false").ok());
  EXPECT_FALSE(compile_json_schema("[]").ok());
  // Deep nesting is refused before anything recurses.
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += "{\"items\":";
  deep += "{}";
  for (int i = 0; i < 100000; ++i) deep += "}";
  EXPECT_EQ(compile_json_schema(deep).status().code(), StatusCode::kOutOfResources);
  std::string nested = "{}";
  for (int i = 0; i < 70; ++i) nested = "{\"items\":" + nested + "}";
  EXPECT_EQ(compile_json_schema(nested).status().code(), StatusCode::kOutOfResources);
}

TEST(JsonObjectTest, AnyValueWithAnObjectAtTheTop) {
  const Grammar g = compile_json_object().value();
  EXPECT_TRUE(matches(g, R"({"a":{"b":[1,-2.5e3,"x",true,false,null,[],{}]}})"));
  EXPECT_TRUE(matches(g, "{}"));
  EXPECT_FALSE(matches(g, "[]"));
  EXPECT_FALSE(matches(g, R"("x")"));
  EXPECT_FALSE(matches(g, R"({"a":})"));
  EXPECT_FALSE(matches(g, R"({"a":1,})"));
  std::string deep = "{\"a\":";
  for (int i = 0; i < 200; ++i) deep += "[";
  for (int i = 0; i < 200; ++i) deep += "]";
  EXPECT_TRUE(matches(g, deep + "}"));
}

TEST(RegexTest, TheCommonSubset) {
  const Grammar g = compile_regex(R"(^(\d{3}-\d{4}|[A-Z][a-z]+)\s?x*$)").value();
  EXPECT_TRUE(matches(g, "555-1234"));
  EXPECT_TRUE(matches(g, "Hello xxx"));
  EXPECT_TRUE(matches(g, "Hi"));
  EXPECT_FALSE(matches(g, "55-1234"));
  EXPECT_FALSE(matches(g, "hello"));
  const Grammar dot = compile_regex("a.c|[^a-c]+|(?:\\w\\W){2,}").value();
  EXPECT_TRUE(matches(dot,
                      "a\xE2\x82\xAC"
                      "c"));  // '.' is one code point
  EXPECT_FALSE(matches(dot, "a\nc"));
  EXPECT_TRUE(matches(dot, "xyz\xC3\xA9"));
  EXPECT_FALSE(matches(dot, "xyzb"));
  EXPECT_TRUE(matches(dot, "a!b?"));
  EXPECT_FALSE(matches(dot, "a!"));
  const Grammar esc = compile_regex(R"(\x41\u00e9\.\{[\]\-a]{1,2}\\)").value();
  EXPECT_TRUE(matches(esc, "A\xC3\xA9.{]-\\"));
  EXPECT_TRUE(matches(esc, "A\xC3\xA9.{a\\"));
  EXPECT_FALSE(matches(esc, "A\xC3\xA9x{a\\"));
  EXPECT_TRUE(matches(compile_regex("a{2}b{,1}c{1,}").value(), "aacc"));
  EXPECT_TRUE(matches(compile_regex("x{a}").value(), "x{a}"));   // not a quantifier
  EXPECT_TRUE(matches(compile_regex("(a|)*b").value(), "aab"));  // a nullable loop body
  EXPECT_TRUE(matches(compile_regex("").value(), ""));
}

TEST(RegexTest, ErrorsNameTheOffset) {
  const std::string open = error_of(compile_regex("ab(cd"));
  EXPECT_NE(open.find("not closed"), std::string::npos) << open;
  EXPECT_NE(error_of(compile_regex("a)")).find("offset 1"), std::string::npos);
  EXPECT_NE(error_of(compile_regex("*a")).find("quantifier follows nothing"), std::string::npos);
  EXPECT_EQ(compile_regex("a\\bc").status().code(), StatusCode::kNotSupported);
  EXPECT_EQ(compile_regex("(?=a)").status().code(), StatusCode::kNotSupported);
  EXPECT_EQ(compile_regex("a^b").status().code(), StatusCode::kNotSupported);
  EXPECT_EQ(compile_regex("(a)\\1").status().code(), StatusCode::kNotSupported);
  EXPECT_FALSE(compile_regex("[z-a]").ok());
  EXPECT_FALSE(compile_regex("[abc").ok());
  EXPECT_FALSE(compile_regex("a{3,1}").ok());
  EXPECT_EQ(compile_regex("a{100000}").status().code(), StatusCode::kOutOfResources);
  EXPECT_EQ(compile_regex(std::string(100, '(') + std::string(100, ')')).status().code(),
            StatusCode::kOutOfResources);
  // A group repeats as one symbol; size grows only with the repeated counts.
  EXPECT_TRUE(compile_regex("(a{1000}){1000}").ok());
  std::string big;
  for (int i = 0; i < 30; ++i) big += "a{10000}";
  EXPECT_EQ(compile_regex(big).status().code(), StatusCode::kOutOfResources);
}

TEST(ChoiceTest, ExactlyOneOfTheStrings) {
  const std::vector<std::string> choices{"yes", "no", "not sure", ""};
  const Grammar g = compile_choice(choices).value();
  for (const auto& c : choices) EXPECT_TRUE(matches(g, c)) << c;
  EXPECT_FALSE(matches(g, "ye"));
  EXPECT_FALSE(matches(g, "yess"));
  EXPECT_FALSE(compile_choice(std::vector<std::string>{}).ok());
}

TEST(ChoiceTest, WordsThatArePrefixesOfEachOtherAndDuplicates) {
  const std::vector<std::string> choices{"ab", "a", "abc", "b", "abd", "ab", "ba"};
  const Grammar g = compile_choice(choices).value();
  for (const auto& c : choices) EXPECT_TRUE(matches(g, c)) << c;
  for (const char* no : {"", "abcd", "bb", "ad", "c", "abdc"}) EXPECT_FALSE(matches(g, no)) << no;
  // A chain of nested words: a trie as deep as the list is long.
  std::vector<std::string> chain;
  for (int i = 1; i <= 1000; ++i) chain.emplace_back(static_cast<size_t>(i), 'a');
  const Grammar deep = compile_choice(chain).value();
  EXPECT_TRUE(matches(deep, std::string(1000, 'a')));
  EXPECT_TRUE(matches(deep, "a"));
  EXPECT_FALSE(matches(deep, std::string(1001, 'a')));
}

TEST(ChoiceTest, ManyWordsWithACommonPrefixStayCheapToMatch) {
  // Matched as a trie, thousands of words hold one parse stack: a step budget
  // far below one visit per word per byte is enough.
  std::vector<std::string> words;
  for (int i = 0; i < 5000; ++i) words.push_back("\"value_" + std::to_string(i) + "\"");
  GrammarLimits limits;
  limits.max_step_work = 2000;
  const Grammar g = compile_choice(words, limits).value();
  std::vector<std::string> tokens = {""};
  for (int b = 0; b < 128; ++b) tokens.emplace_back(1, static_cast<char>(b));
  const TokenVocabulary vocab = TokenVocabulary::build(std::move(tokens), {0}).value();
  GrammarMatcher m(g, vocab, limits);
  for (char c : std::string("\"value_4321\"")) {
    m.next_token_mask();
    ASSERT_TRUE(m.accept_bytes(std::string(1, c))) << m.status().to_string();
  }
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.status().ok());
  // The same words as a JSON Schema enum.
  nlohmann::json schema = {{"enum", nlohmann::json::array()}};
  for (int i = 0; i < 5000; ++i) schema["enum"].push_back("value_" + std::to_string(i));
  GrammarMatcher e(compile_json_schema(schema.dump(), limits).value(), vocab, limits);
  EXPECT_TRUE(e.accept_bytes("\"value_4999\""));
  EXPECT_TRUE(e.can_end());
  EXPECT_TRUE(e.status().ok());
}

TEST(GbnfTest, RulesLiteralsClassesAndRepetition) {
  const Grammar g = compile_gbnf(R"g(
    # arithmetic, right-recursive
    root ::= expr ("\n" expr)*
    expr ::= term ([+-] expr)?
    term ::= num | "(" expr ")" | var
    num  ::= [0-9]{1,3} ("." [0-9]+)?
    var  ::= [a-zA-Z_\u00e9] [a-z0-9]* "'"?
  )g")
                        .value();
  EXPECT_TRUE(matches(g, "1+2-(3.25+x1')\n\xC3\xA9+7"));
  EXPECT_FALSE(matches(g, "1234"));
  EXPECT_FALSE(matches(g, "1+"));
  EXPECT_FALSE(matches(g, "(1"));
  const Grammar any = compile_gbnf("root ::= [^\"\\\\]* . \"\\x41\"").value();
  EXPECT_TRUE(matches(any,
                      "ab\xE2\x82\xAC"
                      "A"));
  EXPECT_FALSE(matches(any, "a\"bA"));
}

TEST(GbnfTest, ErrorsNameLineAndRule) {
  const std::string undefined = error_of(compile_gbnf("root ::= a b\na ::= \"x\""));
  EXPECT_NE(undefined.find("rule 'b' is not defined"), std::string::npos) << undefined;
  EXPECT_NE(undefined.find("line 1"), std::string::npos) << undefined;
  EXPECT_NE(error_of(compile_gbnf("root ::= \"x\"\nroot ::= \"y\"")).find("defined twice"),
            std::string::npos);
  EXPECT_NE(error_of(compile_gbnf("a ::= \"x\"")).find("no 'root'"), std::string::npos);
  const std::string left = error_of(compile_gbnf("root ::= root \"+\" \"1\" | \"1\""));
  EXPECT_NE(left.find("left-recursive"), std::string::npos) << left;
  EXPECT_NE(error_of(compile_gbnf("root ::= \"x\" root")).find("never finish"), std::string::npos);
  EXPECT_NE(error_of(compile_gbnf("root ::= \"abc")).find("not closed"), std::string::npos);
  EXPECT_NE(error_of(compile_gbnf("root ::= [abc")).find("not closed"), std::string::npos);
  EXPECT_NE(error_of(compile_gbnf("root ::= \"a\" @")).find("line 1, column 14"),
            std::string::npos);
  EXPECT_FALSE(compile_gbnf("root ::= \"\\q\"").ok());
  EXPECT_FALSE(compile_gbnf("root \"x\"").ok());
  EXPECT_EQ(compile_gbnf("root ::= " + std::string(200, '(') + "\"x\"" + std::string(200, ')'))
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

TEST(GrammarTest, ToGbnfWritesEveryRule) {
  const Grammar g = compile_choice(std::vector<std::string>{"ab"}).value();
  EXPECT_EQ(g.to_gbnf(), "root ::= [a] [b]\n");
}

}  // namespace
}  // namespace cellm
