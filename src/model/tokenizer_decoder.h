// Decoders of tokenizer.json: turn a list of token strings back into text.
//
// Supported: ByteLevel, ByteFallback, Replace, Fuse, Strip, Metaspace and
// Sequence. Each stage maps the token list to a new list, as Hugging Face's
// decode_chain; the result is the concatenation.
//
// Streaming: a DecodeState carries what the stages that look at the start of
// the text need (Metaspace drops the replacement in the first token; Strip after
// Fuse strips the start of the whole text), so that decoding a sequence in
// consecutive segments, each ending on complete UTF-8, yields the same text as
// decoding it whole. Immutable after parsing; safe to share between threads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "cellm/status.h"

namespace cellm {

struct DecodeState {
  bool at_first_token = true;  // no token decoded yet
  bool text_started = false;   // a fused text before Strip was non-empty
};

class TokenDecoder {
 public:
  virtual ~TokenDecoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens, DecodeState& state) const = 0;
};

// The decoder described by `j`, or nullptr for JSON null.
Result<std::unique_ptr<const TokenDecoder>> parse_decoder(const nlohmann::json& j);

// Runs `decoder` (or joins with no decoder) and advances `state`.
std::string decode_tokens(const TokenDecoder* decoder, std::vector<std::string> tokens,
                          DecodeState& state);

}  // namespace cellm
