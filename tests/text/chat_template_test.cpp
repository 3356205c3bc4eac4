// Tests of cellm::ChatTemplate against jinja2 renderings made the way transformers
// renders chat templates (tools/make_chat_template_fixtures.py): the real model
// templates and a synthetic set with one template per construct, compared
// byte for byte; plus parse errors, limits and hostile templates.
#include "cellm/chat_template.h"

#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "support/temp_dir.h"

namespace cellm {
namespace {

using nlohmann::json;
using testing::TempDir;
using testing::write_file;

const std::filesystem::path kFixtures =
    std::filesystem::path(CELLM_SOURCE_DIR) / "tests/fixtures/chat_templates";
const std::filesystem::path kShared = CELLM_SHARED_DIR;

json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing fixture " << path;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return json::parse(buffer.str());
}

// The fixture's fixed time [y, m, d, H, M, S] with weekday and day of year filled in.
std::tm fixed_now(const json& now) {
  std::tm tm{};
  tm.tm_year = now[0].get<int>() - 1900;
  tm.tm_mon = now[1].get<int>() - 1;
  tm.tm_mday = now[2].get<int>();
  tm.tm_hour = now[3].get<int>();
  tm.tm_min = now[4].get<int>();
  tm.tm_sec = now[5].get<int>();
  const std::time_t t = timegm(&tm);
  gmtime_r(&t, &tm);
  return tm;
}

std::vector<ChatMessage> messages_of(const json& c) {
  std::vector<ChatMessage> out;
  for (const json& m : c.at("messages")) {
    out.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
  }
  return out;
}

// Renders every case of `cases` and compares with jinja2; returns the number checked.
int check_cases(const ChatTemplate& t, const json& cases, const std::string& label) {
  int checked = 0;
  for (const json& c : cases) {
    const std::string where = label + " / " + c.at("conversation").get<std::string>() +
                              " / add_generation_prompt=" +
                              (c.at("add_generation_prompt").get<bool>() ? "true" : "false");
    const Result<std::string> r =
        t.render(messages_of(c), c.at("add_generation_prompt").get<bool>());
    if (c.contains("expected")) {
      EXPECT_TRUE(r.ok()) << where << ": " << r.status().to_string();
      if (r.ok()) {
        EXPECT_EQ(*r, c.at("expected").get<std::string>()) << where;
      }
    } else {
      EXPECT_FALSE(r.ok()) << where << ": jinja2 failed with " << c.at("error") << " but got "
                           << (r.ok() ? *r : "");
      if (!r.ok()) {
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << where;
        if (c.value("raised", false)) {
          EXPECT_NE(r.status().message().find(c.at("error").get<std::string>()), std::string::npos)
              << where << ": " << r.status().message();
        }
      }
    }
    ++checked;
  }
  return checked;
}

TEST(ChatTemplateFixtureTest, SyntheticTemplatesRenderExactlyAsJinja2) {
  const json fixture = read_json(kFixtures / "synthetic.json");
  const std::tm now = fixed_now(fixture.at("now"));
  int checked = 0;
  for (const json& entry : fixture.at("templates")) {
    const std::string name = entry.at("name").get<std::string>();
    Result<ChatTemplate> t = ChatTemplate::parse(entry.at("template").get<std::string>(),
                                                 fixture.at("bos_token").get<std::string>(),
                                                 fixture.at("eos_token").get<std::string>(), now);
    ASSERT_TRUE(t.ok()) << name << ": " << t.status().to_string();
    checked += check_cases(*t, entry.at("cases"), name);
  }
  EXPECT_GE(checked, 150);
}

class RealTemplateTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RealTemplateTest, RendersEveryConversationExactlyAsJinja2) {
  const json fixture = read_json(kFixtures / (GetParam() + ".json"));
  Result<ChatTemplate> t = ChatTemplate::parse(
      fixture.at("template").get<std::string>(), fixture.at("bos_token").get<std::string>(),
      fixture.at("eos_token").get<std::string>(), fixed_now(fixture.at("now")));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(check_cases(*t, fixture.at("cases"), GetParam()), 32);
}

