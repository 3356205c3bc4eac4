#include "tokenizer_decoder.h"

#include <nlohmann/json.hpp>

#include "regex.h"
#include "unicode.h"

namespace cellm {
namespace {

using Ptr = std::unique_ptr<const TokenDecoder>;

// Maps GPT-2's byte alphabet back to bytes across all tokens, then repairs
// invalid UTF-8 with U+FFFD. A token with a character outside the alphabet
// contributes its own bytes.
class ByteLevelDecoder final : public TokenDecoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, DecodeState&) const override {
    std::string bytes;
    for (const std::string& token : tokens) {
      std::string mapped;
      bool all_mapped = true;
      for (size_t i = 0; i < token.size();) {
        const unicode::Utf8Unit u = unicode::decode_utf8(token, i);
        const std::optional<uint8_t> b =
            u.valid ? unicode::char_to_byte(u.code_point) : std::nullopt;
        if (!b) {
          all_mapped = false;
          break;
        }
        mapped.push_back(static_cast<char>(*b));
        i += u.size_bytes;
      }
      bytes.append(all_mapped ? mapped : token);
    }
    tokens.assign(1, unicode::to_valid_utf8_lossy(bytes));
  }
};

// Turns runs of <0xNN> tokens into text; a run that is not valid UTF-8 becomes
// one U+FFFD per byte.
class ByteFallbackDecoder final : public TokenDecoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, DecodeState&) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string run;
    const auto flush = [&] {
      if (run.empty()) return;
      if (unicode::is_valid_utf8(run)) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      run.clear();
    };
    for (std::string& token : tokens) {
      if (std::optional<uint8_t> b = parse_byte(token)) {
        run.push_back(static_cast<char>(*b));
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    tokens = std::move(out);
  }

 private:
  static std::optional<uint8_t> parse_byte(const std::string& token) {
    if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') {
      return std::nullopt;
    }
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
};

class ReplaceDecoder final : public TokenDecoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens, DecodeState&) const override {
    for (std::string& token : tokens) {
      std::string out;
      size_t copied = 0;
      for (const Match& m : pattern_.find_all(token)) {
        out.append(token, copied, m.begin - copied).append(content_);
        copied = m.end;
      }
      out.append(token, copied);
      token = std::move(out);
    }
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class FuseDecoder final : public TokenDecoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, DecodeState&) const override {
    std::string fused;
    for (const std::string& token : tokens) fused += token;
    tokens.assign(1, std::move(fused));
  }
};

// Removes up to `start` leading and `stop` trailing `content` characters of each
// token. After Fuse (one token: the whole text) the start is stripped only at
// the start of the whole text.
class StripDecoder final : public TokenDecoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop, bool fused)
      : content_(content), start_(start), stop_(stop), fused_(fused) {}
  void decode_chain(std::vector<std::string>& tokens, DecodeState& state) const override {
    for (std::string& token : tokens) {
      std::vector<std::pair<size_t, char32_t>> chars;  // (byte offset, code point)
      for (size_t i = 0; i < token.size();) {
        const unicode::Utf8Unit u = unicode::decode_utf8(token, i);
        chars.emplace_back(i, u.valid ? u.code_point : unicode::kReplacementCharacter);
        i += u.size_bytes;
      }
      const bool strip_start = !fused_ || !state.text_started;
      if (fused_ && !token.empty()) state.text_started = true;
      size_t first = 0;
      if (strip_start) {
        while (first < start_ && first < chars.size() && chars[first].second == content_) ++first;
      }
      size_t last = chars.size();
      const size_t stop = (!fused_ || state.apply_trailing_strip) ? stop_ : 0;
      for (size_t n = 0; n < stop && last > first && chars[last - 1].second == content_; ++n) {
        --last;
      }
      const size_t begin_byte = first < chars.size() ? chars[first].first : token.size();
      const size_t end_byte = last < chars.size() ? chars[last].first : token.size();
      token = token.substr(begin_byte, end_byte - begin_byte);
    }
  }
  std::optional<TrailingStrip> trailing_strip() const override {
    if (!fused_ || stop_ == 0) return std::nullopt;
    return TrailingStrip{content_, stop_};
  }

 private:
  char32_t content_;
  size_t start_;
  size_t stop_;
  bool fused_;
};

