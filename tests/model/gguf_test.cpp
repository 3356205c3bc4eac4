// The GGUF reader (src/model/gguf.h): every metadata value type, tensor infos and
// alignment, the ggml type table against the format's block sizes, and every kind
// of bad file with its error (each prefix of a valid file is a truncated file).
// Then the committed fixtures (tests/fixtures/gguf, tests/fixtures/gguf/make_gguf_fixtures.py):
// the config and every weight of a GGUF equal those of the same model's HF folder.
#include "model/gguf.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <span>

#include "cellm/gguf.h"
#include "cellm/model_weights.h"
#include "gguf_test_writer.h"
#include "model/half.h"
#include "support/temp_dir.h"

namespace cellm {
namespace {

using testing::GgufTestTensor;
using testing::GgufWriter;
namespace fs = std::filesystem;

Result<GgufParsed> parse(const std::string& bytes) {
  return parse_gguf(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()),
      "test.gguf");
}

// The error message of parsing `bytes`, which must fail with InvalidProgram.
std::string parse_error(const std::string& bytes) {
  Result<GgufParsed> r = parse(bytes);
  EXPECT_FALSE(r.ok());
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidProgram) << r.status().to_string();
  return r.status().message();
}

std::string f32_bytes(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

// A small valid file: a few keys and two tensors (F32 [4, 2] and Q4_1 [64, 1]).
GgufWriter small_file() {
  GgufWriter w;
  w.kv_str("general.architecture", "llama");
  w.kv_u32("llama.block_count", 2);
  w.tensors.push_back({"a", {2, 4}, 0, f32_bytes({1, 2, 3, 4, 5, 6, 7, 8})});
  w.tensors.push_back({"q", {64, 1}, 3, std::string(40, '\x11')});
  return w;
}

TEST(GgufReader, ReadsEveryValueType) {
  GgufWriter w;
  w.kv("u8", 0).put<uint8_t>(200);
  w.kv("i8", 1).put<int8_t>(-100);
  w.kv("u16", 2).put<uint16_t>(60000);
  w.kv("i16", 3).put<int16_t>(-30000);
  w.kv("u32", 4).put<uint32_t>(4000000000u);
  w.kv("i32", 5).put<int32_t>(-2000000000);
  w.kv("f32", 6).put<float>(1.5f);
  w.kv("bool", 7).put<uint8_t>(1);
  w.kv("str", 8).str("héllo");
  w.kv("u64", 10).put<uint64_t>(0xFFFFFFFFFFFFFFFFull);
  w.kv("i64", 11).put<int64_t>(-5);
  w.kv("f64", 12).put<double>(0.25);
  w.kv("strings", 9).put<uint32_t>(8).put<uint64_t>(3).str("a").str("").str("c d");
  w.kv("floats", 9).put<uint32_t>(6).put<uint64_t>(2).put<float>(-1.0f).put<float>(2.5f);
  w.kv("ints", 9).put<uint32_t>(5).put<uint64_t>(2).put<int32_t>(7).put<int32_t>(-8);
  w.kv("nested", 9).put<uint32_t>(9).put<uint64_t>(2);
  w.kvs.back().put<uint32_t>(0).put<uint64_t>(1).put<uint8_t>(9);
  w.kvs.back().put<uint32_t>(8).put<uint64_t>(1).str("x");
  Result<GgufParsed> r = parse(w.build());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const GgufMetadata& m = r->metadata;
  EXPECT_EQ(m.entries().size(), 16u);
  EXPECT_EQ(m.find("u8")->integer, 200);
  EXPECT_EQ(m.find("u8")->type, GgufValueType::kUint8);
  EXPECT_EQ(m.find("i8")->integer, -100);
  EXPECT_EQ(m.find("u16")->integer, 60000);
  EXPECT_EQ(m.find("i16")->integer, -30000);
  EXPECT_EQ(m.find("u32")->integer, 4000000000ll);
  EXPECT_EQ(m.find("i32")->integer, -2000000000);
  EXPECT_EQ(m.find("f32")->real, 1.5);
  EXPECT_EQ(*m.get_bool("bool").value(), true);
  EXPECT_EQ(*m.get_string("str").value(), "héllo");
  EXPECT_EQ(m.find("u64")->as_uint64(), 0xFFFFFFFFFFFFFFFFull);
  EXPECT_EQ(*m.get_int("i64").value(), -5);
  EXPECT_EQ(*m.get_real("f64").value(), 0.25);
  EXPECT_EQ(*m.get_real("i32").value(), -2000000000.0);  // integers read as reals
  EXPECT_EQ(**m.get_strings("strings"), (std::vector<std::string>{"a", "", "c d"}));
  EXPECT_EQ(**m.get_reals("floats"), (std::vector<double>{-1.0, 2.5}));
  EXPECT_EQ(**m.get_ints("ints"), (std::vector<int64_t>{7, -8}));
  const GgufValue* nested = m.find("nested");
  ASSERT_EQ(nested->arrays.size(), 2u);
  EXPECT_EQ(nested->arrays[0].integers, std::vector<int64_t>{9});
  EXPECT_EQ(nested->arrays[1].strings, std::vector<std::string>{"x"});
  EXPECT_EQ(nested->array_size(), 2u);
  // Absent keys are nullopt; a key of another type is an error naming it.
  EXPECT_FALSE(m.get_int("missing").value().has_value());
  EXPECT_EQ(m.get_strings("missing").value(), nullptr);
  Result<std::optional<int64_t>> wrong = m.get_int("str");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("metadata 'str' is string, expected an integer"),
            std::string::npos)
      << wrong.status().message();
  EXPECT_FALSE(m.get_strings("floats").ok());
  EXPECT_FALSE(m.get_string("u8").ok());
}