TEST_P(RealTemplateTest, LoadFromTheModelFolderMatchesTheFixture) {
  const std::filesystem::path dir = kShared / "tokenizers" / GetParam();
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " is absent";
  const json fixture = read_json(kFixtures / (GetParam() + ".json"));
  Result<ChatTemplate> t = ChatTemplate::load(dir.string());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  // Cases that do not call strftime_now render the same whatever the time.
  for (const json& c : fixture.at("cases")) {
    if (!c.contains("expected")) continue;
    const Result<std::string> r =
        t->render(messages_of(c), c.at("add_generation_prompt").get<bool>());
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(*r, c.at("expected").get<std::string>()) << c.at("conversation");
  }
}

INSTANTIATE_TEST_SUITE_P(Models, RealTemplateTest, ::testing::Values("llama3", "qwen3"));

TEST(ChatTemplateLoadTest, ModelsWithoutATemplateAreNotFound) {
  const std::filesystem::path llama2 = kShared / "tokenizers/llama2";
  if (std::filesystem::exists(llama2)) {
    EXPECT_EQ(ChatTemplate::load(llama2.string()).status().code(), StatusCode::kNotFound);
  }
  const std::filesystem::path kjv = std::filesystem::path(CELLM_SOURCE_DIR) / "models/kjv-small";
  EXPECT_EQ(ChatTemplate::load(kjv.string()).status().code(), StatusCode::kNotFound);
  TempDir empty;
  EXPECT_EQ(ChatTemplate::load(empty.path().string()).status().code(), StatusCode::kNotFound);
}

TEST(ChatTemplateLoadTest, ReadsTokenStringsPlainOrAsContentObjects) {
  TempDir dir;
  write_file(dir / "tokenizer_config.json",
             R"({"bos_token": {"content": "<B>", "lstrip": false}, "eos_token": "<E>",
                 "chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"})");
  Result<ChatTemplate> t = ChatTemplate::load(dir.path().string());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(*t->render({{"user", "x"}}, false), "<B>x<E>");
}

TEST(ChatTemplateLoadTest, ATemplateListUsesTheOneNamedDefault) {
  TempDir dir;
  write_file(dir / "tokenizer_config.json",
             R"({"chat_template": [{"name": "tool_use", "template": "tools"},
                                   {"name": "default", "template": "default {{ messages|length }}"}]})");
  Result<ChatTemplate> t = ChatTemplate::load(dir.path().string());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(*t->render({{"user", "x"}}, false), "default 1");

  write_file(dir / "tokenizer_config.json",
             R"({"chat_template": [{"name": "tool_use", "template": "tools"}]})");
  EXPECT_EQ(ChatTemplate::load(dir.path().string()).status().code(), StatusCode::kNotFound);
}

TEST(ChatTemplateLoadTest, ChatTemplateJinjaBesideTheConfigWins) {
  TempDir dir;
  write_file(dir / "tokenizer_config.json", R"({"eos_token": "</s>", "chat_template": "old"})");
  write_file(dir / "chat_template.jinja",
             "{% for m in messages %}{{ m.role }}{% endfor %}{{ eos_token }}\n");
  Result<ChatTemplate> t = ChatTemplate::load(dir.path().string());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(*t->render({{"user", "x"}, {"assistant", "y"}}, false), "userassistant</s>");
}

TEST(ChatTemplateLoadTest, ParseErrorsNameTheFileLineAndColumn) {
  TempDir dir;
  write_file(
      dir / "tokenizer_config.json",
      R"({"chat_template": "line one\n{% if x %}\n  {{ x | no_such_filter }}\n{% endif %}"})");
  const Result<ChatTemplate> t = ChatTemplate::load(dir.path().string());
  ASSERT_EQ(t.status().code(), StatusCode::kInvalidProgram);
  const std::string& m = t.status().message();
  EXPECT_NE(m.find("tokenizer_config.json"), std::string::npos) << m;
  EXPECT_NE(m.find("line 3, column 10"), std::string::npos) << m;
  EXPECT_NE(m.find("no_such_filter"), std::string::npos) << m;

  write_file(dir / "tokenizer_config.json", "{not json");
  EXPECT_EQ(ChatTemplate::load(dir.path().string()).status().code(), StatusCode::kInvalidProgram);
}

