// Tests of cellm::Tokenizer against reference fixtures made by Hugging Face
// `tokenizers` (tools/make_tokenizer_fixtures.py) for the real tokenizers in
// ../shared/tokenizers, plus small synthetic model folders for error paths and
// the components the real files do not use.
#include "cellm/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

namespace cellm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct FixtureCase {
  std::string name;
  std::string text;
  std::vector<Token> ids;
  std::vector<Token> ids_plain;
  std::string decoded;
  std::string decoded_skip;
  std::optional<std::vector<std::string>> stream;
};

struct Fixture {
  Tokenizer tokenizer;
  std::vector<FixtureCase> cases;     // text -> ids -> text
  std::vector<FixtureCase> id_cases;  // random ids -> text (no text, no ids_plain)
};

fs::path shared_tokenizer_dir(const std::string& name) {
  return fs::path(CELLM_SHARED_DIR) / "tokenizers" / name;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// The tokenizer and its reference cases, loaded once per name; nullptr when the
// shared folder is absent.
const Fixture* fixture(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Fixture>> loaded;
  if (auto it = loaded.find(name); it != loaded.end()) return it->second.get();
  if (!fs::exists(shared_tokenizer_dir(name))) return nullptr;
  Result<Tokenizer> tokenizer = Tokenizer::load(shared_tokenizer_dir(name).string());
  if (!tokenizer.ok()) {
    ADD_FAILURE() << tokenizer.status().to_string();
    return nullptr;
  }
  const json doc = json::parse(read_file(fs::path(CELLM_SOURCE_DIR) / "tests" / "fixtures" /
                                         "tokenizer" / (name + ".json")));
  auto f = std::make_unique<Fixture>(Fixture{std::move(tokenizer).value(), {}, {}});
  for (const char* key : {"cases", "id_cases"}) {
    for (const json& c : doc.at(key)) {
      FixtureCase fc;
      fc.name = c.at("name").get<std::string>();
      fc.text = c.value("text", std::string());
      fc.ids = c.at("ids").get<std::vector<Token>>();
      if (c.contains("ids_plain")) {
        fc.ids_plain = c.at("ids_plain").get<std::vector<Token>>();
      } else {
        const auto from = static_cast<std::ptrdiff_t>(c.value("plain_from", 0));
        fc.ids_plain.assign(fc.ids.begin() + from, fc.ids.end());
      }
      fc.decoded = c.at("decoded").get<std::string>();
      fc.decoded_skip = c.value("decoded_skip", fc.decoded);
      if (c.contains("stream")) fc.stream = c.at("stream").get<std::vector<std::string>>();
      (std::string(key) == "cases" ? f->cases : f->id_cases).push_back(std::move(fc));
    }
  }
  return (loaded[name] = std::move(f)).get();
}

#define REQUIRE_FIXTURE(var, name)                                              \
  const Fixture* var = fixture(name);                                           \
  if (var == nullptr) {                                                         \
    if (::testing::Test::HasFailure()) return;                                  \
    GTEST_SKIP() << "no " << shared_tokenizer_dir(name) << " in this checkout"; \
  }

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    size_t n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    char32_t cp = n == 1 ? b : (b & (0x7F >> n));
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<uint8_t>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    const char32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

std::string describe(const FixtureCase& c) {
  return c.name + ": " + json(c.text).dump();
}

void expect_encodes_like_reference(const Fixture& f) {
  size_t mismatches = 0;
  for (const FixtureCase& c : f.cases) {
    const std::vector<Token> ids = f.tokenizer.encode(c.text, /*add_special_tokens=*/true);
    const std::vector<Token> plain = f.tokenizer.encode(c.text, /*add_special_tokens=*/false);
    if (ids != c.ids || plain != c.ids_plain) {
      ++mismatches;
      ADD_FAILURE() << "encode differs for " << describe(c) << "\n  got      " << json(ids).dump()
                    << "\n  expected " << json(c.ids).dump();
    }
    if (mismatches >= 10) break;
  }
  EXPECT_EQ(mismatches, 0u);
}

void expect_decodes_like_reference(const Fixture& f, const std::vector<FixtureCase>& cases) {
  size_t mismatches = 0;
  for (const FixtureCase& c : cases) {
    const std::string decoded = f.tokenizer.decode(c.ids, /*skip_special_tokens=*/false);
    const std::string skipped = f.tokenizer.decode(c.ids, /*skip_special_tokens=*/true);
    if (decoded != c.decoded || skipped != c.decoded_skip) {
      ++mismatches;
      ADD_FAILURE() << "decode differs for " << describe(c) << "\n  got      "
                    << json(decoded).dump() << " / " << json(skipped).dump() << "\n  expected "
                    << json(c.decoded).dump() << " / " << json(c.decoded_skip).dump();
    }
    if (mismatches >= 10) break;
  }
  EXPECT_EQ(mismatches, 0u);
}

// decode(encode(x)) == x wherever the reference round-trips.
void expect_round_trips_where_reference_does(const Fixture& f, size_t min_round_trips) {
  size_t round_trips = 0;
  for (const FixtureCase& c : f.cases) {
    if (c.decoded_skip != c.text) continue;
    ++round_trips;
    EXPECT_EQ(f.tokenizer.decode(f.tokenizer.encode(c.text, true), true), c.text) << describe(c);
  }
  EXPECT_GE(round_trips, min_round_trips);
}

std::vector<std::string> stream(const Tokenizer& tokenizer, const std::vector<Token>& ids,
                                bool skip_special_tokens) {
  IncrementalDecoder decoder(tokenizer, skip_special_tokens);
  std::vector<std::string> chunks;
  for (Token id : ids) chunks.push_back(decoder.feed(id));
  chunks.push_back(decoder.flush());
  return chunks;
}

// Whether a run of <0xNN> tokens in `ids` (after skipping special tokens when
// asked) is invalid UTF-8 as a whole but starts with valid UTF-8: the one
// stream that IncrementalDecoder documents it cannot match decode() on, since
// the valid start is sent before the run turns invalid.
bool has_byte_run_valid_then_invalid(const Tokenizer& t, const std::vector<Token>& ids, bool skip) {
  std::string run;
  bool prefix_was_valid = false;
  for (size_t i = 0; i <= ids.size(); ++i) {
    std::optional<std::string> token;
    if (i < ids.size()) {
      if (skip && t.is_special(ids[i])) continue;
      token = t.id_to_token(ids[i]);
      if (!token) continue;
    }
    if (token && token->size() == 6 && token->starts_with("<0x") && token->ends_with(">")) {
      run.push_back(static_cast<char>(std::stoi(token->substr(3, 2), nullptr, 16)));
      if (is_valid_utf8(run)) prefix_was_valid = true;
      continue;
    }
    if (!run.empty() && !is_valid_utf8(run) && prefix_was_valid) return true;
    run.clear();
    prefix_was_valid = false;
  }
  return false;
}

void expect_streams_like_decode(const Fixture& f, const std::vector<FixtureCase>& cases,
                                size_t max_excluded = 0) {
  size_t excluded = 0;
  for (const FixtureCase& c : cases) {
    for (bool skip : {false, true}) {
      if (has_byte_run_valid_then_invalid(f.tokenizer, c.ids, skip)) {
        ++excluded;
        continue;
      }
      const std::vector<std::string> chunks = stream(f.tokenizer, c.ids, skip);
      std::string joined;
      for (const std::string& chunk : chunks) {
        EXPECT_TRUE(is_valid_utf8(chunk)) << describe(c) << " chunk " << json(chunk).dump();
        joined += chunk;
      }
      ASSERT_EQ(joined, skip ? c.decoded_skip : c.decoded) << describe(c) << " skip=" << skip;
    }
  }
  EXPECT_LE(excluded, max_excluded);
}

void expect_stream_chunks_like_reference(const Fixture& f, const std::vector<FixtureCase>& cases,
                                         size_t min_cases) {
  size_t compared = 0;
  for (const FixtureCase& c : cases) {
    if (!c.stream || has_byte_run_valid_then_invalid(f.tokenizer, c.ids, false)) continue;
    ++compared;
    // The reference has no flush: compare the chunks of feed() only.
    std::vector<std::string> fed = stream(f.tokenizer, c.ids, false);
    fed.pop_back();
    std::vector<std::string> chunks;
    for (std::string& chunk : fed) {
      if (!chunk.empty()) chunks.push_back(std::move(chunk));
    }
    EXPECT_EQ(json(chunks).dump(), json(*c.stream).dump()) << describe(c);
  }
  EXPECT_GE(compared, min_cases);
}

// Random bytes, valid or not, encode without failing; valid text round-trips.
void expect_encodes_random_bytes(const Fixture& f, bool byte_level) {
  std::mt19937 rng(7);
  for (int n = 0; n < 500; ++n) {
    std::string bytes(rng() % 24, '\0');
    for (char& b : bytes) b = static_cast<char>(rng() % 256);
    if (n % 5 == 0) bytes = "<|im_start|>" + bytes + "<s>";
    const std::vector<Token> ids = f.tokenizer.encode(bytes, true);
    const std::string decoded = f.tokenizer.decode(ids, false);
    EXPECT_TRUE(is_valid_utf8(decoded)) << "case " << n;
    if (byte_level && is_valid_utf8(bytes)) {
      EXPECT_EQ(decoded, bytes) << "case " << n;
    }
    if (byte_level) {
      EXPECT_LE(decoded.size(), bytes.size() * 3) << "case " << n;
    }
  }
}

#define ID_LIST_TESTS(Suite, name, min_streams, max_excluded)                  \
  TEST(Suite, DecodesRandomIdListsLikeTheReference) {                          \
    REQUIRE_FIXTURE(f, name);                                                  \
    ASSERT_GE(f->id_cases.size(), 300u);                                       \
    expect_decodes_like_reference(*f, f->id_cases);                            \
  }                                                                            \
  TEST(Suite, StreamsRandomIdListsExactlyAsDecodedInValidUtf8Chunks) {         \
    REQUIRE_FIXTURE(f, name);                                                  \
    expect_streams_like_decode(*f, f->id_cases, max_excluded);                 \
  }                                                                            \
  TEST(Suite, StreamsRandomIdListsInTheSameChunksAsTheReferenceDecodeStream) { \
    REQUIRE_FIXTURE(f, name);                                                  \
    expect_stream_chunks_like_reference(*f, f->id_cases, min_streams);         \
  }

// Byte-level streams are exact on any ids; byte-fallback streams on all but the
// runs has_byte_run_valid_then_invalid describes.
ID_LIST_TESTS(TokenizerLlama3IdsTest, "llama3", 300, 0)
ID_LIST_TESTS(TokenizerQwen3IdsTest, "qwen3", 300, 0)
ID_LIST_TESTS(TokenizerLlama2IdsTest, "llama2", 200, 190)

TEST(TokenizerLlama3Test, EncodesRandomBytesWithoutFailing) {
  REQUIRE_FIXTURE(f, "llama3");
  expect_encodes_random_bytes(*f, true);
}

TEST(TokenizerQwen3Test, EncodesRandomBytesWithoutFailing) {
  REQUIRE_FIXTURE(f, "qwen3");
  expect_encodes_random_bytes(*f, true);
}

TEST(TokenizerLlama2Test, EncodesRandomBytesWithoutFailing) {
  REQUIRE_FIXTURE(f, "llama2");
  expect_encodes_random_bytes(*f, false);
}

// ---- Llama 3: byte-level BPE, ignore_merges, 256 special added tokens.

TEST(TokenizerLlama3Test, EncodesTheVariedCorpusLikeTheReference) {
  REQUIRE_FIXTURE(f, "llama3");
  expect_encodes_like_reference(*f);
}

TEST(TokenizerLlama3Test, DecodesEveryIdListLikeTheReference) {
  REQUIRE_FIXTURE(f, "llama3");
  expect_decodes_like_reference(*f, f->cases);
}

TEST(TokenizerLlama3Test, RoundTripsTextWhereTheReferenceDoes) {
  REQUIRE_FIXTURE(f, "llama3");
  expect_round_trips_where_reference_does(*f, 2000);
}

TEST(TokenizerLlama3Test, StreamsExactlyTheDecodedTextInValidUtf8Chunks) {
  REQUIRE_FIXTURE(f, "llama3");
  expect_streams_like_decode(*f, f->cases);
}

TEST(TokenizerLlama3Test, StreamsTheSameChunksAsTheReferenceDecodeStream) {
  REQUIRE_FIXTURE(f, "llama3");
  expect_stream_chunks_like_reference(*f, f->cases, 230);
}

TEST(TokenizerLlama3Test, ReadsVocabularySizeAndBosEosFromTheFolder) {
  REQUIRE_FIXTURE(f, "llama3");
  EXPECT_EQ(f->tokenizer.vocab_size(), 128256u);
  EXPECT_EQ(f->tokenizer.bos_id(), std::optional<Token>(128000));
  EXPECT_EQ(f->tokenizer.eos_ids(), std::vector<Token>{128001});
  EXPECT_EQ(f->tokenizer.token_to_id("<|begin_of_text|>"), std::optional<Token>(128000));
  EXPECT_EQ(f->tokenizer.id_to_token(9906), std::optional<std::string>("Hello"));
  EXPECT_TRUE(f->tokenizer.is_special(128009));
  EXPECT_FALSE(f->tokenizer.is_special(9906));
  EXPECT_EQ(f->tokenizer.id_to_token(1 << 30), std::nullopt);
}

TEST(TokenizerLlama3Test, EncodesInvalidUtf8AsRawBytes) {
  REQUIRE_FIXTURE(f, "llama3");
  const std::string bad = "ok \xff\xfe \xe2\x82 end \xc3";
  const std::vector<Token> ids = f->tokenizer.encode(bad, false);
  ASSERT_FALSE(ids.empty());
  // The raw bytes come back; invalid ones read as U+FFFD (one per maximal subpart).
  EXPECT_EQ(f->tokenizer.decode(ids), "ok \xEF\xBF\xBD\xEF\xBF\xBD \xEF\xBF\xBD end \xEF\xBF\xBD");
}

TEST(TokenizerLlama3Test, SkipsIdsOutsideTheVocabularyWhenDecoding) {
  REQUIRE_FIXTURE(f, "llama3");
  const std::vector<Token> ids = {-5, 9906, 1 << 30};
  EXPECT_EQ(f->tokenizer.decode(ids), "Hello");
}

// ---- Qwen 3: byte-level BPE with NFC, [a, b] merges, special and plain added tokens.

TEST(TokenizerQwen3Test, EncodesTheVariedCorpusLikeTheReference) {
  REQUIRE_FIXTURE(f, "qwen3");
  expect_encodes_like_reference(*f);
}

TEST(TokenizerQwen3Test, DecodesEveryIdListLikeTheReference) {
  REQUIRE_FIXTURE(f, "qwen3");
  expect_decodes_like_reference(*f, f->cases);
}

TEST(TokenizerQwen3Test, RoundTripsTextWhereTheReferenceDoes) {
  REQUIRE_FIXTURE(f, "qwen3");
  expect_round_trips_where_reference_does(*f, 1900);
}

TEST(TokenizerQwen3Test, StreamsExactlyTheDecodedTextInValidUtf8Chunks) {
  REQUIRE_FIXTURE(f, "qwen3");
  expect_streams_like_decode(*f, f->cases);
}

TEST(TokenizerQwen3Test, StreamsTheSameChunksAsTheReferenceDecodeStream) {
  REQUIRE_FIXTURE(f, "qwen3");
  expect_stream_chunks_like_reference(*f, f->cases, 230);
}

TEST(TokenizerQwen3Test, ReadsVocabularySizeAndBosEosFromTheFolder) {
  REQUIRE_FIXTURE(f, "qwen3");
  EXPECT_EQ(f->tokenizer.vocab_size(), 151669u);
  EXPECT_EQ(f->tokenizer.bos_id(), std::nullopt);
  EXPECT_EQ(f->tokenizer.eos_ids(), std::vector<Token>{151645});
  EXPECT_EQ(f->tokenizer.token_to_id("<think>"), std::optional<Token>(151667));
  EXPECT_FALSE(f->tokenizer.is_special(151667));
  EXPECT_TRUE(f->tokenizer.is_special(151644));
}

TEST(TokenizerQwen3Test, ComposesDecomposedAccentsBeforeEncoding) {
  REQUIRE_FIXTURE(f, "qwen3");
  EXPECT_EQ(f->tokenizer.encode("cafe\xCC\x81", false), f->tokenizer.encode("caf\xC3\xA9", false));
}

// ---- Llama 2 style: SentencePiece BPE with byte fallback, Prepend/Replace, BOS template.

TEST(TokenizerLlama2Test, EncodesTheVariedCorpusLikeTheReference) {
  REQUIRE_FIXTURE(f, "llama2");
  expect_encodes_like_reference(*f);
}

TEST(TokenizerLlama2Test, DecodesEveryIdListLikeTheReference) {
  REQUIRE_FIXTURE(f, "llama2");
  expect_decodes_like_reference(*f, f->cases);
}

TEST(TokenizerLlama2Test, RoundTripsTextWhereTheReferenceDoes) {
  REQUIRE_FIXTURE(f, "llama2");
  expect_round_trips_where_reference_does(*f, 1500);
}

TEST(TokenizerLlama2Test, StreamsExactlyTheDecodedTextInValidUtf8Chunks) {
  REQUIRE_FIXTURE(f, "llama2");
  expect_streams_like_decode(*f, f->cases);
}

TEST(TokenizerLlama2Test, StreamsTheSameChunksAsTheReferenceDecodeStream) {
  REQUIRE_FIXTURE(f, "llama2");
  expect_stream_chunks_like_reference(*f, f->cases, 230);
}

TEST(TokenizerLlama2Test, ReadsVocabularySizeAndBosEosFromTheFolder) {
  REQUIRE_FIXTURE(f, "llama2");
  EXPECT_EQ(f->tokenizer.vocab_size(), 32000u);
  EXPECT_EQ(f->tokenizer.bos_id(), std::optional<Token>(1));
  EXPECT_EQ(f->tokenizer.eos_ids(), std::vector<Token>{2});
  EXPECT_EQ(f->tokenizer.encode("", true), std::vector<Token>{1});
  EXPECT_EQ(f->tokenizer.encode("", false), std::vector<Token>{});
}

TEST(TokenizerLlama2Test, EncodesInvalidUtf8AsByteFallbackTokens) {
  REQUIRE_FIXTURE(f, "llama2");
  const std::vector<Token> ids = f->tokenizer.encode("a\xff", false);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(f->tokenizer.id_to_token(ids.back()), std::optional<std::string>("<0xFF>"));
  EXPECT_EQ(f->tokenizer.decode(ids), "a\xEF\xBF\xBD");
}

TEST(TokenizerLlama2Test, HoldsBackAByteFallbackRunUntilItIsComplete) {
  REQUIRE_FIXTURE(f, "llama2");
  IncrementalDecoder decoder(f->tokenizer);
  const std::vector<std::string> bytes = {"<0xF0>", "<0x9D>", "<0x95>", "<0x8F>"};
  std::string out;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const std::optional<Token> id = f->tokenizer.token_to_id(bytes[i]);
    ASSERT_TRUE(id.has_value());
    const std::string chunk = decoder.feed(*id);
    if (i + 1 < bytes.size()) {
      EXPECT_EQ(chunk, "") << i;
    }
    out += chunk;
  }
  EXPECT_EQ(out, "\xF0\x9D\x95\x8F");  // U+1D54F
  EXPECT_EQ(decoder.flush(), "");
}