TEST(GgufReader, TensorInfosHonourTheAlignment) {
  GgufWriter w = small_file();
  w.alignment = 64;
  w.kv("general.alignment", 4).put<uint32_t>(64);
  for (uint32_t version : {2u, 3u}) {
    w.version = version;
    const std::string bytes = w.build();
    Result<GgufParsed> r = parse(bytes);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->version, version);
    EXPECT_EQ(r->alignment, 64u);
    EXPECT_EQ(r->data_offset % 64, 0u);
    ASSERT_EQ(r->tensors.size(), 2u);
    const GgufTensorInfo& a = r->tensors[0];
    EXPECT_EQ(a.name, "a");
    EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 4}));
    EXPECT_EQ(a.shape(), (std::vector<int64_t>{4, 2}));
    EXPECT_EQ(a.type.type, GgmlType::kF32);
    EXPECT_EQ(a.nbytes, 32u);
    EXPECT_EQ(a.offset, 0u);
    float first[8];
    std::memcpy(first, bytes.data() + r->data_offset + a.offset, sizeof(first));
    EXPECT_EQ(first[7], 8.0f);
    const GgufTensorInfo* q = r->find("q");
    ASSERT_NE(q, nullptr);
    EXPECT_STREQ(q->type.name, "Q4_1");
    EXPECT_EQ(q->type.block_elements, 32);
    EXPECT_EQ(q->type.block_bytes, 20u);
    EXPECT_EQ(q->nbytes, 40u);
    EXPECT_EQ(q->offset, 64u);
  }
}

// The block sizes of the format (gguf-py's GGML_QUANT_SIZES).
TEST(GgufReader, TypeTableMatchesTheFormat) {
  struct Row {
    uint32_t id;
    const char* name;
    int64_t block;
    size_t bytes;
  };
  const Row rows[] = {
      {0, "F32", 1, 4},         {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},
      {3, "Q4_1", 32, 20},      {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},
      {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 40},      {10, "Q2_K", 256, 84},
      {11, "Q3_K", 256, 110},   {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
      {14, "Q6_K", 256, 210},   {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66},
      {17, "IQ2_XS", 256, 74},  {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},
      {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},  {22, "IQ2_S", 256, 82},
      {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},         {25, "I16", 1, 2},
      {26, "I32", 1, 4},        {27, "I64", 1, 8},        {28, "F64", 1, 8},
      {29, "IQ1_M", 256, 56},   {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},
      {35, "TQ2_0", 256, 66},   {39, "MXFP4", 32, 17},    {40, "NVFP4", 64, 36},
      {41, "Q1_0", 128, 18},
  };
  for (const Row& row : rows) {
    const std::optional<GgmlTypeInfo> info = ggml_type_info(row.id);
    ASSERT_TRUE(info.has_value()) << row.name;
    EXPECT_STREQ(info->name, row.name);
    EXPECT_EQ(static_cast<uint32_t>(info->type), row.id);
    EXPECT_EQ(info->block_elements, row.block) << row.name;
    EXPECT_EQ(info->block_bytes, row.bytes) << row.name;
  }
  for (uint32_t retired : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 42u, 1000u}) {
    EXPECT_FALSE(ggml_type_info(retired).has_value()) << retired;
  }
}

