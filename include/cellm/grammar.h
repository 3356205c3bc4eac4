// Constrained decoding: grammars over bytes and, per decoding step, the set of
// vocabulary tokens that may come next.
//
// Front ends compile a JSON Schema, `json_object` mode, a regular expression, a
// choice among strings or a GBNF grammar into one `Grammar`: context-free rules
// whose terminals are byte classes (UTF-8 is spelled out byte by byte). A
// `GrammarMatcher` follows one generation through it: a pushdown automaton whose
// state (a set of stacks of rule positions, interned) is a small integer, so a
// snapshot is a copy of that integer and rollback is free. Each step it gives a
// bitset over the vocabulary (the tokens whose bytes continue the match, and the
// EOS ids only where the match may end), found by walking a byte trie of the
// vocabulary through the automaton and cached per automaton state.
//
// Use, per model then per request and step:
//   TokenVocabulary vocab = TokenVocabulary::build(token_bytes, eos_ids).value();
//   Result<Grammar> g = compile_json_schema(schema);   // an error names what is wrong
//   GrammarMatcher m(*g, vocab);                       // or family.fork() for a known schema
//   each step: m.fill_next_token_mask(bits);  mask the logits;  sample t;  m.accept_token(t);
//   stop on EOS (m.ended()) or when m.is_complete() (only EOS could follow).
//
// Generated JSON allows at most kMaxJsonWhitespace bytes of whitespace in each
// gap between tokens (and after the value), so a model cannot loop on spaces.
// Strings are valid UTF-8; \u escapes exclude the surrogate range D800-DFFF.
//
// Grammar and TokenVocabulary are immutable, cheaply copyable handles (shared
// state) and safe to use from any thread. A GrammarMatcher is one session's
// position: not thread-safe itself, one per generation. Matchers made by fork()
// share the automaton and the mask cache (under a lock), so sessions with one
// schema pay for each state's mask once; they may run on different threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cellm/logits_processor.h"
#include "cellm/status.h"
#include "cellm/types.h"

