// Tokenizer::from_gguf against Hugging Face's ids: each real tokenizer of
// ../shared/tokenizers is written as the tokenizer.ggml.* fields llama.cpp's
// converter would write for it (tokens by id, token types, gpt2 merges or
// SentencePiece scores, special ids), and the tokenizer built from those fields
// must encode and decode the tokenizer test corpus (tests/fixtures/tokenizer/<name>.json,
// made by the `tokenizers` library from tokenizer.json) exactly as the reference did.
// Plus the errors of inconsistent fields. GGUF files themselves: tests/model/gguf_engine_test.cpp.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "cellm/tokenizer.h"

namespace cellm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json read_json(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return json::parse(buffer.str());
}

fs::path shared_tokenizer(const std::string& name) {
  return fs::path(CELLM_SHARED_DIR) / "tokenizers" / name / "tokenizer.json";
}

bool is_byte_token(const std::string& t) {
  return t.size() == 6 && t.starts_with("<0x") && t.back() == '>';
}

// The converter's view of tokenizer.json `j`: model "llama" (SentencePiece, with
// scores that rank the pieces as the merges do) or "gpt2" with `pre`.
GgufVocab vocab_of(const json& j, const std::string& model, const std::string& pre, bool add_bos) {
  GgufVocab v;
  v.model = model;
  v.pre = pre;
  const json& vocab = j.at("model").at("vocab");
  size_t size = vocab.size();
  for (const json& a : j.at("added_tokens")) size = std::max(size, a.at("id").get<size_t>() + 1);
  v.tokens.resize(size);
  v.token_types.assign(size, 5);  // unused, until a token fills the id
  if (model == "llama") v.scores.assign(size, 0.0f);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const auto id = it.value().get<size_t>();
    v.tokens[id] = it.key();
    v.token_types[id] = model == "llama" && is_byte_token(it.key()) ? 6 : 1;
  }
  if (model == "llama") {
    // tokenizer.model's scores order the pieces; Hugging Face's merges were ranked by
    // them, so the rank of the first merge making a piece stands for its score.
    std::unordered_map<std::string, size_t> first_rank;
    size_t rank = 0;
    for (const json& m : j.at("model").at("merges")) {
      const std::string merge = m.is_string()
                                    ? m.get<std::string>()
                                    : m[0].get<std::string>() + " " + m[1].get<std::string>();
      std::string piece = merge;
      piece.erase(piece.find(' '), 1);
      first_rank.emplace(piece, rank++);
    }
    for (size_t id = 0; id < size; ++id) {
      if (v.token_types[id] != 1) continue;
      const auto it = first_rank.find(v.tokens[id]);
      v.scores[id] = -static_cast<float>(it != first_rank.end() ? it->second : 1000000 + id);
    }
  }
  for (const json& a : j.at("added_tokens")) {
    const auto id = a.at("id").get<size_t>();
    const std::string content = a.at("content").get<std::string>();
    v.tokens[id] = content;
    v.token_types[id] = a.at("special").get<bool>() ? 3 : 4;
    if (content == "<unk>") {
      v.token_types[id] = 2;
      v.unk_id = static_cast<Token>(id);
    }
  }
  for (size_t i = 0; i < size; ++i) {
    if (v.token_types[i] == 5) v.tokens[i] = "[PAD" + std::to_string(i) + "]";
  }
  if (model == "gpt2") {
    for (const json& m : j.at("model").at("merges")) {
      v.merges.push_back(m.is_string() ? m.get<std::string>()
                                       : m[0].get<std::string>() + " " + m[1].get<std::string>());
    }
  }
  v.add_bos = add_bos;
  return v;
}

struct Case {
  std::string text;
  std::vector<Token> ids;
  std::vector<Token> ids_plain;
  std::string decoded;
  std::string decoded_skip;
};