// Replacement characters become spaces, except in the very first token unless
// prepend_scheme is "never", where they are dropped.
class MetaspaceDecoder final : public TokenDecoder {
 public:
  MetaspaceDecoder(std::string replacement, bool drop_in_first)
      : replacement_(std::move(replacement)), drop_in_first_(drop_in_first) {}
  void decode_chain(std::vector<std::string>& tokens, DecodeState& state) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const bool first = i == 0 && state.at_first_token;
      std::string out;
      const std::string& token = tokens[i];
      for (size_t at = 0; at < token.size();) {
        if (!replacement_.empty() && token.compare(at, replacement_.size(), replacement_) == 0) {
          if (!(first && drop_in_first_)) out.push_back(' ');
          at += replacement_.size();
        } else {
          out.push_back(token[at++]);
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool drop_in_first_;
};

class SequenceDecoder final : public TokenDecoder {
 public:
  explicit SequenceDecoder(std::vector<Ptr> parts) : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens, DecodeState& state) const override {
    for (const auto& part : parts_) part->decode_chain(tokens, state);
  }
  std::optional<TrailingStrip> trailing_strip() const override {
    std::optional<TrailingStrip> last;
    for (const auto& part : parts_) {
      if (std::optional<TrailingStrip> s = part->trailing_strip()) last = s;
    }
    return last;
  }

 private:
  std::vector<Ptr> parts_;
};

// `fused`: an earlier stage has already joined the tokens into one.
Result<Ptr> parse(const nlohmann::json& j, bool& fused) {
  const std::string type = j.at("type").get<std::string>();
  if (type == "ByteLevel") {
    fused = true;
    return Ptr(new ByteLevelDecoder());
  }
  if (type == "ByteFallback") return Ptr(new ByteFallbackDecoder());
  if (type == "Fuse") {
    fused = true;
    return Ptr(new FuseDecoder());
  }
  if (type == "Replace") {
    CELLM_ASSIGN_OR_RETURN(Pattern pattern, Pattern::parse(j.at("pattern")));
    return Ptr(new ReplaceDecoder(std::move(pattern), j.at("content").get<std::string>()));
  }
  if (type == "Strip") {
    const std::string content = j.at("content").get<std::string>();
    const unicode::Utf8Unit u =
        content.empty() ? unicode::Utf8Unit{} : unicode::decode_utf8(content, 0);
    if (!u.valid || u.size_bytes != content.size()) {
      return InvalidProgram("Strip decoder content must be one character, not '" + content + "'");
    }
    // Counts of characters: a negative, fractional or huge number is refused by name
    // (converting one to size_t is undefined).
    size_t counts[2] = {0, 0};
    const char* const keys[2] = {"start", "stop"};
    for (int i = 0; i < 2; ++i) {
      const nlohmann::json& v = j.at(keys[i]);
      // is_number_integer covers both signed and unsigned storage: a built program
      // (the GGUF tokenizer's) holds 1 as a signed integer.
      if (!v.is_number_integer() || v.get<int64_t>() < 0) {
        return InvalidProgram(std::string("Strip decoder '") + keys[i] +
                              "' must be a non-negative integer, not a " + v.type_name() +
                              (v.is_number() ? " " + v.dump() : std::string()));
      }
      counts[i] = v.get<size_t>();
    }
    return Ptr(new StripDecoder(u.code_point, counts[0], counts[1], fused));
  }
  if (type == "Metaspace") {
    bool drop_in_first = j.value("add_prefix_space", true);
    if (j.contains("prepend_scheme")) drop_in_first = j.at("prepend_scheme") != "never";
    return Ptr(new MetaspaceDecoder(j.value("replacement", std::string("\u2581")), drop_in_first));
  }
  if (type == "Sequence") {
    std::vector<Ptr> parts;
    for (const nlohmann::json& part : j.at("decoders")) {
      CELLM_ASSIGN_OR_RETURN(Ptr p, parse(part, fused));
      parts.push_back(std::move(p));
    }
    return Ptr(new SequenceDecoder(std::move(parts)));
  }
  return NotSupported("decoder type '" + type + "' is not supported");
}

}  // namespace

Result<Ptr> parse_decoder(const nlohmann::json& j) {
  if (j.is_null()) return Ptr();
  bool fused = false;
  return parse(j, fused);
}

std::string decode_tokens(const TokenDecoder* decoder, std::vector<std::string> tokens,
                          DecodeState& state) {
  const bool any = !tokens.empty();
  std::string text;
  if (decoder == nullptr) {
    // Hugging Face joins with spaces when there is no decoder.
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0 || (!state.at_first_token && any)) text += ' ';
      text += tokens[i];
    }
  } else {
    decoder->decode_chain(tokens, state);
    for (const std::string& t : tokens) text += t;
  }
  if (any) state.at_first_token = false;
  return text;
}

}  // namespace cellm
