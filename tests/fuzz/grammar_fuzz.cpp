// Fuzzes the grammar front ends and the matcher (include/cellm/grammar.h).
// Input: a selector byte, the grammar source up to the first NUL, then the walk:
//   selector % 5: 0 compile_json_schema, 1 compile_regex, 2 compile_gbnf,
//                 3 compile_choice (the source's lines are the choices),
//                 4 compile_json_object (the source is unused);
//   walk bytes:   one per step (at most kMaxSteps).
// Small GrammarLimits keep most inputs fast (selectors from 0xE0 take the
// defaults, what serving uses). A grammar that compiles is followed
// by a GrammarMatcher over a fixed vocabulary (every single byte, some multi-byte
// tokens, an empty special token and EOS). Each step fills the next-token mask,
// and checks it:
//   - the EOS bit is set exactly when the match may end (can_end());
//   - a disallowed token (chosen by the walk byte) is refused by accept_token and
//     leaves the position unchanged;
//   - the allowed token the walk byte picks is accepted;
//   - the same token's bytes are accepted by a fork (accept_bytes), which then
//     reaches the same state;
//   - JSON Schema and json_object grammars: wherever the match may end, the
//     bytes so far are JSON text (nlohmann's parser accepts them);
//   - choices: each choice's bytes are accepted by a fresh matcher, which may
//     then end.
// The walk ends on EOS, on an empty mask (the grammar has no continuation, or
// the matcher ran out of budget: then status() says so) or after kMaxSteps.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "cellm/grammar.h"
#include "fuzz_check.h"

namespace {

constexpr size_t kMaxSteps = 64;
constexpr cellm::Token kEos = 0;
constexpr cellm::Token kSpecial = 1;  // empty bytes: never allowed

// Small limits keep most inputs fast; a selector byte of 0xE0 or above takes the
// defaults, what `cellm serve` compiles requests with (a slow input there is a
// way to stall the server).
cellm::GrammarLimits limits(uint8_t selector) {
  cellm::GrammarLimits l;
  if (selector >= 0xE0) return l;
  l.max_input_bytes = 4096;
  l.max_nesting = 16;
  l.max_symbols = 8192;
  l.max_repetition = 64;
  l.max_stack_depth = 64;
  l.max_matcher_bytes = size_t{8} << 20;
  return l;
}

const cellm::TokenVocabulary& vocabulary() {
  static const cellm::TokenVocabulary vocab = [] {
    std::vector<std::string> tokens = {"", ""};  // EOS, a special token
    for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
    for (const char* t : {"{\"",          "\":",      "\"}",          "\",\"",
                          "true",         "false",    "null",         "  ",
                          "\n",           "ab",       "abc",          "123",
                          "-0.5e+3",      "\\u00e9",  "\\\"",         "[]",
                          "{}",           "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80",
                          "\xC3",         "\xA9\xC3", "\xED\xA0\x80", " \"name\": \"",
                          "\"arguments\""}) {
      tokens.emplace_back(t);
    }
    return cellm::TokenVocabulary::build(std::move(tokens), {kEos}).value();
  }();
  return vocab;
}

std::vector<std::string> lines(std::string_view source) {
  std::vector<std::string> out;
  size_t from = 0;
  for (;;) {
    const size_t nl = source.find('\n', from);
    out.emplace_back(source.substr(from, nl - from));
    if (nl == std::string_view::npos) break;
    from = nl + 1;
  }
  return out;
}

cellm::Result<cellm::Grammar> compile(uint8_t selector, std::string_view source) {
  const cellm::GrammarLimits l = limits(selector);
  switch (selector % 5) {
    case 0:
      return cellm::compile_json_schema(source, l);
    case 1:
      return cellm::compile_regex(source, l);
    case 2:
      return cellm::compile_gbnf(source, l);
    case 3:
      return cellm::compile_choice(lines(source), l);
    default:
      return cellm::compile_json_object(l);
  }
}

// Whether a JSON text has a number whose exponent has 3 digits or more (it may be
// past the range of a double, which nlohmann refuses while the grammar allows it).
bool has_long_exponent(std::string_view text) {
  for (size_t i = 0; i + 1 < text.size(); ++i) {
    if ((text[i] == 'e' || text[i] == 'E') && i > 0 && text[i - 1] >= '0' && text[i - 1] <= '9') {
      size_t j = i + 1;
      if (j < text.size() && (text[j] == '+' || text[j] == '-')) ++j;
      size_t digits = 0;
      while (j < text.size() && text[j] >= '0' && text[j] <= '9') ++j, ++digits;
      if (digits >= 3) return true;
    }
  }
  return false;
}

bool bit(const std::vector<uint64_t>& mask, size_t id) {
  return (mask[id / 64] >> (id % 64)) & 1;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > 8192) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t nul = input.find('\0');
  const std::string_view source = input.substr(0, nul);
  const std::string_view walk =
      nul == std::string_view::npos ? std::string_view() : input.substr(nul + 1);