// ---- Synthetic model folders: errors and components the real files do not use.

class TokenizerFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("cellm_tokenizer_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write(const std::string& name, const std::string& content) {
    std::ofstream(dir_ / name, std::ios::binary) << content;
  }
  // A tiny SentencePiece-style model: Metaspace pre-tokenizer and decoder.
  static json tiny_tokenizer() {
    return json::parse(R"({
      "added_tokens": [
        {"id": 0, "content": "<s>", "special": true, "normalized": false,
         "single_word": false, "lstrip": false, "rstrip": false},
        {"id": 1, "content": "</s>", "special": true, "normalized": false,
         "single_word": false, "lstrip": false, "rstrip": false}],
      "normalizer": null,
      "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581",
                        "prepend_scheme": "always", "split": true},
      "post_processor": {"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}},
      "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                  "split": true},
      "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": false,
        "vocab": {"<s>": 0, "</s>": 1, "<unk>": 2, "\u2581": 3, "a": 4, "b": 5,
                  "\u2581a": 6, "ab": 7, "\u2581ab": 8},
        "merges": ["\u2581 a", ["a", "b"], "\u2581a b"]}
    })");
  }

  fs::path dir_;
};

TEST_F(TokenizerFolderTest, AMissingFolderIsNamedAsTheFolder) {
  const Result<Tokenizer> t = Tokenizer::load((dir_ / "absent").string());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_NE(
      t.status().message().find((dir_ / "absent").string() + ": the model folder does not exist"),
      std::string::npos)
      << t.status().message();
  EXPECT_NE(t.status().message().find("tokenizer.json"), std::string::npos);
}

