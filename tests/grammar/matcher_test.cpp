// GrammarMatcher: the token mask equals a token-by-token check (accept, then roll
// back) on synthetic and real vocabularies; EOS only where the match may end;
// snapshots, rollback and budgets.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cellm/grammar.h"
#include "grammar/vocab_loader.h"

namespace cellm {
namespace {

bool bit(const std::vector<uint64_t>& mask, Token id) {
  return (mask[id >> 6] >> (id & 63)) & 1;
}

// The mask computed the slow way: every token tried on its own.
std::vector<uint64_t> brute_force_mask(GrammarMatcher& m, const TokenVocabulary& vocab) {
  std::vector<uint64_t> mask(vocab.mask_words(), 0);
  const GrammarMatcher::Snapshot snap = m.snapshot();
  for (Token id = 0; id < static_cast<Token>(vocab.size()); ++id) {
    if (m.accept_token(id)) mask[id >> 6] |= uint64_t{1} << (id & 63);
    m.rollback(snap);
  }
  return mask;
}

// Walks `steps` tokens drawn uniformly from the mask, checking the mask against
// the slow way at every step. Returns the bytes produced.
std::string checked_walk(const Grammar& g, const TokenVocabulary& vocab, uint64_t seed, int steps) {
  GrammarMatcher m(g, vocab);
  std::mt19937_64 rng(seed);
  std::string out;
  for (int i = 0; i < steps && !m.ended(); ++i) {
    const std::vector<uint64_t> mask = m.next_token_mask();
    const std::vector<uint64_t> slow = brute_force_mask(m, vocab);
    for (Token id = 0; id < static_cast<Token>(vocab.size()); ++id) {
      if (bit(mask, id) != bit(slow, id)) {
        ADD_FAILURE() << "step " << i << " after '" << out << "': token " << id << " ('"
                      << vocab.bytes(id) << "') mask " << bit(mask, id) << " vs " << bit(slow, id);
        return out;
      }
    }
    std::vector<Token> allowed;
    for (Token id = 0; id < static_cast<Token>(vocab.size()); ++id) {
      if (bit(mask, id)) allowed.push_back(id);
    }
    if (allowed.empty()) {
      ADD_FAILURE() << "empty mask after '" << out << "'";
      return out;
    }
    const Token t = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    EXPECT_TRUE(m.accept_token(t));
    if (!vocab.is_eos(t)) out += vocab.bytes(t);
  }
  return out;
}

// Tokens with shared prefixes, duplicates, multi-byte UTF-8 pieces, a special
// (empty) token and EOS.
TokenVocabulary synthetic_vocab() {
  std::vector<std::string> bytes = {
      "",   "{", "}", "\"", "\":", "\",",  ",\"", "a",    "ab",  "abc",  "ab",   "1",
      "12", "0", " ", "  ", "\n",  "true", "tr",  "null", "x\"", "\xC3", "\xA9", "\xC3\xA9",
      "[",  "]", "-", ".5", "e",   "yes",  "no",  "n",    "\\",  "\\n",  "\"}"};
  for (int b = 0; b < 128; ++b) bytes.emplace_back(1, static_cast<char>(b));
  return TokenVocabulary::build(std::move(bytes), {0}).value();
}

TEST(GrammarMatcherTest, MaskEqualsTheTokenByTokenCheckOnASyntheticVocabulary) {
  const TokenVocabulary vocab = synthetic_vocab();
  const std::vector<Grammar> grammars = {
      compile_json_schema(R"({"type":"object","properties":{"a":{"type":"string"},
          "b":{"type":"array","items":{"type":"number"}},"c":{"enum":["yes","no",null]}},
          "required":["a"],"additionalProperties":false})")
          .value(),
      compile_json_object().value(), compile_regex("(ab|a)+[0-9]{1,3}(yes|no)?").value(),
      compile_choice(std::vector<std::string>{"yes", "no", "null"}).value(),
      compile_gbnf("root ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [0-9]+ | \"true\"")
          .value()};
  for (size_t g = 0; g < grammars.size(); ++g) {
    for (uint64_t seed = 0; seed < 20; ++seed) checked_walk(grammars[g], vocab, seed * 7 + g, 60);
  }
}

