// Tests of Tokenizer::token_bytes (the bytes a token adds mid-text, used by
// constrained decoding) on the real tokenizers in ../shared/tokenizers: byte-level
// BPE (llama3, qwen3) and SentencePiece-style with byte fallback (llama2). Skips
// when the shared folder is absent.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "cellm/tokenizer.h"

namespace cellm {
namespace {

namespace fs = std::filesystem;

std::optional<Tokenizer> load(const std::string& name) {
  const fs::path dir = fs::path(CELLM_SHARED_DIR) / "tokenizers" / name;
  if (!fs::exists(dir)) return std::nullopt;
  Result<Tokenizer> t = Tokenizer::load(dir.string());
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  if (!t.ok()) return std::nullopt;
  return *t;
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    }
    i += n;
  }
  return true;
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> texts = {
      "Hello, world!",
      "  leading spaces and trailing  ",
      "{\"name\": \"Ada\", \"age\": 36, \"tags\": [\"x\", \"y\"], \"ok\": true}",
      "line one\nline two\n\n\ttabbed",
      "naïve café — déjà vu, 東京タワー, Привет мир",
      "emoji: 😀🎉 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
      "def f(x):\n    return x ** 2  # square\n",
      "1234567890 3.14159 -42 1e-9",
      "In the beginning God created the heaven and the earth.",
      "<b>bold</b> & <i>tags</i> are plain text",
      "ok",
  };
  return texts;
}

// The bytes of every encoded text equal the concatenation of its tokens' bytes
// (a SentencePiece normalizer may add one leading space).
void expect_round_trip(const Tokenizer& tok, bool may_add_space) {
  for (const std::string& text : corpus()) {
    const std::vector<Token> ids = tok.encode(text, /*add_special_tokens=*/false);
    std::string bytes;
    for (Token id : ids) bytes += tok.token_bytes(id);
    if (may_add_space && bytes == " " + text) continue;
    EXPECT_EQ(bytes, text) << "text: " << text;
  }
}

// For every token whose bytes are whole UTF-8, decoding it alone gives them
// (modulo the leading space SentencePiece's decoder strips at the start).
void expect_matches_decode(const Tokenizer& tok, bool sentencepiece, size_t* checked) {
  for (size_t i = 0; i < tok.vocab_size(); ++i) {
    const auto id = static_cast<Token>(i);
    if (tok.is_special(id)) {
      EXPECT_EQ(tok.token_bytes(id), "") << "special id " << id;
      continue;
    }
    const std::string bytes = tok.token_bytes(id);
    if (bytes.empty() || !valid_utf8(bytes)) continue;
    const std::string decoded = tok.decode(std::vector<Token>{id});
    if (sentencepiece && bytes[0] == ' ' && decoded == bytes.substr(1)) {
      ++*checked;
      continue;
    }
    EXPECT_EQ(decoded, bytes) << "id " << id;
    if (decoded != bytes) return;  // one report is enough
    ++*checked;
  }
}

TEST(TokenBytes, Llama3ByteLevel) {
  std::optional<Tokenizer> tok = load("llama3");
  if (!tok) GTEST_SKIP() << "no ../shared/tokenizers/llama3";
  expect_round_trip(*tok, /*may_add_space=*/false);
  size_t checked = 0;
  expect_matches_decode(*tok, false, &checked);
  EXPECT_GT(checked, 100000u);
  // "Ġ" is a space; a token of one continuation byte gives that raw byte.
  EXPECT_EQ(tok->token_bytes(*tok->token_to_id("\xC4\xA0")), " ");
  EXPECT_EQ(tok->token_bytes(*tok->token_to_id("\xC4\x80")), std::string(1, '\0'));
  EXPECT_EQ(tok->token_bytes(*tok->token_to_id("<|eot_id|>")), "");
  EXPECT_EQ(tok->token_bytes(-1), "");
  EXPECT_EQ(tok->token_bytes(static_cast<Token>(tok->vocab_size())), "");
}

TEST(TokenBytes, Qwen3ByteLevel) {
  std::optional<Tokenizer> tok = load("qwen3");
  if (!tok) GTEST_SKIP() << "no ../shared/tokenizers/qwen3";
  expect_round_trip(*tok, /*may_add_space=*/false);
  size_t checked = 0;
  expect_matches_decode(*tok, false, &checked);
  EXPECT_GT(checked, 100000u);
  EXPECT_EQ(tok->token_bytes(*tok->token_to_id("<|im_end|>")), "");
  // A normal (non-special) added token gives its content.
  const std::optional<Token> think = tok->token_to_id("<think>");
  ASSERT_TRUE(think.has_value());
  ASSERT_FALSE(tok->is_special(*think));
  EXPECT_EQ(tok->token_bytes(*think), "<think>");
}

TEST(TokenBytes, Llama2SentencePieceByteFallback) {
  std::optional<Tokenizer> tok = load("llama2");
  if (!tok) GTEST_SKIP() << "no ../shared/tokenizers/llama2";
  expect_round_trip(*tok, /*may_add_space=*/true);
  size_t checked = 0;
  expect_matches_decode(*tok, true, &checked);
  EXPECT_GT(checked, 20000u);
  // "▁the" is " the" mid-text; byte-fallback pieces give their byte.
  EXPECT_EQ(tok->token_bytes(*tok->token_to_id("\xE2\x96\x81the")), " the");
  for (int b : {0x00, 0x0A, 0x41, 0x7F, 0x80, 0xC3, 0xE2, 0xFF}) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    const std::optional<Token> id = tok->token_to_id(name);
    ASSERT_TRUE(id.has_value()) << name;
    EXPECT_EQ(tok->token_bytes(*id), std::string(1, static_cast<char>(b))) << name;
  }
  EXPECT_EQ(tok->token_bytes(*tok->bos_id()), "");
  for (Token eos : tok->eos_ids()) EXPECT_EQ(tok->token_bytes(eos), "");
  // A character the vocabulary spells only in bytes (a rare CJK ideograph).
  const std::string rare = "\xF0\xA0\x80\x80";  // U+20000
  std::string bytes;
  for (Token id : tok->encode(rare, false)) bytes += tok->token_bytes(id);
  EXPECT_TRUE(bytes == rare || bytes == " " + rare) << bytes;
}

}  // namespace
}  // namespace cellm