TEST_F(TokenizerFolderTest, MalformedJsonNamesTheFileAndTheProblem) {
  write("tokenizer.json", "{\"model\": {\"type\": \"BPE\", ");
  write("tokenizer_config.json", "{}");
  const Result<Tokenizer> t = Tokenizer::load(dir_.string());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidProgram);
  EXPECT_NE(t.status().message().find((dir_ / "tokenizer.json").string()), std::string::npos);
  EXPECT_NE(t.status().message().find("malformed JSON"), std::string::npos);
}

TEST_F(TokenizerFolderTest, AStripDecoderCountThatIsNotANonNegativeIntegerIsNamed) {
  for (const json& bad : {json(-1.55615e+308), json(-1), json(2.5), json("3")}) {
    json j = tiny_tokenizer();
    j["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", bad}};
    write("tokenizer.json", j.dump());
    write("tokenizer_config.json", "{}");
    const Result<Tokenizer> t = Tokenizer::load(dir_.string());
    ASSERT_FALSE(t.ok()) << bad.dump();
    EXPECT_NE(t.status().message().find("Strip decoder 'stop' must be a non-negative integer"),
              std::string::npos)
        << t.status().message();
  }
}

TEST_F(TokenizerFolderTest, AnUnknownModelTypeIsNotSupported) {
  json j = tiny_tokenizer();
  j["model"]["type"] = "WordPiece";
  write("tokenizer.json", j.dump());
  write("tokenizer_config.json", "{}");
  const Result<Tokenizer> t = Tokenizer::load(dir_.string());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(t.status().message().find("WordPiece"), std::string::npos);
  EXPECT_NE(t.status().message().find("tokenizer.json"), std::string::npos);
}