TEST(GrammarMatcherTest, MaskEqualsTheTokenByTokenCheckOnARealVocabulary) {
  const std::string dir = grammar_test::shared_tokenizer_dir("llama3");
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " is absent";
  const TokenVocabulary vocab = grammar_test::load_vocabulary(dir).value();
  const Grammar g = compile_json_schema(R"({"type":"object","properties":{
      "name":{"type":"string","maxLength":6},"n":{"type":"integer"},"tags":{"type":"array",
      "items":{"enum":["x","y"]}}},"required":["name","n","tags"],"additionalProperties":false})")
                        .value();
  for (uint64_t seed = 0; seed < 3; ++seed) checked_walk(g, vocab, seed, 12);
}

TEST(GrammarMatcherTest, EosOnlyWhereTheMatchMayEnd) {
  const TokenVocabulary vocab = synthetic_vocab();
  GrammarMatcher m(compile_regex("ab|abc").value(), vocab);
  EXPECT_FALSE(m.can_end());
  EXPECT_FALSE(bit(m.next_token_mask(), 0));
  EXPECT_FALSE(m.accept_token(0));
  ASSERT_TRUE(m.accept_bytes("ab"));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.is_complete());  // "c" may still follow
  EXPECT_TRUE(bit(m.next_token_mask(), 0));
  ASSERT_TRUE(m.accept_bytes("c"));
  EXPECT_TRUE(m.is_complete());
  // Complete: only EOS is allowed.
  const std::vector<uint64_t> mask = m.next_token_mask();
  for (Token id = 1; id < static_cast<Token>(vocab.size()); ++id) EXPECT_FALSE(bit(mask, id)) << id;
  EXPECT_TRUE(m.accept_token(0));
  EXPECT_TRUE(m.ended());
  EXPECT_FALSE(m.can_end());
  for (uint64_t w : m.next_token_mask()) EXPECT_EQ(w, 0u);
  EXPECT_FALSE(m.accept_bytes(""));
}

TEST(GrammarMatcherTest, RejectedInputChangesNothingAndRollbackRestores) {
  const TokenVocabulary vocab = synthetic_vocab();
  GrammarMatcher m(compile_json_object().value(), vocab);
  ASSERT_TRUE(m.accept_bytes("{\"a\":"));
  const auto snap = m.snapshot();
  EXPECT_FALSE(m.accept_bytes("1}x"));  // the last byte fails: nothing consumed
  EXPECT_TRUE(m.accept_bytes("1}"));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.accept_token(1));  // '{' cannot follow
  EXPECT_FALSE(m.accept_token(-1));
  EXPECT_FALSE(m.accept_token(static_cast<Token>(vocab.size())));
  EXPECT_FALSE(m.accept_token(10));  // the duplicate "ab" cannot follow either
  m.rollback(snap);
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.accept_bytes("[true]}"));
  m.reset();
  EXPECT_TRUE(m.accept_bytes("{}"));
  // A special token (empty bytes) is never allowed.
  EXPECT_FALSE(bit(m.next_token_mask(), 0) && !vocab.is_eos(0));
}

TEST(GrammarMatcherTest, StackDepthIsBounded) {
  const TokenVocabulary vocab = synthetic_vocab();
  GrammarLimits limits;
  limits.max_stack_depth = 40;
  GrammarMatcher m(compile_json_object().value(), vocab, limits);
  ASSERT_TRUE(m.accept_bytes("{\"a\":"));
  int depth = 0;
  while (depth < 100 && m.accept_bytes("[")) ++depth;
  EXPECT_LT(depth, 40);
  EXPECT_GT(depth, 3);
  // The mask agrees: '[' is no longer allowed, ']' is.
  EXPECT_FALSE(bit(m.next_token_mask(), 24));
  EXPECT_TRUE(bit(m.next_token_mask(), 25));
}

TEST(GrammarMatcherTest, AMemoryBudgetEndsInAnErrorNotACrash) {
  const TokenVocabulary vocab = synthetic_vocab();
  GrammarLimits limits;
  limits.max_matcher_bytes = 4096;
  GrammarMatcher m(compile_json_object().value(), vocab, limits);
  bool stopped = false;
  for (int i = 0; i < 2000 && !stopped; ++i) {
    const std::vector<uint64_t>& mask = m.next_token_mask();
    bool any = false;
    for (uint64_t w : mask) any = any || w != 0;
    if (!any) {
      stopped = true;
      break;
    }
    stopped = !m.accept_bytes(i % 2 ? "[" : "{\"a\":");
  }
  EXPECT_TRUE(stopped);
  EXPECT_EQ(m.status().code(), StatusCode::kOutOfResources) << m.status().to_string();
}

