// Structured outputs and sampling controls of `cellm serve`: the request's
// constraint (response_format, vLLM's guided_* and structured_outputs) compiled
// into a grammar, and its penalties (presence/frequency/repetition, logit_bias,
// min_tokens, stop_token_ids), turned into one LogitsProcessor per choice
// (cellm/logits_processor.h) that the runner applies before sampling.
//
// What it owns, process-wide and thread-safe:
//   - the served model's byte vocabulary (Tokenizer::token_bytes, EOS ids),
//     built once at first use and shared by every request;
//   - a small LRU of compiled grammars keyed by (kind, text), bounded in entries
//     and bytes; each entry keeps a "family" matcher whose forks give every
//     choice its own position while sharing the per-state mask cache (each
//     family's caches are bounded by GrammarLimits::max_matcher_bytes).
//
// request.cpp only parses these fields (it stays free of the grammar layer);
// everything that compiles or needs the vocabulary lives here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cellm/grammar.h"
#include "cellm/logits_processor.h"
#include "cellm/serve.h"
#include "cellm/status.h"
#include "cellm/tokenizer.h"
#include "serve/api_error.h"
#include "serve/request.h"

namespace cellm::cli {

// The byte vocabulary of `tokenizer`'s model: token_bytes of every id, the
// tokenizer's EOS ids as eos_ids. Built on the first call for a tokenizer and
// cached (thread-safe; later calls return the shared handle).
Result<TokenVocabulary> served_vocabulary(const Tokenizer& tokenizer);

// A processor for one generation constrained by `grammar` (a fresh matcher at its
// start) over the served vocabulary. InvalidArgument when the model declares no
// EOS token (a constrained generation could never end).
Result<std::shared_ptr<LogitsProcessor>> make_grammar_processor_for(const Grammar& grammar,
                                                                    const Tokenizer& tokenizer);

// A compiled constraint from the LRU (compiled on a miss): `field` names the
// request field in the 400 a compile error gives.
ApiResult<Grammar> cached_grammar(const StructuredConstraint& constraint);

// Makes each choice's processor for `spec` from the request's structured fields:
// validates them against the vocabulary and max_tokens, compiles the constraint,
// adds stop_token_ids to spec.stop_tokens and sets spec.processor_for (left empty
// when nothing is asked): each choice gets its own matcher (a fork) chained with
// its own penalty processor. `grammar`, when given, is a constraint the request
// implies by other fields (tool_choice): it is used as the constraint, and a
// request that also sets one of the structured-output fields gets 400.
// REQUIRES: spec.prompt, spec.max_tokens and spec.stop_tokens (EOS) already set.
// A 400 names the field.
std::optional<ApiError> attach_logits_processing(const Tokenizer& tokenizer,
                                                 const GenerationFields& fields,
                                                 serve::JobSpec& spec,
                                                 const Grammar* grammar = nullptr);

}  // namespace cellm::cli