TEST_F(TokenizerFolderTest, AnUnknownComponentIsNotSupported) {
  json j = tiny_tokenizer();
  j["normalizer"] = {{"type", "Precompiled"}};
  write("tokenizer.json", j.dump());
  write("tokenizer_config.json", "{}");
  const Result<Tokenizer> t = Tokenizer::load(dir_.string());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(t.status().message().find("Precompiled"), std::string::npos);
}

TEST_F(TokenizerFolderTest, AWrongFieldTypeIsAnErrorNotACrash) {
  json j = tiny_tokenizer();
  j["model"]["vocab"]["a"] = "four";
  write("tokenizer.json", j.dump());
  write("tokenizer_config.json", "{}");
  const Result<Tokenizer> t = Tokenizer::load(dir_.string());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidProgram);
  EXPECT_NE(t.status().message().find("tokenizer.json"), std::string::npos);
}

TEST_F(TokenizerFolderTest, AMergeOfUnknownTokensIsRejected) {
  json j = tiny_tokenizer();
  j["model"]["merges"].push_back("x y");
  write("tokenizer.json", j.dump());
  write("tokenizer_config.json", "{}");
  const Result<Tokenizer> t = Tokenizer::load(dir_.string());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidProgram);
  EXPECT_NE(t.status().message().find("'x'"), std::string::npos);
}