TEST(GrammarMatcherTest, AnAmbiguousGrammarFailsOnItsWorkBudgetNotByStalling) {
  // Every 'a' opens six ways to close the nesting, so the parse stacks at one
  // position multiply with the input's length.
  const Grammar g = compile_gbnf(R"g(
    root ::= x
    x ::= "a" x "b" | "a" x "c" | "a" x "d" | "a" x x | "a" x "e" x | "a" x "f" x x | ""
  )g")
                        .value();
  const TokenVocabulary vocab = synthetic_vocab();
  GrammarLimits limits;
  limits.max_step_work = 200000;
  GrammarMatcher m(g, vocab, limits);
  int accepted = 0;
  while (accepted < 64 && m.accept_bytes("a")) ++accepted;
  EXPECT_LT(accepted, 64);
  EXPECT_EQ(m.status().code(), StatusCode::kOutOfResources);
  EXPECT_NE(m.status().message().find("too ambiguous"), std::string::npos)
      << m.status().to_string();
  // Failed: the mask is empty, and a fork sees the failure too.
  for (uint64_t w : m.next_token_mask()) EXPECT_EQ(w, 0u);
  EXPECT_FALSE(m.fork().status().ok());
  // The same grammar within budget while the input stays short.
  GrammarMatcher fresh(g, vocab, limits);
  EXPECT_TRUE(fresh.accept_bytes("aab"));
}

TEST(GrammarMatcherTest, ForksShareCachesAndWalkOnTheirOwnAcrossThreads) {
  const TokenVocabulary vocab = synthetic_vocab();
  const Grammar g = compile_json_object().value();
  GrammarMatcher root(g, vocab);
  ASSERT_TRUE(root.accept_bytes("{\"a\":"));
  const auto snap = root.snapshot();
  std::vector<std::string> outputs(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t, fork = root.fork()]() mutable {
      std::mt19937_64 rng(static_cast<uint64_t>(t));
      for (int i = 0; i < 300 && !fork.ended(); ++i) {
        std::vector<Token> allowed;
        const std::vector<uint64_t>& mask = fork.next_token_mask();
        for (Token id = 0; id < static_cast<Token>(vocab.size()); ++id) {
          if (bit(mask, id)) allowed.push_back(id);
        }
        if (allowed.empty()) break;
        const Token tok =
            allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
        if (!fork.accept_token(tok)) break;
        if (!vocab.is_eos(tok)) outputs[t] += vocab.bytes(tok);
      }
    });
  }
  for (auto& th : threads) th.join();
  // Each fork's output continues the root's prefix: an independent matcher agrees.
  for (const std::string& out : outputs) {
    GrammarMatcher fresh(g, vocab);
    EXPECT_TRUE(fresh.accept_bytes("{\"a\":" + out)) << out;
  }
  // The root did not move, and its snapshot is valid in a fork.
  EXPECT_EQ(root.snapshot().state, snap.state);
  GrammarMatcher other = root.fork();
  ASSERT_TRUE(other.accept_bytes("1}"));
  other.rollback(snap);
  EXPECT_TRUE(other.accept_bytes("[]}"));
  EXPECT_TRUE(other.can_end());
}

TEST(TokenVocabularyTest, RejectsBadEosIdsAndEmptyVocabularies) {
  EXPECT_FALSE(TokenVocabulary::build({}, {}).ok());
  EXPECT_FALSE(TokenVocabulary::build({"a"}, {1}).ok());
  EXPECT_FALSE(TokenVocabulary::build({"a"}, {-1}).ok());
  const TokenVocabulary v = TokenVocabulary::build({"a", "", "b"}, {1, 1}).value();
  EXPECT_EQ(v.eos_ids(), std::vector<Token>{1});
  EXPECT_EQ(v.mask_words(), 1u);
}

}  // namespace
}  // namespace cellm