std::vector<Case> reference_cases(const std::string& name) {
  const json doc =
      read_json(fs::path(CELLM_SOURCE_DIR) / "tests" / "fixtures" / "tokenizer" / (name + ".json"));
  std::vector<Case> cases;
  for (const json& c : doc.at("cases")) {
    Case k;
    k.text = c.value("text", std::string());
    k.ids = c.at("ids").get<std::vector<Token>>();
    if (c.contains("ids_plain")) {
      k.ids_plain = c.at("ids_plain").get<std::vector<Token>>();
    } else {
      const auto from = static_cast<std::ptrdiff_t>(c.value("plain_from", 0));
      k.ids_plain.assign(k.ids.begin() + from, k.ids.end());
    }
    k.decoded = c.at("decoded").get<std::string>();
    k.decoded_skip = c.value("decoded_skip", k.decoded);
    cases.push_back(std::move(k));
  }
  return cases;
}

void expect_like_reference(const Tokenizer& tok, const std::string& name) {
  size_t mismatches = 0;
  const std::vector<Case> cases = reference_cases(name);
  ASSERT_GT(cases.size(), 1000u);
  for (const Case& c : cases) {
    const std::vector<Token> ids = tok.encode(c.text, true);
    const std::vector<Token> plain = tok.encode(c.text, false);
    const std::string decoded = tok.decode(c.ids);
    const std::string skipped = tok.decode(c.ids, true);
    if (ids != c.ids || plain != c.ids_plain || decoded != c.decoded || skipped != c.decoded_skip) {
      ADD_FAILURE() << name << ": " << json(c.text).dump() << "\n  got      " << json(ids).dump()
                    << "\n  expected " << json(c.ids).dump() << "\n  decoded "
                    << json(decoded).dump() << "\n  expected " << json(c.decoded).dump();
      if (++mismatches >= 5) break;
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

#define SKIP_WITHOUT_SHARED(name)                                           \
  if (!fs::exists(shared_tokenizer(name))) {                                \
    GTEST_SKIP() << "no " << shared_tokenizer(name) << " in this checkout"; \
  }

TEST(GgufTokenizer, Llama3AsGpt2LlamaBpe) {
  SKIP_WITHOUT_SHARED("llama3");
  GgufVocab v = vocab_of(read_json(shared_tokenizer("llama3")), "gpt2", "llama-bpe", false);
  v.bos_id = 128000;
  v.eos_id = 128001;
  v.eot_id = 128009;
  Result<Tokenizer> tok = Tokenizer::from_gguf(v, "llama3.gguf");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(tok->vocab_size(), 128256u);
  EXPECT_EQ(tok->bos_id(), std::optional<Token>(128000));
  EXPECT_EQ(tok->eos_ids(), (std::vector<Token>{128001, 128009}));
  EXPECT_TRUE(tok->is_special(128009));
  expect_like_reference(*tok, "llama3");
  // With add_bos (as Meta's files set it) the BOS comes first.
  v.add_bos = true;
  Result<Tokenizer> with_bos = Tokenizer::from_gguf(v, "llama3.gguf");
  ASSERT_TRUE(with_bos.ok());
  const std::vector<Token> ids = with_bos->encode("Hello", true);
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids[0], 128000);
}

TEST(GgufTokenizer, Qwen3AsGpt2Qwen2) {
  SKIP_WITHOUT_SHARED("qwen3");
  GgufVocab v = vocab_of(read_json(shared_tokenizer("qwen3")), "gpt2", "qwen2", false);
  v.eos_id = 151645;
  Result<Tokenizer> tok = Tokenizer::from_gguf(v, "qwen3.gguf");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_FALSE(tok->is_special(151657));  // <tool_call>: user defined
  EXPECT_EQ(tok->encode("<tool_call>", false), std::vector<Token>{151657});
  expect_like_reference(*tok, "qwen3");
}

TEST(GgufTokenizer, Llama2AsSentencePiece) {
  SKIP_WITHOUT_SHARED("llama2");
  GgufVocab v = vocab_of(read_json(shared_tokenizer("llama2")), "llama", "", true);
  v.bos_id = 1;
  v.eos_id = 2;
  Result<Tokenizer> tok = Tokenizer::from_gguf(v, "llama2.gguf");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(tok->vocab_size(), 32000u);
  expect_like_reference(*tok, "llama2");
}

GgufVocab tiny_gpt2() {
  GgufVocab v;
  v.model = "gpt2";
  v.tokens = {"a", "b", "ab", "<|end|>"};
  v.token_types = {1, 1, 1, 3};
  v.merges = {"a b"};
  v.eos_id = 3;
  return v;
}

TEST(GgufTokenizer, SmallVocabularies) {
  Result<Tokenizer> tok = Tokenizer::from_gguf(tiny_gpt2(), "t.gguf");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(tok->encode("abab<|end|>", true), (std::vector<Token>{2, 2, 3}));
  EXPECT_EQ(tok->decode(std::vector<Token>{2, 3}), "ab<|end|>");
  EXPECT_EQ(tok->decode(std::vector<Token>{2, 3}, true), "ab");
  EXPECT_EQ(tok->eos_ids(), std::vector<Token>{3});
  EXPECT_FALSE(tok->bos_id().has_value());

  // SentencePiece: merges from scores (the higher score merges first).
  GgufVocab s;
  s.model = "llama";
  s.tokens = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "x", "y", "xy", "\xE2\x96\x81x", "yx"};
  s.token_types = {2, 3, 3, 1, 1, 1, 1, 1, 1};
  s.scores = {0, 0, 0, -1, -2, -3, -5, -4, -6};
  s.bos_id = 1;
  s.eos_id = 2;
  Result<Tokenizer> sp = Tokenizer::from_gguf(s, "s.gguf");
  ASSERT_TRUE(sp.ok()) << sp.status().to_string();
  // "▁xyx": ▁x (score -4) beats xy (-5) and yx (-6); then y+x -> yx.
  EXPECT_EQ(sp->encode("xyx", true), (std::vector<Token>{1, 7, 8}));
  EXPECT_EQ(sp->decode(std::vector<Token>{1, 7, 8}, true), "xyx");
  s.add_bos = false;
  s.add_space_prefix = false;
  Result<Tokenizer> bare = Tokenizer::from_gguf(s, "s.gguf");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->encode("xy", true), std::vector<Token>{6});
  // "z" is in no token and there are no byte tokens: the unknown token.
  EXPECT_EQ(bare->encode("z", true), std::vector<Token>{0});
}