// Found with the fuzz targets (tests/fuzz): a vocabulary id of 2^31 - 1 overflowed int32 (max id +
// 1) and sized the id -> token table at 2^31 strings; ids now stay below 2^24.
TEST_F(TokenizerFolderTest, TokenIdsPastTheLimitAreRejectedNotAllocated) {
  write("tokenizer_config.json", "{}");
  json j = tiny_tokenizer();
  j["model"]["vocab"]["a"] = 2147483647;
  write("tokenizer.json", j.dump());
  Result<Tokenizer> t = Tokenizer::load(dir_.string());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidProgram);
  EXPECT_NE(t.status().message().find("model.vocab id 2147483647 of 'a' is out of range"),
            std::string::npos)
      << t.status().message();
  j = tiny_tokenizer();
  j["added_tokens"][1]["id"] = 16777216;
  write("tokenizer.json", j.dump());
  t = Tokenizer::load(dir_.string());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("added token '</s>' has id 16777216, out of range"),
            std::string::npos)
      << t.status().message();
  j["added_tokens"][1]["id"] = 16777215;  // the largest id allowed
  write("tokenizer.json", j.dump());
  t = Tokenizer::load(dir_.string());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->vocab_size(), 16777216u);
}

TEST_F(TokenizerFolderTest, AMissingTokenizerConfigIsNamed) {
  write("tokenizer.json", tiny_tokenizer().dump());
  const Result<Tokenizer> t = Tokenizer::load(dir_.string());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find("tokenizer_config.json"), std::string::npos);
}

