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
// decoding it whole. The end of the whole text (Strip's `stop` after Fuse) is
// left to the streamer: with apply_trailing_strip unset, the stage skips it and
// trailing_strip() says what to hold back and cut at the very end. Immutable after parsing; safe to
// share between threads.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "cellm/status.h"

namespace cellm {

struct DecodeState {
  bool at_first_token = true;        // no token decoded yet
  bool text_started = false;         // a fused text before Strip was non-empty
  bool apply_trailing_strip = true;  // input: these tokens end the whole text
};

// Up to max_chars trailing `content` characters that the decoder cuts from the
// end of the whole text.
struct TrailingStrip {
  char32_t content = 0;
  size_t max_chars = 0;
};

class TokenDecoder {
 public:
  virtual ~TokenDecoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens, DecodeState& state) const = 0;
  // Set when a Strip after Fuse cuts the end of the whole text.
  virtual std::optional<TrailingStrip> trailing_strip() const { return std::nullopt; }
};

// The decoder described by `j`, or nullptr for JSON null.
Result<std::unique_ptr<const TokenDecoder>> parse_decoder(const nlohmann::json& j);

// Runs `decoder` (or joins with no decoder) and advances `state`.
std::string decode_tokens(const TokenDecoder* decoder, std::vector<std::string> tokens,
                          DecodeState& state);

}  // namespace cellm
