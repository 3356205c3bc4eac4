// GrammarLogitsProcessor: a GrammarMatcher as a LogitsProcessor. Its mask is
// the matcher's next-token mask; accepted tokens advance the matcher (at the
// next prepare() or matcher(): see grammar.h). Once the matcher has ended (an
// EOS was accepted) or failed (an all-zero mask: budget or stack depth
// exceeded), only the EOS ids are allowed, so the generation stops instead of
// sampling from a row with every token forbidden.
#include <string>

#include "cellm/grammar.h"

namespace cellm {

GrammarLogitsProcessor::GrammarLogitsProcessor(GrammarMatcher matcher)
    : matcher_(std::move(matcher)) {}

void GrammarLogitsProcessor::prepare(LogitAdjustments& out) {
  advance();
  out.edits.clear();
  const TokenVocabulary& vocab = matcher_.vocabulary();
  if (!failed_ && !matcher_.ended()) {
    // fill_next_token_mask writes every word: no clearing first.
    out.allowed.resize(vocab.mask_words());
    matcher_.fill_next_token_mask(out.allowed);
    for (uint64_t word : out.allowed) {
      if (word != 0) return;
    }
    failed_ = true;  // nothing continues the match: the matcher ran out of budget
  }
  out.allowed.assign(vocab.mask_words(), 0);
  for (Token eos : vocab.eos_ids()) {
    const auto t = static_cast<size_t>(eos);
    out.allowed[t / 64] |= uint64_t{1} << (t % 64);
  }
}

void GrammarLogitsProcessor::accept(Token token) {
  const bool failed_before = failed_;
  advance();                              // a second accept() without a prepare() between
  if (failed_ && !failed_before) return;  // that step ran out of budget: `token` is moot
  if (failed_ || matcher_.ended()) {
    // After the grammar ended or failed only EOS ids are allowed; nothing to step.
    CELLM_CHECK_MSG(matcher_.vocabulary().is_eos(token),
                    "token " + std::to_string(token) + " after the grammar ended or failed");
    return;
  }
  pending_ = token;
}

const GrammarMatcher& GrammarLogitsProcessor::matcher() const {
  advance();
  return matcher_;
}

void GrammarLogitsProcessor::advance() const {
  if (!pending_) return;
  const Token token = *pending_;
  pending_.reset();
  // A token outside the last mask is a bug of the executor (it must sample from
  // the masked row), unless stepping it again ran out of a budget (the transition
  // tables it was masked with were dropped for memory): then the generation ends.
  if (matcher_.accept_token(token)) return;
  CELLM_CHECK_MSG(!matcher_.status().ok(),
                  "token " + std::to_string(token) + " is not allowed by the grammar");
  failed_ = true;
}

}  // namespace cellm
