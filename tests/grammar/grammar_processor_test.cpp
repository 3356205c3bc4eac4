// GrammarLogitsProcessor: sampling from random rows under its masks (through
// apply_logit_adjustments and the real sampler) always yields output the
// grammar accepts, checked independently (a hand-written matcher of the
// regular expression, a JSON parser and the
// schema's rules); when the matcher fails only EOS is allowed; a token outside
// the mask is a caller bug that stops the process.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cellm/grammar.h"
#include "cellm/logits_processor.h"
#include "cellm/sampler.h"

namespace cellm {
namespace {

constexpr Token kEos = 0;

bool allowed(const std::vector<uint64_t>& mask, Token id) {
  return !mask.empty() && ((mask[static_cast<size_t>(id) / 64] >> (id % 64)) & 1u) != 0;
}

// EOS (0), a special token (1, empty: never allowed), multi-byte pieces that
// cross grammar boundaries, and every printable ASCII byte.
TokenVocabulary hand_vocab() {
  std::vector<std::string> bytes = {"",    "",      "{",    "}",    "\"",  "\":",      "\",",
                                    ",\"", "name",  "na",   "me\"", "tag", "\"tag\":", "yes",
                                    "no",  "\"yes", "12",   "-3",   "ab",  "abc",      "\n",
                                    "  ",  "\xC3",  "\xA9", "x?",   "c0",  "\"n\":"};
  for (int b = 32; b < 127; ++b) bytes.emplace_back(1, static_cast<char>(b));
  return TokenVocabulary::build(std::move(bytes), {kEos}).value();
}

// The first id whose bytes are `bytes`.
Token id_of(const TokenVocabulary& vocab, const std::string& bytes) {
  for (Token t = 2; t < static_cast<Token>(vocab.size()); ++t) {
    if (vocab.bytes(t) == bytes) return t;
  }
  ADD_FAILURE() << "no token '" << bytes << "'";
  return kEos;
}

struct Walk {
  std::string text;
  bool ended = false;  // EOS was sampled
};

// Samples up to `max_steps` tokens at temperature 1 from random rows adjusted by
// the processor, as an executor does: prepare, apply, sample, accept.
Walk sample_walk(GrammarLogitsProcessor& processor, const TokenVocabulary& vocab,
                 std::mt19937_64& rng, int max_steps) {
  Walk walk;
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  SamplingParams params;
  params.temperature = 1.0f;
  LogitAdjustments adj;
  std::vector<float> row(vocab.size());
  std::vector<float> scratch;
  for (int step = 0; step < max_steps; ++step) {
    processor.prepare(adj);
    EXPECT_TRUE(adj.edits.empty());
    EXPECT_EQ(adj.allowed.size(), vocab.mask_words());
    for (float& x : row) x = normal(rng);
    row[kEos] += 2.0f;  // walks end in reasonable time
    apply_logit_adjustments(row, adj);
    float u = uniform(rng);
    if (u >= 1.0f) u = 0.0f;
    const Token t = sample_token(row, params, u, scratch);
    EXPECT_TRUE(allowed(adj.allowed, t)) << "sampled token " << t << " outside the mask";
    processor.accept(t);
    if (t == kEos) {
      walk.ended = true;
      break;
    }
    walk.text += vocab.bytes(t);
  }
  return walk;
}

// (ab|c)[0-9]{1,3}(x\?|yes|no)? written out by hand (std::regex trips GCC's
// -Wmaybe-uninitialized under the sanitizers).
bool matches_pattern(const std::string& s) {
  size_t i = 0;
  if (s.compare(0, 2, "ab") == 0) {
    i = 2;
  } else if (s.compare(0, 1, "c") == 0) {
    i = 1;
  } else {
    return false;
  }
  size_t digits = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i, ++digits;
  if (digits < 1 || digits > 3) return false;
  const std::string rest = s.substr(i);
  return rest.empty() || rest == "x?" || rest == "yes" || rest == "no";
}

TEST(GrammarLogitsProcessorTest, SampledRegexOutputsMatch) {
  const TokenVocabulary vocab = hand_vocab();
  const std::string pattern = "(ab|c)[0-9]{1,3}(x\\?|yes|no)?";
  const Grammar g = compile_regex(pattern).value();
  std::mt19937_64 rng(17);
  int ended = 0;
  std::set<std::string> distinct;
  for (int i = 0; i < 300; ++i) {
    GrammarLogitsProcessor processor(GrammarMatcher(g, vocab));
    const Walk w = sample_walk(processor, vocab, rng, 50);
    ASSERT_TRUE(w.ended) << "'" << w.text << "'";  // at most 8 bytes: it must end
    EXPECT_FALSE(processor.failed());
    EXPECT_TRUE(processor.matcher().ended());
    EXPECT_TRUE(matches_pattern(w.text)) << "'" << w.text << "'";
    ended += w.ended ? 1 : 0;
    distinct.insert(w.text);
  }
  EXPECT_EQ(ended, 300);
  EXPECT_GT(distinct.size(), 20u) << "the walks explore the grammar";
}

// The schema's rules, checked on a parsed value.
void expect_valid(const nlohmann::json& v, const std::string& text) {
  ASSERT_TRUE(v.is_object()) << text;
  for (const auto& [key, value] : v.items()) {
    EXPECT_TRUE(key == "name" || key == "n" || key == "tag") << "extra key in " << text;
  }
  ASSERT_TRUE(v.contains("name")) << text;
  ASSERT_TRUE(v.contains("tag")) << text;
  EXPECT_TRUE(v["name"].is_string()) << text;
  EXPECT_TRUE(v["tag"] == "yes" || v["tag"] == "no") << text;
  if (v.contains("n")) {
    EXPECT_TRUE(v["n"].is_number_integer()) << text;
  }
}

TEST(GrammarLogitsProcessorTest, SampledJsonSchemaOutputsValidate) {
  const TokenVocabulary vocab = hand_vocab();
  const Grammar g = compile_json_schema(R"({"type":"object",
      "properties":{"name":{"type":"string","maxLength":6},"n":{"type":"integer"},
                    "tag":{"enum":["yes","no"]}},
      "required":["name","tag"],"additionalProperties":false})")
                        .value();
  std::mt19937_64 rng(23);
  int ended = 0;
  constexpr int kWalks = 200;
  for (int i = 0; i < kWalks; ++i) {
    GrammarLogitsProcessor processor(GrammarMatcher(g, vocab));
    const Walk w = sample_walk(processor, vocab, rng, 400);
    EXPECT_FALSE(processor.failed());
    if (!w.ended) continue;
    ++ended;
    const nlohmann::json v = nlohmann::json::parse(w.text, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(v.is_discarded()) << "'" << w.text << "'";
    expect_valid(v, w.text);
  }
  EXPECT_GT(ended, kWalks * 9 / 10);
}

TEST(GrammarLogitsProcessorTest, AFailedMatcherAllowsOnlyEos) {
  const TokenVocabulary vocab = hand_vocab();
  GrammarLimits limits;
  limits.max_matcher_bytes = 4096;
  GrammarLogitsProcessor processor(GrammarMatcher(compile_json_object().value(), vocab, limits));
  // Nest {"na":[{"na":[ ... ever deeper until the matcher's budget runs out.
  const std::vector<Token> cycle = {id_of(vocab, "{"), id_of(vocab, "\""), id_of(vocab, "na"),
                                    id_of(vocab, "\":"), id_of(vocab, "[")};
  std::vector<Token> feed;
  for (int i = 0; i < 400; ++i) feed.insert(feed.end(), cycle.begin(), cycle.end());
  LogitAdjustments adj;
  size_t fed = 0;
  for (; fed < feed.size(); ++fed) {
    processor.prepare(adj);
    if (processor.failed()) break;
    ASSERT_TRUE(allowed(adj.allowed, feed[fed])) << "step " << fed;
    processor.accept(feed[fed]);
  }
  ASSERT_TRUE(processor.failed()) << "the budget never ran out";
  EXPECT_EQ(processor.matcher().status().code(), StatusCode::kOutOfResources);
  for (Token t = 0; t < static_cast<Token>(vocab.size()); ++t) {
    EXPECT_EQ(allowed(adj.allowed, t), t == kEos) << t;
  }
  processor.accept(kEos);
  processor.prepare(adj);  // still only EOS
  for (Token t = 0; t < static_cast<Token>(vocab.size()); ++t) {
    EXPECT_EQ(allowed(adj.allowed, t), t == kEos) << t;
  }
}

TEST(GrammarLogitsProcessorTest, AfterEosOnlyEosIsAllowed) {
  const TokenVocabulary vocab = hand_vocab();
  const std::vector<std::string> choices = {"yes", "no"};
  GrammarLogitsProcessor processor(GrammarMatcher(compile_choice(choices).value(), vocab));
  LogitAdjustments adj;
  processor.prepare(adj);
  EXPECT_FALSE(allowed(adj.allowed, kEos));
  EXPECT_FALSE(allowed(adj.allowed, 1)) << "a special token is never allowed";
  const Token yes = id_of(vocab, "yes");
  EXPECT_TRUE(allowed(adj.allowed, yes));
  processor.accept(yes);
  processor.prepare(adj);
  for (Token t = 0; t < static_cast<Token>(vocab.size()); ++t) {
    EXPECT_EQ(allowed(adj.allowed, t), t == kEos) << t;
  }
  processor.accept(kEos);
  EXPECT_TRUE(processor.matcher().ended());
  EXPECT_FALSE(processor.failed());
  processor.prepare(adj);
  for (Token t = 0; t < static_cast<Token>(vocab.size()); ++t) {
    EXPECT_EQ(allowed(adj.allowed, t), t == kEos) << t;
  }
}

TEST(GrammarLogitsProcessorDeathTest, ATokenOutsideTheMaskIsABug) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const TokenVocabulary vocab = hand_vocab();
  const std::vector<std::string> choices = {"yes", "no"};
  EXPECT_DEATH(
      {
        GrammarLogitsProcessor processor(GrammarMatcher(compile_choice(choices).value(), vocab));
        processor.accept(id_of(vocab, "ab"));
        LogitAdjustments adj;
        processor.prepare(adj);  // the matcher steps over the recorded token here
      },
      "not allowed by the grammar");
}

}  // namespace
}  // namespace cellm