  cellm::Result<cellm::Grammar> grammar = compile(data[0], source);
  if (!grammar.ok()) {
    FUZZ_CHECK(!grammar.status().message().empty(), "an error says what is wrong");
    return 0;
  }
  (void)grammar->to_gbnf();
  const cellm::TokenVocabulary& vocab = vocabulary();
  if (data[0] % 5 == 3) {
    const std::vector<std::string> choices = lines(source);
    for (size_t i = 0; i < choices.size() && i < 4; ++i) {
      cellm::GrammarMatcher c(*grammar, vocab, limits(data[0]));
      FUZZ_CHECK(c.accept_bytes(choices[i]), "a choice's bytes are accepted");
      FUZZ_CHECK(c.can_end(), "a match may end after a choice");
    }
  }
  const bool json = data[0] % 5 == 0 || data[0] % 5 == 4;
  std::string text;  // the bytes accepted so far
  cellm::GrammarMatcher m(*grammar, vocab, limits(data[0]));
  std::vector<uint64_t> mask(vocab.mask_words());
  for (size_t step = 0; step < kMaxSteps && step < walk.size(); ++step) {
    const auto b = static_cast<uint8_t>(walk[step]);
    m.fill_next_token_mask(mask);
    std::vector<cellm::Token> allowed;
    std::vector<cellm::Token> refused;
    for (size_t id = 0; id < vocab.size(); ++id) {
      (bit(mask, id) ? allowed : refused).push_back(static_cast<cellm::Token>(id));
    }
    if (!m.status().ok()) {
      FUZZ_CHECK(allowed.empty(), "a failed matcher allows nothing");
      break;
    }
    FUZZ_CHECK(!bit(mask, kSpecial), "a token without bytes is never allowed");
    if (m.ended()) {
      FUZZ_CHECK(allowed.empty(), "nothing follows EOS");
      break;
    }
    FUZZ_CHECK(bit(mask, kEos) == m.can_end(), "EOS is allowed exactly where the match may end");
    if (json && m.can_end() && !has_long_exponent(text)) {
      FUZZ_CHECK(nlohmann::json::accept(text), "a JSON grammar ends only on JSON text");
    }
    if (m.is_complete()) {
      FUZZ_CHECK(allowed.size() == 1 && allowed[0] == kEos, "a complete match allows only EOS");
    }
    if (!refused.empty()) {
      const cellm::GrammarMatcher::Snapshot before = m.snapshot();
      FUZZ_CHECK(!m.accept_token(refused[b % refused.size()]), "a disallowed token is refused");
      const cellm::GrammarMatcher::Snapshot after = m.snapshot();
      FUZZ_CHECK(after.state == before.state && after.ended == before.ended,
                 "a refused token changes nothing");
    }
    if (allowed.empty()) break;  // no continuation (a grammar with no sentence here)
    const cellm::Token pick = allowed[(b * 131u + step) % allowed.size()];
    text += vocab.bytes(pick);
    if (pick != kEos && b % 4 == 0) {
      // The same bytes through a fork: the same position.
      cellm::GrammarMatcher fork = m.fork();
      FUZZ_CHECK(fork.accept_bytes(vocab.bytes(pick)), "an allowed token's bytes are accepted");
      FUZZ_CHECK(m.accept_token(pick), "an allowed token is accepted");
      FUZZ_CHECK(fork.snapshot().state == m.snapshot().state, "bytes and token reach one state");
    } else {
      FUZZ_CHECK(m.accept_token(pick), "an allowed token is accepted");
    }
    if (b % 16 == 1) {
      // Roll back one step and take it again.
      const cellm::GrammarMatcher::Snapshot snap = m.snapshot();
      m.reset();
      m.rollback(snap);
      FUZZ_CHECK(m.snapshot().state == snap.state, "rollback returns to the snapshot");
    }
  }
  return 0;
}