TEST(GgufTokenizer, InconsistentFieldsAreErrors) {
  const auto error = [](const GgufVocab& v) {
    Result<Tokenizer> t = Tokenizer::from_gguf(v, "bad.gguf");
    EXPECT_FALSE(t.ok());
    return t.ok() ? std::string() : t.status().to_string();
  };
  GgufVocab v = tiny_gpt2();
  v.model = "t5";
  EXPECT_NE(error(v).find("bad.gguf: tokenizer.ggml.model 't5' is not supported"),
            std::string::npos);
  v = tiny_gpt2();
  v.pre = "tekken";
  EXPECT_NE(error(v).find("tokenizer.ggml.pre 'tekken' is not supported"), std::string::npos);
  v = tiny_gpt2();
  v.token_types.pop_back();
  EXPECT_NE(error(v).find("token_type has 3 entries for 4 tokens"), std::string::npos);
  v = tiny_gpt2();
  v.eos_id = 4;
  EXPECT_NE(error(v).find("eos_token_id 4 is not a token id"), std::string::npos);
  v = tiny_gpt2();
  v.merges = {"a c"};
  EXPECT_NE(error(v).find("not in the vocabulary"), std::string::npos);
  v = tiny_gpt2();
  v.token_types[0] = 9;
  EXPECT_NE(error(v).find("token_type of token 0 is 9"), std::string::npos);
  v = tiny_gpt2();
  v.tokens.clear();
  v.token_types.clear();
  EXPECT_NE(error(v).find("tokenizer.ggml.tokens is missing or empty"), std::string::npos);
  v = tiny_gpt2();
  v.model = "llama";
  EXPECT_NE(error(v).find("tokenizer.ggml.scores is missing"), std::string::npos);
  // A SentencePiece piece far longer than any trained one (the merge search is
  // quadratic in a piece's length): refused, not searched for minutes.
  v = tiny_gpt2();
  v.model = "llama";
  v.scores.assign(v.tokens.size(), 0.0f);
  v.tokens[0] = std::string(4096, 'a');
  EXPECT_NE(error(v).find("tokenizer.ggml.tokens[0] is 4096 bytes long"), std::string::npos);
}

}  // namespace
}  // namespace cellm