// --- parse errors -----------------------------------------------------------

struct MalformedCase {
  const char* source;
  const char* position;  // "line L, column C"
  const char* words;     // in the message
};

TEST(ChatTemplateParseTest, MalformedTemplatesFailNamingTheLineAndColumn) {
  const MalformedCase cases[] = {
      {"abc {{ x ", "line 1, column 5", "missing '}}'"},
      {"a\n{% if x %}b", "line 2, column 12", "expected 'elif', 'else', 'endif'"},
      {"{% for x in y %}{% endif %}", "line 1, column 20", "endif"},
      {"\n\n  {{ x|nope }}", "line 3, column 8", "no filter named 'nope'"},
      {"{{ x is frobnicated }}", "line 1, column 9", "no test named 'frobnicated'"},
      {"{# never closed", "line 1, column 1", "comment"},
      {"{{ 'unterminated }}", "line 1, column 4", "unterminated string"},
      {"{% frobnicate %}", "line 1, column 4", "unknown tag 'frobnicate'"},
      {"{% include 'x' %}", "line 1, column 4", "not supported"},
      {"{{ (1 + 2 }}", "line 1, column 11", "expected ')'"},
      {"{{ a b }}", "line 1, column 6", "end of print statement"},
      {"{% break %}", "line 1, column 4", "outside of a loop"},
      {"{{ 1 ]}}", "line 1, column 6", "unexpected ']'"},
      {"{% set %}", "line 1, column 8", "expected a name"},
      {"{{ 99999999999999999999 }}", "line 1, column 4", "out of range"},
      {"{{ x @ y }}", "line 1, column 6", "unexpected character '@'"},
  };
  for (const MalformedCase& c : cases) {
    const Result<ChatTemplate> t = ChatTemplate::parse(c.source, "", "");
    ASSERT_FALSE(t.ok()) << c.source;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidProgram) << c.source;
    const std::string& m = t.status().message();
    EXPECT_NE(m.find(c.position), std::string::npos) << c.source << " -> " << m;
    EXPECT_NE(m.find(c.words), std::string::npos) << c.source << " -> " << m;
  }
}

// --- render errors ------------------------------------------------------------

std::string render_error(const std::string& source) {
  Result<ChatTemplate> t = ChatTemplate::parse(source, "<s>", "</s>");
  EXPECT_TRUE(t.ok()) << source << ": " << t.status().to_string();
  if (!t.ok()) return "";
  const Result<std::string> r = t->render({{"user", "hi"}}, true);
  EXPECT_FALSE(r.ok()) << source << " rendered " << (r.ok() ? *r : "");
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << source;
  return r.status().message();
}

TEST(ChatTemplateRenderTest, RaiseExceptionSurfacesTheTemplatesMessage) {
  const std::string m = render_error(
      "{% if messages[0].role != 'system' %}{{ raise_exception('Need a system message, got ' + "
      "messages[0].role) }}{% endif %}");
  EXPECT_NE(m.find("Need a system message, got user"), std::string::npos) << m;
}

TEST(ChatTemplateRenderTest, RuntimeErrorsNameTheProblemAndPosition) {
  EXPECT_NE(render_error("\n  {{ undefined_function() }}").find("line 2, column 6"),
            std::string::npos);
  EXPECT_NE(render_error("{{ undefined_function() }}").find("'undefined_function' is undefined"),
            std::string::npos);
  EXPECT_NE(render_error("{{ 'a' + 1 }}").find("can only concatenate str"), std::string::npos);
  EXPECT_NE(render_error("{{ messages[0].content.nope() }}").find("has no attribute 'nope'"),
            std::string::npos);
  EXPECT_NE(render_error("{{ 1 // 0 }}").find("by zero"), std::string::npos);
  EXPECT_NE(render_error("{{ 9223372036854775807 + 1 }}").find("overflow"), std::string::npos);
  EXPECT_NE(render_error("{{ 'x'.upper(1) }}").find("upper() takes at most 0"), std::string::npos);
  EXPECT_NE(render_error("{{ 'a,b'.split(sep=',', bogus=1) }}").find("bogus"), std::string::npos);
}