TEST(GgufReader, EveryPrefixOfAValidFileIsATruncatedFile) {
  const std::string bytes = small_file().build();
  Result<GgufParsed> whole = parse(bytes);
  ASSERT_TRUE(whole.ok());
  // Past the last tensor's data only padding follows: those prefixes are valid.
  const size_t end = whole->data_offset + whole->tensors[1].offset + whole->tensors[1].nbytes;
  EXPECT_TRUE(parse(bytes.substr(0, end)).ok());
  for (size_t n = 0; n < end; ++n) {
    const std::string message = parse_error(bytes.substr(0, n));
    const bool named = message.find("truncated file") != std::string::npos ||
                       message.find("runs past the end") != std::string::npos ||
                       message.find("is larger than the") != std::string::npos;
    EXPECT_TRUE(named) << "prefix " << n << ": " << message;
  }
}

TEST(GgufReader, BadHeadersNameTheProblem) {
  GgufWriter w = small_file();
  w.magic = 0x46554746;
  EXPECT_NE(parse_error(w.build()).find("wrong magic"), std::string::npos);
  for (uint32_t version : {0u, 1u, 4u}) {
    w = small_file();
    w.version = version;
    EXPECT_NE(parse_error(w.build()).find("unsupported GGUF version " + std::to_string(version)),
              std::string::npos);
  }
  // Counts far beyond what the bytes can hold.
  const std::string valid = small_file().build();
  std::string huge = valid;
  const uint64_t big = uint64_t{1} << 60;
  std::memcpy(huge.data() + 8, &big, 8);  // tensor count
  EXPECT_NE(parse_error(huge).find("tensor count"), std::string::npos);
  huge = valid;
  std::memcpy(huge.data() + 16, &big, 8);  // metadata count
  EXPECT_NE(parse_error(huge).find("metadata count"), std::string::npos);
}

TEST(GgufReader, BadMetadataNamesTheProblem) {
  GgufWriter w;
  w.kv("k", 13).put<uint32_t>(0);
  EXPECT_NE(parse_error(w.build()).find("metadata 'k': unknown value type 13"), std::string::npos);
  w = GgufWriter();
  w.kv("arr", 9).put<uint32_t>(10).put<uint64_t>(uint64_t{1} << 61);
  EXPECT_NE(parse_error(w.build()).find("array length"), std::string::npos);
  w = GgufWriter();
  w.kv("s", 8).put<uint64_t>(uint64_t{1} << 62);
  EXPECT_NE(parse_error(w.build()).find("truncated file"), std::string::npos);
  w = GgufWriter();
  w.kv("b", 7).put<uint8_t>(2);
  EXPECT_NE(parse_error(w.build()).find("a bool must be 0 or 1"), std::string::npos);
  w = GgufWriter();
  w.kv_u32("k", 1);
  w.kv_u32("k", 2);
  EXPECT_NE(parse_error(w.build()).find("duplicate metadata key 'k'"), std::string::npos);
  w = GgufWriter();
  w.kv_u32("general.alignment", 48);
  EXPECT_NE(parse_error(w.build()).find("power of two"), std::string::npos);
  w = GgufWriter();
  w.kv_u32("general.alignment", 0);
  EXPECT_NE(parse_error(w.build()).find("power of two"), std::string::npos);
  // Arrays of arrays nested past the limit.
  w = GgufWriter();
  testing::GgufBytes& deep = w.kv("deep", 9);
  for (int i = 0; i < 20; ++i) deep.put<uint32_t>(9).put<uint64_t>(1);
  deep.put<uint32_t>(0).put<uint64_t>(0);
  EXPECT_NE(parse_error(w.build()).find("nested more than"), std::string::npos);
}

