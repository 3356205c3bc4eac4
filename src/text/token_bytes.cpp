// Tokenizer::token_bytes: the bytes one token contributes mid-text. The decoder
// chain of tokenizer.json works on whole texts (it repairs invalid UTF-8 and
// strips the start), so a token's own bytes are found by asking the chain how it
// treats a few probe tokens, then mapping the token the same way without repair.
#include <optional>
#include <string>
#include <vector>

#include "cellm/tokenizer.h"
#include "tokenizer_impl.h"
#include "unicode.h"

namespace cellm {
namespace {

// What the decoder does to a single token in the middle of a text.
std::string decode_mid_text(const TokenDecoder* decoder, std::string token) {
  DecodeState state;
  state.at_first_token = false;  // no Metaspace drop of the first replacement
  state.text_started = true;     // no Strip of the start of the whole text
  state.apply_trailing_strip = false;
  std::vector<std::string> tokens{std::move(token)};
  if (decoder == nullptr) return tokens[0];
  decoder->decode_chain(tokens, state);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

// The byte of a "<0xNN>" piece (uppercase or lowercase hex digits).
std::optional<uint8_t> byte_fallback_value(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return std::nullopt;
  int value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = token[i];
    int digit = 0;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return std::nullopt;
    }
    value = value * 16 + digit;
  }
  return static_cast<uint8_t>(value);
}

// The raw bytes behind a token spelled in GPT-2's byte alphabet, or nullopt when
// a character lies outside it (the decoder then keeps the token's own bytes).
std::optional<std::string> byte_level_bytes(const std::string& token) {
  std::string bytes;
  for (size_t i = 0; i < token.size();) {
    const unicode::Utf8Unit u = unicode::decode_utf8(token, i);
    const std::optional<uint8_t> b = u.valid ? unicode::char_to_byte(u.code_point) : std::nullopt;
    if (!b) return std::nullopt;
    bytes.push_back(static_cast<char>(*b));
    i += u.size_bytes;
  }
  return bytes;
}

}  // namespace

std::string Tokenizer::token_bytes(Token id) const {
  const Impl& impl = *impl_;
  if (const AddedToken* added_token = impl.added.find(id)) {
    return added_token->special ? std::string() : added_token->content;
  }
  const std::string* token = impl.model.id_to_token(id);
  if (token == nullptr) return std::string();
  const TokenDecoder* decoder = impl.decoder.get();
  // Probes: "Ġ" is GPT-2's alphabet for a space (a byte-level decoder maps it);
  // "<0x41>" is 'A' under a byte-fallback decoder.
  const bool byte_level = decoder != nullptr && decode_mid_text(decoder, "\xC4\xA0") == " ";
  if (byte_level) {
    if (std::optional<std::string> bytes = byte_level_bytes(*token)) return *bytes;
    return *token;
  }
  if (std::optional<uint8_t> b = byte_fallback_value(*token)) {
    if (decoder != nullptr && decode_mid_text(decoder, "<0x41>") == "A") {
      return std::string(1, static_cast<char>(*b));
    }
  }
  return decode_mid_text(decoder, *token);
}

}  // namespace cellm