// Arguments of the wrong type are the template's TypeError, never a crash (a
// fuzz finding: round() with a name for its precision threw out of the render).
TEST(ChatTemplateRenderTest, ArgumentsOfTheWrongTypeAreTypeErrors) {
  EXPECT_NE(render_error("{{ 3.14|round(none) }}").find("precision must be an int, not NoneType"),
            std::string::npos);
  EXPECT_NE(render_error("{{ 3.14|round('2') }}").find("precision must be an int, not str"),
            std::string::npos);
  EXPECT_NE(render_error("{{ 'aa'|replace('a', 'b', 1.5) }}").find("count must be an int"),
            std::string::npos);
}

TEST(ChatTemplateRenderTest, StrftimeNowFormatsTheInjectedTime) {
  std::tm now{};
  now.tm_year = 2025 - 1900;
  now.tm_mon = 0;
  now.tm_mday = 2;
  Result<ChatTemplate> t = ChatTemplate::parse("{{ strftime_now('%d %b %Y') }}", "", "", now);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t->render({}, false), "02 Jan 2025");
  Result<ChatTemplate> live = ChatTemplate::parse("{{ strftime_now('%Y') }}", "", "");
  ASSERT_TRUE(live.ok());
  const std::time_t seconds = std::time(nullptr);
  std::tm local{};
  localtime_r(&seconds, &local);
  EXPECT_EQ(*live->render({}, false), std::to_string(local.tm_year + 1900));
}

TEST(ChatTemplateRenderTest, ACopiedTemplateRendersIndependentlyAndRepeatably) {
  Result<ChatTemplate> t = ChatTemplate::parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}"
      "{{ ns.n }}",
      "", "");
  ASSERT_TRUE(t.ok());
  const ChatTemplate copy = *t;
  EXPECT_EQ(*t->render({{"user", "a"}, {"user", "b"}}, false), "2");
  EXPECT_EQ(*copy.render({{"user", "a"}}, false), "1");
  EXPECT_EQ(*t->render({{"user", "a"}, {"user", "b"}}, false), "2");
}

// --- hostile templates ----------------------------------------------------------

TEST(ChatTemplateLimitsTest, HugeLoopsStopAtTheIterationLimit) {
  EXPECT_NE(render_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                         "{% endfor %}")
                .find("loop iterations"),
            std::string::npos);
  EXPECT_NE(render_error("{{ range(10000000)|length }}").find("Range too big"), std::string::npos);
}

TEST(ChatTemplateLimitsTest, RunawayOutputAndStringsStopAtTheirLimits) {
  EXPECT_NE(render_error("{% for i in range(90000) %}{{ 'xxxxxxxxxxxxxxxxxxxx' }}{% endfor %}")
                .find("output exceeds"),
            std::string::npos);
  EXPECT_NE(render_error("{{ 'x' * 100000000 }}").find("longer than"), std::string::npos);
  EXPECT_NE(render_error("{% set ns = namespace(s='ab') %}{% for i in range(40) %}"
                         "{% set ns.s = ns.s + ns.s %}{% endfor %}")
                .find("longer than"),
            std::string::npos);
  EXPECT_NE(render_error("{{ [1] * 100000000 }}").find("longer than"), std::string::npos);
  // Quadratic building under the size caps runs into the work budget.
  EXPECT_NE(render_error("{% set ns = namespace(s='') %}{% for i in range(99000) %}"
                         "{% set ns.s = ns.s ~ 'xxxxxxxxxx' %}{% endfor %}")
                .find("work budget"),
            std::string::npos);
}

// Found while writing the chat_template fuzz target: copying a list of 1M
// items 1000 times stayed inside the work budget (one unit per item) but ran
// for minutes under ASan; items now weigh 64 bytes of work each.
TEST(ChatTemplateLimitsTest, CopyingLongListsOverAndOverRunsIntoTheWorkBudget) {
  EXPECT_NE(render_error("{% set l = ('a' * 1000000) | list %}{% for i in range(1000) %}"
                         "{% set m = l | list %}{% endfor %}")
                .find("work budget"),
            std::string::npos);
}

