// `cellm bench` under constrained decoding: --json-schema FILE, --grammar FILE (GBNF)
// or --regex PATTERN puts a GrammarLogitsProcessor (cellm/grammar.h) on every
// generation of every row, as `cellm serve` does for response_format.
//
// The constraint is compiled once, over the byte vocabulary of the model's tokenizer
// (--model DIR's own, or --tokenizer DIR: a folder with tokenizer.json, which gives a
// preset's random weights a real vocabulary; its ids must fit the model's vocabulary,
// and ids past the tokenizer's are never allowed). One "family" matcher holds the
// automaton and the per-state mask cache; each generation gets a fork, so every
// session of every row (the warm-up included) shares the masks already computed, as
// a server's requests with one schema do. The tokenizer's EOS ids become the
// generations' stop tokens, so a generation whose output is complete ends there:
// rows then report the tokens really generated, and S_TG counts those.
//
// Thread-safety: make_processor() may be called from any thread (fork() is guarded
// here); each processor belongs to one generation.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "args.h"
#include "cellm/grammar.h"
#include "cellm/logits_processor.h"
#include "cellm/status.h"
#include "cellm/types.h"

namespace cellm::cli {

// The flags: --json-schema, --grammar, --regex, --tokenizer, --outputs.
std::vector<FlagSpec> constraint_flags();

class BenchConstraint {
 public:
  // From the flags; nullopt when none of --json-schema, --grammar, --regex is given.
  // `model_dir` is --model's folder (empty for a preset); `model_vocab` the model's
  // vocabulary size. Errors name the flag and what is wrong (a schema that does not
  // compile, a tokenizer larger than the model's vocabulary, no EOS id, --tokenizer
  // or --outputs without a constraint).
  static Result<std::optional<BenchConstraint>> from_flags(const Args& args,
                                                           const std::string& model_dir,
                                                           int64_t model_vocab);

  // A processor at the grammar's start for one generation.
  std::shared_ptr<GrammarLogitsProcessor> make_processor() const;
  // Whether the processor's output is a whole sentence of the grammar (it ended on
  // an EOS id accepted where the match may end).
  static bool ended(const GrammarLogitsProcessor& processor) { return processor.matcher().ended(); }
  const std::vector<Token>& eos_ids() const { return vocab_.eos_ids(); }
  // The bytes of `tokens` (EOS ids add nothing).
  std::string text_of(const std::vector<Token>& tokens) const;

  // For the header: "json-schema FILE", the tokenizer's folder, and the rules in GBNF.
  const std::string& what() const { return what_; }
  const std::string& tokenizer_dir() const { return tokenizer_dir_; }
  std::string gbnf() const { return grammar_->to_gbnf(); }
  size_t vocab_size() const { return vocab_.size(); }
  // --outputs FILE, or empty.
  const std::string& outputs_path() const { return outputs_path_; }

 private:
  BenchConstraint(TokenVocabulary vocab, Grammar grammar)
      : vocab_(std::move(vocab)), grammar_(std::move(grammar)) {}

  TokenVocabulary vocab_;
  std::optional<Grammar> grammar_;
  std::shared_ptr<GrammarMatcher> family_;
  std::shared_ptr<std::mutex> family_mu_ = std::make_shared<std::mutex>();
  std::string what_, tokenizer_dir_, outputs_path_;
};

}  // namespace cellm::cli
