// No input crashes a front end: random bytes and random mutations of valid
// schemas, regexes and grammars either compile (and then a matcher follows a few
// bytes) or return an error with a message. Run under ASan by tools/test.sh.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "cellm/grammar.h"

namespace cellm {
namespace {

const std::vector<std::string> kSeeds = {
    R"({"type":"object","properties":{"a":{"type":"array","items":{"$ref":"#/$defs/x"},"maxItems":3},"b":{"enum":[1,"x",null]}},"required":["a"],"additionalProperties":false,"$defs":{"x":{"anyOf":[{"type":"string","maxLength":4},{"const":true}]}}})",
    R"(^(\d{2,3}|[a-f]+)(?:-[^\s,]{1,4})*\.?$)",
    "root ::= item (\",\" item)*\nitem ::= [a-z]+ | \"(\" root \")\" | [0-9]{1,2}\n",
};

std::string mutate(std::string s, std::mt19937_64& rng, int max_edits) {
  const std::string alphabet = "{}[]()\"\\:,|*+?.^$-#0123456789az \n\xC3\xA9\xFF";
  const int edits = 1 + static_cast<int>(rng() % max_edits);
  for (int e = 0; e < edits; ++e) {
    const size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 3) {
      case 0:
        s.insert(pos, 1, alphabet[rng() % alphabet.size()]);
        break;
      case 1:
        if (pos < s.size()) s.erase(pos, 1 + rng() % 3);
        break;
      default:
        if (pos < s.size()) s[pos] = alphabet[rng() % alphabet.size()];
        break;
    }
  }
  return s;
}

// Returns whether `g` compiled.
bool exercise(const Result<Grammar>& g, const TokenVocabulary& vocab) {
  if (!g.ok()) {
    EXPECT_FALSE(g.status().message().empty());
    return false;
  }
  GrammarMatcher m(*g, vocab);
  for (const char* probe : {"{", "[", "a", "1", "\"", "(", "-"}) {
    const auto snap = m.snapshot();
    (void)m.accept_bytes(probe);
    (void)m.next_token_mask();
    m.rollback(snap);
  }
  return true;
}

TEST(GrammarRobustnessTest, MutatedAndRandomInputsNeverCrash) {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  const TokenVocabulary vocab = TokenVocabulary::build(bytes, {0}).value();
  std::mt19937_64 rng(42);
  int compiled[3] = {0, 0, 0};
  for (int i = 0; i < 2000; ++i) {
    const std::string schema = mutate(kSeeds[0], rng, 1);
    const std::string regex = mutate(kSeeds[1], rng, 4);
    const std::string gbnf = mutate(kSeeds[2], rng, 4);
    std::string noise(rng() % 64, '\0');
    for (char& c : noise) c = static_cast<char>(rng());
    compiled[0] += exercise(compile_json_schema(schema), vocab);
    compiled[1] += exercise(compile_regex(regex), vocab);
    compiled[2] += exercise(compile_gbnf(gbnf), vocab);
    exercise(compile_json_schema(noise), vocab);
    exercise(compile_regex(noise), vocab);
    exercise(compile_gbnf(noise), vocab);
    exercise(compile_choice(std::vector<std::string>{noise, regex}), vocab);
  }
  // Mutations keep a share of the inputs valid, so matchers run too.
  for (int c : compiled)
    EXPECT_GT(c, 20) << compiled[0] << " " << compiled[1] << " " << compiled[2];
}

}  // namespace
}  // namespace cellm