// Reading builds nothing the work budget counts: 100k scans of a 1M-item list,
// or `unique` over 100k distinct items (every pair compared), stop at the render's
// time bound (10 s) instead of running for hours.
TEST(ChatTemplateLimitsTest, ScansAndQuadraticFiltersStopAtTheTimeBudget) {
  EXPECT_NE(render_error("{% set l = ('a' * 1000000) | list %}{% for i in range(100000) %}"
                         "{% if 'b' in l %}{% endif %}{% endfor %}")
                .find("time budget"),
            std::string::npos);
  EXPECT_NE(render_error("{{ range(100000) | unique | length }}").find("time budget"),
            std::string::npos);
}

TEST(ChatTemplateLimitsTest, RecursionAndNestingAreBounded) {
  EXPECT_NE(render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}")
                .find("macro calls nested deeper than 100"),
            std::string::npos);
  EXPECT_NE(render_error("{% set ns = namespace(l=[]) %}{% for i in range(1000) %}"
                         "{% set ns.l = [ns.l] %}{% endfor %}")
                .find("nested deeper"),
            std::string::npos);

  std::string deep_blocks;
  for (int i = 0; i < 5000; ++i) deep_blocks += "{% if true %}";
  const Result<ChatTemplate> blocks = ChatTemplate::parse(deep_blocks, "", "");
  ASSERT_FALSE(blocks.ok());
  EXPECT_NE(blocks.status().message().find("nested deeper"), std::string::npos);

  const std::pair<const char*, const char*> brackets[] = {
      {"(", ")"}, {"[", "]"}, {"not ", ""}, {"-", ""}, {"{'a': ", "}"}};
  for (const auto& [open, close] : brackets) {
    std::string deep = "{{ ";
    for (int i = 0; i < 100000; ++i) deep += open;
    deep += "1";
    for (int i = 0; i < 100000; ++i) deep += close;
    deep += " }}";
    const Result<ChatTemplate> t = ChatTemplate::parse(deep, "", "");
    ASSERT_FALSE(t.ok()) << open;
    EXPECT_NE(t.status().message().find("nested deeper"), std::string::npos) << open;
  }
  std::string long_chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) long_chain += " + 1";
  long_chain += " }}";
  EXPECT_FALSE(ChatTemplate::parse(long_chain, "", "").ok());
}

TEST(ChatTemplateLimitsTest, SelfReferenceAndOddInputsDoNotCrash) {
  Result<ChatTemplate> cycle = ChatTemplate::parse(
      "{% set ns = namespace() %}{% set ns.me = ns %}{% set ns.l = [ns, ns] %}{{ ns.me.me.l|length "
      "}}",
      "", "");
  ASSERT_TRUE(cycle.ok());
  EXPECT_EQ(*cycle->render({}, false), "2");
  EXPECT_FALSE(ChatTemplate::parse("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", "", "")
                   ->render({}, false)
                   .ok());

  const std::string odd_inputs[] = {"",
                                    "{",
                                    "}",
                                    "{{",
                                    "}}",
                                    "{%",
                                    "%}",
                                    "{#",
                                    "#}",
                                    "{{}}",
                                    "{%%}",
                                    "{{ }}",
                                    "{% %}",
                                    "{{ [ }}",
                                    "{{ ' }}",
                                    "\xff\xfe{{ x }}",
                                    std::string("a\0b", 3),
                                    "{{ '\\u12' }}",
                                    "{{ x[::0] }}"};
  for (const std::string& source : odd_inputs) {
    const Result<ChatTemplate> t = ChatTemplate::parse(source, "", "");
    if (t.ok()) (void)t->render({{"user", "\xc3"}}, true);
  }
  Result<ChatTemplate> slice = ChatTemplate::parse("{{ [1][::0] }}", "", "");
  ASSERT_TRUE(slice.ok());
  EXPECT_FALSE(slice->render({}, false).ok());
}

}  // namespace
}  // namespace cellm