TEST_F(TokenizerFolderTest, MetaspaceStringAndArrayMergesAndFusedUnkWorkTogether) {
  write("tokenizer.json", tiny_tokenizer().dump());
  write("tokenizer_config.json", R"({"bos_token": {"content": "<s>"}, "eos_token": "</s>"})");
  const Result<Tokenizer> t = Tokenizer::load(dir_.string());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  // "ab ab zz a" -> ▁ab ▁ab ▁ <unk>(zz fused) ▁a
  EXPECT_EQ(t->encode("ab ab zz a", false), (std::vector<Token>{8, 8, 3, 2, 6}));
  EXPECT_EQ(t->encode("ab", true), (std::vector<Token>{0, 8}));
  EXPECT_EQ(t->decode(std::vector<Token>{8, 6, 5}), "ab ab");
  EXPECT_EQ(t->bos_id(), std::optional<Token>(0));
  EXPECT_EQ(t->eos_ids(), std::vector<Token>{1});
  IncrementalDecoder d(*t);
  std::string streamed;
  for (Token id : {3, 8, 6, 5}) streamed += d.feed(id);
  streamed += d.flush();
  EXPECT_EQ(streamed, t->decode(std::vector<Token>{3, 8, 6, 5}));
}

TEST_F(TokenizerFolderTest, EosIdsMergeGenerationConfigListsAndConfigInts) {
  write("tokenizer.json", tiny_tokenizer().dump());
  write("tokenizer_config.json", R"({"bos_token": null, "eos_token": {"content": "</s>"}})");
  write("generation_config.json", R"({"bos_token_id": 0, "eos_token_id": [5, 1]})");
  write("config.json", R"({"eos_token_id": 4})");
  const Result<Tokenizer> t = Tokenizer::load(dir_.string());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->bos_id(), std::optional<Token>(0));
  EXPECT_EQ(t->eos_ids(), (std::vector<Token>{5, 1, 4}));
}

