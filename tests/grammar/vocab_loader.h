// Test support: a real vocabulary as token byte strings, read from a
// tokenizer.json (and the eos_token of tokenizer_config.json beside it).
// Byte-level BPE tokens (Llama 3, Qwen) map back through the GPT-2 byte alphabet;
// SentencePiece-style tokens (Llama 2) turn U+2581 into a space and <0xNN> into
// the byte. Special added tokens get empty bytes (never allowed by a grammar).
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "cellm/grammar.h"

namespace cellm::grammar_test {

inline std::string shared_tokenizer_dir(const std::string& name) {
  return std::string(CELLM_SHARED_DIR) + "/tokenizers/" + name;
}

// The GPT-2 byte-level alphabet: code point -> byte.
inline std::unordered_map<uint32_t, uint8_t> byte_level_decoding() {
  std::unordered_map<uint32_t, uint8_t> m;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    m[printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++)] =
        static_cast<uint8_t>(b);
  }
  return m;
}

inline std::vector<uint32_t> codepoints_of(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<uint8_t>(s[i]);
    const int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t v = n == 1 ? c : c & (0xFF >> (n + 1));
    for (int k = 1; k < n && i + k < s.size(); ++k) v = (v << 6) | (s[i + k] & 0x3F);
    out.push_back(v);
    i += n;
  }
  return out;
}

inline Result<TokenVocabulary> load_vocabulary(const std::string& dir) {
  std::ifstream in(dir + "/tokenizer.json");
  if (!in) return NotFound(dir + "/tokenizer.json");
  const nlohmann::json tok = nlohmann::json::parse(in, nullptr, false);
  if (tok.is_discarded()) return InvalidArgument(dir + "/tokenizer.json is not JSON");
  const auto& model = tok["model"];
  const bool byte_fallback = model.value("byte_fallback", false);
  const auto decoding = byte_level_decoding();
  std::vector<std::string> bytes;
  auto put = [&](size_t id, std::string b) {
    if (bytes.size() <= id) bytes.resize(id + 1);
    bytes[id] = std::move(b);
  };
  for (const auto& [text, id_json] : model["vocab"].items()) {
    const size_t id = id_json.get<size_t>();
    std::string b;
    if (byte_fallback) {
      if (text.size() == 6 && text.rfind("<0x", 0) == 0 && text[5] == '>') {
        b = std::string(1, static_cast<char>(std::stoi(text.substr(3, 2), nullptr, 16)));
      } else {
        for (uint32_t cp : codepoints_of(text)) {
          if (cp == 0x2581) {
            b += ' ';
          } else {
            std::string u;
            // Re-encode the code point.
            if (cp < 0x80) {
              u += static_cast<char>(cp);
            } else if (cp < 0x800) {
              u += static_cast<char>(0xC0 | (cp >> 6));
              u += static_cast<char>(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
              u += static_cast<char>(0xE0 | (cp >> 12));
              u += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
              u += static_cast<char>(0x80 | (cp & 0x3F));
            } else {
              u += static_cast<char>(0xF0 | (cp >> 18));
              u += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
              u += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
              u += static_cast<char>(0x80 | (cp & 0x3F));
            }
            b += u;
          }
        }
      }
    } else {
      for (uint32_t cp : codepoints_of(text)) {
        auto it = decoding.find(cp);
        if (it == decoding.end()) return InvalidArgument("token " + text + " is not byte-level");
        b += static_cast<char>(it->second);
      }
    }
    put(id, std::move(b));
  }
  std::unordered_map<std::string, Token> added;
  for (const auto& a : tok["added_tokens"]) {
    const size_t id = a["id"].get<size_t>();
    const std::string content = a["content"].get<std::string>();
    put(id, a.value("special", false) ? std::string() : content);
    added[content] = static_cast<Token>(id);
  }
  std::vector<Token> eos;
  std::ifstream cfg_in(dir + "/tokenizer_config.json");
  if (cfg_in) {
    const nlohmann::json cfg = nlohmann::json::parse(cfg_in, nullptr, false);
    if (!cfg.is_discarded() && cfg.contains("eos_token")) {
      const auto& e = cfg["eos_token"];
      const std::string name = e.is_string()   ? e.get<std::string>()
                               : e.is_object() ? e.value("content", std::string())
                                               : std::string();
      if (auto it = added.find(name); it != added.end()) eos.push_back(it->second);
    }
  }
  return TokenVocabulary::build(std::move(bytes), std::move(eos));
}

}  // namespace cellm::grammar_test
