// Constrained decoding of tool calls for the chat endpoint: tool_choice
// "required" and a named function become a grammar (cellm/chat_output.h) that
// every choice follows, so even a weak model answers with a well-formed call.
#pragma once

#include <optional>

#include "cellm/chat_output.h"
#include "cellm/grammar.h"
#include "cellm/tokenizer.h"
#include "serve/api_error.h"
#include "serve/chat_request.h"

namespace cellm::cli {

// For tool_choice "required" or a named function: the grammar every choice then
// follows (attach_logits_processing installs it): a call in `format` (with
// "required" and parallel calls allowed, one or more) naming an allowed function,
// with arguments valid against its parameters schema. nullopt for "auto" and
// "none". A 400 names the tool whose schema cannot be compiled.
//
// Markers that are special tokens: a grammar only produces tokens by their bytes,
// and special tokens have none. Hermes' <tool_call> is generated as text (ordinary
// tokens spell it when the tokenizer's own token for it is special; decoding skips
// special tokens, so the parser needs the text). Mistral's [TOOL_CALLS], when it is
// a special token, is left out and the grammar starts at the call array, which the
// parser accepts at the start of a reply. Llama 3 calls have no marker.
ApiResult<std::optional<Grammar>> tool_choice_grammar(const Tokenizer& tokenizer,
                                                      const ChatConversation& conversation,
                                                      std::optional<serve::ToolCallFormat> format);

}  // namespace cellm::cli