TEST_F(TokenizerFolderTest, AnEosTokenOutsideTheVocabularyIsNamed) {
  write("tokenizer.json", tiny_tokenizer().dump());
  write("tokenizer_config.json", R"({"eos_token": "<|nope|>"})");
  const Result<Tokenizer> t = Tokenizer::load(dir_.string());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("<|nope|>"), std::string::npos);
  EXPECT_NE(t.status().message().find("tokenizer_config.json"), std::string::npos);
}

}  // namespace
}  // namespace cellm

namespace cellm {
namespace {

// Small tokenizers made by tools/make_synthetic_tokenizer_fixtures.py for the
// components the real files do not use; each compared with its reference.
TEST(TokenizerSyntheticTest, EncodesAndDecodesEveryComponentVariantLikeTheReference) {
  const json doc = json::parse(read_file(fs::path(CELLM_SOURCE_DIR) / "tests" / "fixtures" /
                                         "tokenizer" / "synthetic.json"));
  const fs::path dir =
      fs::temp_directory_path() / ("cellm_tokenizer_synthetic_" + std::to_string(::getpid()));
  size_t variants = 0;
  for (const json& variant : doc.at("variants")) {
    const std::string name = variant.at("name").get<std::string>();
    fs::create_directories(dir);
    std::ofstream(dir / "tokenizer.json") << variant.at("tokenizer").dump();
    std::ofstream(dir / "tokenizer_config.json") << "{}";
    const Result<Tokenizer> t = Tokenizer::load(dir.string());
    fs::remove_all(dir);
    ASSERT_TRUE(t.ok()) << name << ": " << t.status().to_string();
    ++variants;
    for (const json& c : variant.at("cases")) {
      const std::string text = c.at("text").get<std::string>();
      const std::string where = name + " " + json(text).dump();
      const std::vector<Token> ids = c.at("ids").get<std::vector<Token>>();
      EXPECT_EQ(t->encode(text, true), ids) << where;
      EXPECT_EQ(t->encode(text, false), c.at("ids_plain").get<std::vector<Token>>()) << where;
      EXPECT_EQ(t->decode(ids, false), c.at("decoded").get<std::string>()) << where;
      EXPECT_EQ(t->decode(ids, true), c.at("decoded_skip").get<std::string>()) << where;
      IncrementalDecoder stream(*t);
      std::string joined;
      for (Token id : ids) joined += stream.feed(id);
      joined += stream.flush();
      EXPECT_EQ(joined, c.at("decoded").get<std::string>()) << where;
    }
  }
  EXPECT_EQ(variants, 21u);
}

}  // namespace
}  // namespace cellm