namespace cellm {

// Bytes of whitespace allowed in each gap of generated JSON (between tokens, and
// after the top-level value).
inline constexpr int kMaxJsonWhitespace = 20;

// Bounds on what the front ends accept: input size, syntactic nesting and the
// size of the compiled rules (bounded repetitions are expanded).
struct GrammarLimits {
  size_t max_input_bytes = size_t{1} << 20;
  int max_nesting = 64;                         // brackets, groups, nested schemas
  size_t max_symbols = size_t{1} << 18;         // symbols over all rules
  int max_repetition = 10000;                   // the largest m or n of {m,n}
  int max_stack_depth = 1024;                   // matcher: rule frames per stack
  size_t max_matcher_bytes = size_t{64} << 20;  // a matcher and its forks: caches
  // Matcher: parse-stack visits one call (a mask, a token) may spend building new
  // automaton states. An ambiguous grammar can hold exponentially many stacks at
  // one position; past this budget the matcher fails (OutOfResources) instead of
  // stalling the step that every other generation waits on.
  uint64_t max_step_work = uint64_t{1} << 22;
};

// A compiled grammar. Errors of the front ends name the position (byte offset,
// or JSON pointer for schemas) and what is wrong or unsupported.
class Grammar {
 public:
  struct Impl;
  explicit Grammar(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

  size_t num_rules() const;
  // The rules written out in GBNF, for debugging and error reports.
  std::string to_gbnf() const;
  const Impl& impl() const { return *impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

// A JSON Schema (text). Supported: type (a name or a list), properties, required,
// additionalProperties (false, true, or a schema when there are no properties),
// items, minItems, maxItems, minLength, maxLength, enum, const, $ref into
// $defs/definitions or "#", anyOf, oneOf (as anyOf), allOf of one schema; the
// annotations title, description, default, examples, $schema, $id, $comment are
// ignored. Objects list their properties in the schema's order; properties the
// schema does not declare are never generated. Any other keyword is an error
// naming it.
Result<Grammar> compile_json_schema(std::string_view schema_json, const GrammarLimits& limits = {});
// Any JSON value whose top level is an object.
Result<Grammar> compile_json_object(const GrammarLimits& limits = {});
// A regular expression matched against the whole output: literals, classes
// ([a-z], [^...]), escapes \d \w \s \D \W \S (ASCII meanings) \n \t \r \f \v
// \xHH \uHHHH, '.' (any character but newline), groups ((...), (?:...)),
// alternation, ? * + {m} {m,} {m,n}; ^ at the start and $ at the end.
Result<Grammar> compile_regex(std::string_view pattern, const GrammarLimits& limits = {});
// Exactly one of the strings.
Result<Grammar> compile_choice(std::span<const std::string> choices,
                               const GrammarLimits& limits = {});
// A GBNF grammar (rules `name ::= body`, start rule `root`): string literals,
// character classes, '.', rule references, grouping, alternation, * + ? {m,n},
// # comments.
Result<Grammar> compile_gbnf(std::string_view text, const GrammarLimits& limits = {});

// The vocabulary as bytes: token_bytes[id] is the exact byte string the token
// adds to the output (byte-level or byte-fallback decoding done by the caller);
// an empty string marks a token that a grammar never allows (special and control
// tokens). eos_ids end a generation and are allowed only where the match may end.
class TokenVocabulary {
 public:
  struct Impl;
  static Result<TokenVocabulary> build(std::vector<std::string> token_bytes,
                                       std::vector<Token> eos_ids);

  size_t size() const;                       // token ids [0, size)
  size_t mask_words() const;                 // 64-bit words of a mask
  const std::string& bytes(Token id) const;  // REQUIRES: 0 <= id < size()
  bool is_eos(Token id) const;
  const std::vector<Token>& eos_ids() const;
  const Impl& impl() const { return *impl_; }

 private:
  explicit TokenVocabulary(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// One generation's position in a grammar.
class GrammarMatcher {
 public:
  // An opaque position to return to with rollback(); valid for the matcher that
  // made it.
  struct Snapshot {
    uint32_t state = 0;
    bool ended = false;
  };

  GrammarMatcher(Grammar grammar, TokenVocabulary vocab, const GrammarLimits& limits = {});
  // A matcher at this one's position (snapshots of either are valid in both)
  // sharing its automaton, mask cache and memory budget.
  GrammarMatcher fork() const;
  ~GrammarMatcher();
  GrammarMatcher(GrammarMatcher&&) noexcept;
  GrammarMatcher& operator=(GrammarMatcher&&) noexcept;
  GrammarMatcher(const GrammarMatcher&) = delete;
  GrammarMatcher& operator=(const GrammarMatcher&) = delete;

  // Consumes `bytes` when all of them continue the match (returns true), else
  // changes nothing (false).
  bool accept_bytes(std::string_view bytes);
  // Consumes a sampled token: its bytes, or for an EOS id the end of the match
  // (accepted only where can_end()). False, changing nothing, when not allowed.
  bool accept_token(Token id);

  // The bytes so far are a whole sentence of the grammar: EOS may come next.
  bool can_end() const;
  // can_end() and no byte can follow: the generation must stop here.
  bool is_complete() const;
  // An EOS token was accepted; no further token is allowed.
  bool ended() const;

  Snapshot snapshot() const;
  void rollback(Snapshot snapshot);  // REQUIRES: a snapshot of this matcher
  void reset();                      // back to the start

  // The tokens allowed next as a bitset over the vocabulary (bit id % 64 of word
  // id / 64), EOS ids included where the match may end. Every bit is written.
  // An all-zero mask means the matcher ran out of a budget (memory, step work) or stack
  // depth (status() says which); the caller should end the generation.
  // REQUIRES: mask.size() == vocab.mask_words().
  void fill_next_token_mask(std::span<uint64_t> mask);
  // The same mask, in a buffer owned by the matcher (valid until the next call
  // on this matcher).
  const std::vector<uint64_t>& next_token_mask();

  // Ok, or OutOfResources once a budget of GrammarLimits was exceeded.
  const Status& status() const;
  // The vocabulary the masks range over.
  const TokenVocabulary& vocabulary() const;

 private:
  GrammarMatcher() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A LogitsProcessor (logits_processor.h) holding one generation's matcher: its
// mask allows only the tokens that continue the match (EOS ids where it may
// end), and each accepted token advances the matcher. When the matcher fails
// (its budget or stack depth is exceeded: an all-zero mask) the mask allows
// only the EOS ids, so the generation ends, and failed() turns true.
//
// accept() only records the token: the matcher steps over its bytes (building
// any automaton state met for the first time) at the next prepare() or matcher().
// An executor that calls prepare() while the device computes the step (the CUDA
// executor) thereby overlaps that work with the device too, instead of running it
// between the step's end and the next launch. A token outside the last mask is a
// bug of the executor: it fails (CELLM_CHECK) when the matcher steps over it,
// unless stepping over it ran out of a budget (then failed() turns true).
class GrammarLogitsProcessor : public LogitsProcessor {
 public:
  explicit GrammarLogitsProcessor(GrammarMatcher matcher);
  void prepare(LogitAdjustments& out) override;
  void accept(Token token) override;
  bool failed() const { return failed_; }
  // The matcher after every accepted token.
  const GrammarMatcher& matcher() const;

 private:
  // Steps the matcher over the recorded token, if any.
  void advance() const;

  mutable GrammarMatcher matcher_;
  mutable std::optional<Token> pending_;
  mutable bool failed_ = false;
};

}  // namespace cellm

namespace cellm {

// Tool calls for constrained decoding (tool_choice "required" or a named
// function): the text of one or more calls, each a JSON object
//   {"name": "<one of the functions>", "<arguments_key>": <arguments>}
// written compactly up to the arguments, whose value follows that function's
// parameters schema (as compile_json_schema). The syntax gives the literal text
// around the calls: prefix, then each call as call_open + object + call_close,
// `separator` between calls, then suffix. E.g. Hermes: call_open "<tool_call>\n",
// call_close "\n</tool_call>", separator "\n"; Mistral: prefix "[TOOL_CALLS][",
// separator ", ", suffix "]"; Llama 3: arguments_key "parameters", separator "; ".
struct ToolCallSyntax {
  std::string prefix;
  std::string call_open;
  std::string call_close;
  std::string separator;
  std::string suffix;
  std::string arguments_key = "arguments";
};

// A function a call may name, with its parameters schema (JSON text).
struct ToolCallSchema {
  std::string name;
  std::string parameters_schema;
};

// One call (allow_many false) or one or more, to one of `functions` (non-empty,
// names distinct). Errors name the function whose schema does not compile.
Result<Grammar> compile_tool_calls(const ToolCallSyntax& syntax,
                                   std::span<const ToolCallSchema> functions, bool allow_many,
                                   const GrammarLimits& limits = {});

}  // namespace cellm
