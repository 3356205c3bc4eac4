#include "serve/structured.h"

#include <algorithm>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <utility>

namespace cellm::cli {
namespace {

// Bounds of the compiled-grammar cache: entries, and bytes counted as the
// constraint's text plus its compiled rules written out (a proxy for the IR),
// plus for each family matcher the most its caches may hold
// (GrammarLimits::max_matcher_bytes), so that what the cache keeps alive is
// bounded even when every family's mask cache is full.
constexpr size_t kMaxCachedGrammars = 32;
constexpr size_t kMaxCachedGrammarBytes = size_t{512} << 20;
// Vocabularies of distinct tokenizers kept (a server serves one model).
constexpr size_t kMaxCachedVocabularies = 4;

struct VocabularyEntry {
  Tokenizer tokenizer;  // kept alive, so its identity is never reused
  TokenVocabulary vocab;
};

std::mutex& vocab_mu() {
  static std::mutex mu;
  return mu;
}
std::list<VocabularyEntry>& vocab_cache() {
  static std::list<VocabularyEntry> cache;
  return cache;
}

// A compiled constraint and the family matcher its choices fork from.
struct GrammarEntry {
  std::string key;
  Grammar grammar;
  size_t bytes = 0;
  // Per vocabulary: the family matcher at the start (forks share its caches).
  // Guarded by the cache mutex.
  std::vector<std::pair<TokenVocabulary, std::shared_ptr<GrammarMatcher>>> families;
};

struct GrammarCache {
  std::mutex mu;
  std::list<GrammarEntry> entries;  // most recently used first; guarded by mu
  size_t bytes = 0;                 // guarded by mu
};

GrammarCache& grammar_cache() {
  static GrammarCache cache;
  return cache;
}

std::string cache_key(const StructuredConstraint& c) {
  switch (c.kind) {
    case ConstraintKind::kJsonSchema:
      return "json_schema\n" + c.text;
    case ConstraintKind::kJsonObject:
      return "json_object\n";
    case ConstraintKind::kRegex:
      return "regex\n" + c.text;
    case ConstraintKind::kChoice:
      return "choice\n" + nlohmann::json(c.choices).dump();
    case ConstraintKind::kGbnf:
      return "gbnf\n" + c.text;
  }
  return "";
}

Result<Grammar> compile(const StructuredConstraint& c) {
  switch (c.kind) {
    case ConstraintKind::kJsonSchema:
      return compile_json_schema(c.text);
    case ConstraintKind::kJsonObject:
      return compile_json_object();
    case ConstraintKind::kRegex:
      return compile_regex(c.text);
    case ConstraintKind::kChoice:
      return compile_choice(c.choices);
    case ConstraintKind::kGbnf:
      return compile_gbnf(c.text);
  }
  return InvalidArgument("unknown constraint kind");
}

// Drops the least recently used entries beyond the bounds, never the front one
// (in use). Forks already given out keep their shared caches alive.
// REQUIRES: cache.mu held.
void evict_locked(GrammarCache& cache) {
  while (cache.entries.size() > 1 &&
         (cache.entries.size() > kMaxCachedGrammars || cache.bytes > kMaxCachedGrammarBytes)) {
    cache.bytes -= cache.entries.back().bytes;
    cache.entries.pop_back();
  }
}

// Moves `it` to the front and returns the entry.
GrammarEntry& touch(GrammarCache& cache, std::list<GrammarEntry>::iterator it) {
  cache.entries.splice(cache.entries.begin(), cache.entries, it);
  return cache.entries.front();
}

// The cached entry for `c` (compiled and inserted on a miss), or the compile error.
// REQUIRES: cache.mu held.
Result<GrammarEntry*> lookup_locked(GrammarCache& cache, const StructuredConstraint& c) {
  const std::string key = cache_key(c);
  for (auto it = cache.entries.begin(); it != cache.entries.end(); ++it) {
    if (it->key == key) return &touch(cache, it);
  }
  CELLM_ASSIGN_OR_RETURN(Grammar grammar, compile(c));
  GrammarEntry entry{key, grammar, key.size() + grammar.to_gbnf().size(), {}};
  cache.bytes += entry.bytes;
  cache.entries.push_front(std::move(entry));
  evict_locked(cache);
  return &cache.entries.front();
}

// A fresh matcher at the start of the grammar of `entry` (the most recently used
// entry) over `vocab`: a fork of the entry's family matcher for that vocabulary.
// REQUIRES: the cache mutex held; entry is cache.entries.front().
GrammarMatcher fork_locked(GrammarCache& cache, GrammarEntry& entry, const TokenVocabulary& vocab) {
  const GrammarLimits limits;
  bool counted = false;  // the vocabulary's family is already in the byte counts
  for (auto it = entry.families.begin(); it != entry.families.end(); ++it) {
    if (&it->first.impl() != &vocab.impl()) continue;
    if (it->second->status().ok()) return it->second->fork();
    // A family past its budget fails every fork; later requests start afresh
    // (the generations holding the old one keep it alive until they end).
    entry.families.erase(it);
    counted = true;
    break;
  }
  auto family = std::make_shared<GrammarMatcher>(entry.grammar, vocab, limits);
  entry.families.emplace_back(vocab, family);
  if (!counted) {
    entry.bytes += limits.max_matcher_bytes;
    cache.bytes += limits.max_matcher_bytes;
  }
  GrammarMatcher fork = family->fork();
  evict_locked(cache);
  return fork;
}

ApiError compile_error(const StructuredConstraint& c, const Status& status) {
  return invalid_field(c.field, "'" + c.field + "' does not compile: " + status.message());
}

}  // namespace

Result<TokenVocabulary> served_vocabulary(const Tokenizer& tokenizer) {
  std::lock_guard<std::mutex> lock(vocab_mu());
  std::list<VocabularyEntry>& cache = vocab_cache();
  for (auto it = cache.begin(); it != cache.end(); ++it) {
    if (it->tokenizer.shares_state_with(tokenizer)) {
      cache.splice(cache.begin(), cache, it);
      return cache.front().vocab;
    }
  }
  std::vector<std::string> bytes(tokenizer.vocab_size());
  for (size_t id = 0; id < bytes.size(); ++id)
    bytes[id] = tokenizer.token_bytes(static_cast<Token>(id));
  CELLM_ASSIGN_OR_RETURN(TokenVocabulary vocab,
                         TokenVocabulary::build(std::move(bytes), tokenizer.eos_ids()));
  cache.push_front(VocabularyEntry{tokenizer, vocab});
  if (cache.size() > kMaxCachedVocabularies) cache.pop_back();
  return vocab;
}

Result<std::shared_ptr<LogitsProcessor>> make_grammar_processor_for(const Grammar& grammar,
                                                                    const Tokenizer& tokenizer) {
  if (tokenizer.eos_ids().empty()) {
    return InvalidArgument(
        "the model declares no EOS token, so a constrained generation could not end");
  }
  CELLM_ASSIGN_OR_RETURN(TokenVocabulary vocab, served_vocabulary(tokenizer));
  return std::shared_ptr<LogitsProcessor>(
      std::make_shared<GrammarLogitsProcessor>(GrammarMatcher(grammar, vocab)));
}

ApiResult<Grammar> cached_grammar(const StructuredConstraint& constraint) {
  GrammarCache& cache = grammar_cache();
  std::lock_guard<std::mutex> lock(cache.mu);
  Result<GrammarEntry*> entry = lookup_locked(cache, constraint);
  if (!entry.ok()) return compile_error(constraint, entry.status());
  return (*entry)->grammar;
}

std::optional<ApiError> attach_logits_processing(const Tokenizer& tokenizer,
                                                 const GenerationFields& fields,
                                                 serve::JobSpec& spec, const Grammar* grammar) {
  for (Token id : fields.stop_token_ids) {
    if (std::find(spec.stop_tokens.begin(), spec.stop_tokens.end(), id) == spec.stop_tokens.end()) {
      spec.stop_tokens.push_back(id);
    }
  }
  PenaltyParams penalties = fields.penalties;
  if (penalties.min_tokens > spec.max_tokens) {
    return invalid_field("min_tokens", "'min_tokens' (" + std::to_string(penalties.min_tokens) +
                                           ") must not exceed 'max_tokens' (" +
                                           std::to_string(spec.max_tokens) + ")");
  }
  penalties.stop_tokens = spec.stop_tokens;
  // The request parser checked every id against the model's vocabulary, which may
  // be larger than the tokenizer's (padded rows); what is left to check here is
  // the values.
  auto vocab_size = static_cast<int32_t>(tokenizer.vocab_size());
  for (const auto& [id, bias] : penalties.logit_bias) vocab_size = std::max(vocab_size, id + 1);
  for (Token id : penalties.stop_tokens) vocab_size = std::max(vocab_size, id + 1);
  if (Status s = validate_penalties(penalties, vocab_size); !s.ok()) {
    return invalid_field("", s.message());
  }
  const bool with_penalties = !penalties_are_neutral(penalties);

  std::shared_ptr<GrammarMatcher> family;  // the cached family this request forks from
  std::shared_ptr<std::mutex> family_mu;
  if (fields.constraint && grammar != nullptr) {
    return invalid_field(fields.constraint->field,
                         "'" + fields.constraint->field +
                             "' cannot be combined with a constraint the request already implies "
                             "(tool_choice)");
  }
  if (fields.constraint || grammar != nullptr) {
    StructuredConstraint given;
    given.field = "tool_choice";
    const StructuredConstraint& c = fields.constraint ? *fields.constraint : given;
    if (fields.ignore_eos) {
      return invalid_field("ignore_eos", "'ignore_eos' cannot be combined with '" + c.field +
                                             "': a constrained output ends with EOS");
    }
    if (penalties.min_tokens > 0) {
      return invalid_field("min_tokens", "'min_tokens' cannot be combined with '" + c.field +
                                             "': the grammar decides where the output ends");
    }
    if (tokenizer.eos_ids().empty()) {
      return invalid_field(c.field, "this model declares no EOS token, so '" + c.field +
                                        "' could not end its output");
    }
    Result<TokenVocabulary> vocab = served_vocabulary(tokenizer);
    if (!vocab.ok()) {
      return ApiError{500,
                      "the model's vocabulary cannot be used for constrained decoding: " +
                          vocab.status().message(),
                      "server_error", c.field, ""};
    }
    if (grammar != nullptr) {
      family = std::make_shared<GrammarMatcher>(*grammar, *vocab);
    } else {
      GrammarCache& cache = grammar_cache();
      std::lock_guard<std::mutex> lock(cache.mu);
      Result<GrammarEntry*> entry = lookup_locked(cache, c);
      if (!entry.ok()) return compile_error(c, entry.status());
      // A matcher at the start, private to this request, sharing the cached
      // family's mask cache.
      family = std::make_shared<GrammarMatcher>(fork_locked(cache, **entry, *vocab));
    }
    // Each choice forks the request's matcher under this lock (fork() is not
    // documented as safe against concurrent forks of one matcher).
    family_mu = std::make_shared<std::mutex>();
  }
  if (!family && !with_penalties) return std::nullopt;

  const std::vector<Token> prompt = spec.prompt;
  spec.processor_for = [family, family_mu, penalties, with_penalties,
                        prompt](int32_t) -> std::shared_ptr<LogitsProcessor> {
    std::vector<std::unique_ptr<LogitsProcessor>> parts;
    if (family) {
      std::lock_guard<std::mutex> lock(*family_mu);
      parts.push_back(std::make_unique<GrammarLogitsProcessor>(family->fork()));
    }
    if (with_penalties) parts.push_back(make_penalty_processor(penalties, prompt));
    if (parts.size() == 1) return std::shared_ptr<LogitsProcessor>(std::move(parts[0]));
    return std::shared_ptr<LogitsProcessor>(chain_logits_processors(std::move(parts)));
  };
  return std::nullopt;
}

}  // namespace cellm::cli