TEST(GgufReader, BadTensorsNameTheTensor) {
  GgufWriter w = small_file();
  w.tensors[1].type = 4;  // retired Q4_2
  EXPECT_NE(parse_error(w.build()).find("tensor 'q': unknown tensor type 4"), std::string::npos);
  w = small_file();
  w.tensors[1].type = 99;
  EXPECT_NE(parse_error(w.build()).find("unknown tensor type 99"), std::string::npos);
  w = small_file();
  w.tensors[1].dims = {48, 1};  // not a whole number of Q4_1 blocks
  EXPECT_NE(parse_error(w.build()).find("not a multiple of the Q4_1 block"), std::string::npos);
  w = small_file();
  w.tensors[0].dims = {uint64_t{1} << 40, uint64_t{1} << 40};
  EXPECT_NE(parse_error(w.build()).find("tensor 'a': the element count overflows"),
            std::string::npos);
  w = small_file();
  w.tensors[0].dims = {uint64_t{1} << 62};  // the byte size overflows
  EXPECT_NE(parse_error(w.build()).find("byte size overflows"), std::string::npos);
  w = small_file();
  w.tensors[0].dims = {2, 0};
  EXPECT_NE(parse_error(w.build()).find("dimension 1 is 0"), std::string::npos);
  w = small_file();
  w.tensors[0].dims = {1, 1, 1, 1, 1};
  EXPECT_NE(parse_error(w.build()).find("5 dimensions"), std::string::npos);
  w = small_file();
  w.tensors[1].offset = 48;  // not a multiple of 32
  EXPECT_NE(parse_error(w.build()).find("tensor 'q': offset 48 is not a multiple"),
            std::string::npos);
  w = small_file();
  w.tensors[0].dims = {2, 400};  // 3200 bytes in a file of far fewer
  EXPECT_NE(parse_error(w.build()).find("tensor 'a' (3200 bytes at data offset 0) runs past"),
            std::string::npos);
  w = small_file();
  w.tensors[1].name = "a";
  EXPECT_NE(parse_error(w.build()).find("duplicate tensor name 'a'"), std::string::npos);
}

// Mutated headers of a real file (metadata with a 512-token vocabulary, tensor
// infos) parse or fail with an error, never crash; under ASan also never read out
// of bounds.
TEST(GgufReader, MutatedHeadersNeverCrash) {
  std::ifstream in(fs::path(CELLM_SOURCE_DIR) / "tests/fixtures/gguf/qwen2-tiny.gguf",
                   std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Result<GgufParsed> whole = parse(bytes);
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  const size_t header = whole->data_offset;
  uint64_t state = 0x9e3779b97f4a7c15ull;
  const auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  size_t failed = 0;
  for (int round = 0; round < 400; ++round) {
    std::string m = bytes;
    const int flips = 1 + static_cast<int>(next() % 4);
    for (int f = 0; f < flips; ++f) {
      m[next() % header] = static_cast<char>(next() & 0xFF);
    }
    if (next() % 4 == 0) m.resize(next() % m.size());
    Result<GgufParsed> r = parse(m);
    if (!r.ok()) {
      ++failed;
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidProgram);
      EXPECT_EQ(r.status().message().rfind("test.gguf: ", 0), 0u) << r.status().message();
    }
  }
  EXPECT_GT(failed, 0u);
}

TEST(GgufReader, FilesAndPaths) {
  cellm::testing::TempDir dir;
  const fs::path good = dir.path() / "m.GGUF";
  cellm::testing::write_file(good, small_file().build());
  Result<GgufFile> file = GgufFile::open(good);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  float v[8];
  std::memcpy(v, file->data(file->parsed().tensors[0]), sizeof(v));
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_TRUE(is_gguf_path(good));
  const fs::path other = dir.path() / "weights.bin";  // no extension, but the magic
  cellm::testing::write_file(other, small_file().build());
  EXPECT_TRUE(is_gguf_path(other));
  EXPECT_FALSE(is_gguf_path(dir.path()));
  EXPECT_FALSE(is_gguf_path(dir.path() / "missing.gguf"));
  Result<GgufMetadata> m = read_gguf_metadata(good);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*m->get_string("general.architecture").value(), "llama");
  EXPECT_EQ(read_gguf_metadata(dir.path() / "missing.gguf").status().code(), StatusCode::kNotFound);
  // ModelWeights names the problem of a GGUF that is no model.
  Result<ModelWeights> w = ModelWeights::load(good);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("missing metadata 'llama.embedding_length'"),
            std::string::npos)
      << w.status().to_string();
}

}  // namespace
}  // namespace cellm
