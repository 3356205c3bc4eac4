#include "model/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "model/fp8.h"
#include "model/half.h"
#include "model_test_files.h"

namespace cellm {
namespace {

using testing::counting_tensor;
using testing::safetensors_bytes;
using testing::safetensors_with_header;
using testing::TempDir;
using testing::TestTensor;
using testing::write_file;

void ExpectError(const Status& status, StatusCode code, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), code) << status.to_string();
  for (const std::string& part : parts) {
    EXPECT_NE(status.message().find(part), std::string::npos)
        << "'" << part << "' not in: " << status.message();
  }
}

Status OpenStatus(const std::filesystem::path& path) {
  return SafetensorsFile::open(path).status();
}

float ElementAsFloat(const TensorView& view, int64_t i) {
  switch (view.dtype) {
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(view.data)[i]);
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(view.data)[i]);
    case DType::kF32:
      return static_cast<const float*>(view.data)[i];
    case DType::kF8E4M3:  // the code times its row scale
      return e4m3_to_f32(static_cast<const uint8_t*>(view.data)[i]) *
             view.scales[i / view.shape.back()];
  }
  return 0.0f;
}

TEST(SafetensorsFileTest, ReadsBf16F16AndF32TensorsWithTheirShapesAndValues) {
  TempDir dir;
  write_file(dir / "a.safetensors",
             safetensors_bytes({counting_tensor("w.f32", "F32", {2, 3, 2}, 100.0f),
                                counting_tensor("w.bf16", "BF16", {3, 4}, 1.0f),
                                counting_tensor("w.f16", "F16", {5}, -2.0f)}));
  Result<SafetensorsFile> file = SafetensorsFile::open(dir / "a.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  ASSERT_EQ(file->tensors().size(), 3u);

  const TensorView* bf16 = file->find("w.bf16");
  ASSERT_NE(bf16, nullptr);
  EXPECT_EQ(bf16->dtype, DType::kBF16);
  EXPECT_EQ(bf16->shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(bf16->nbytes, 24u);
  EXPECT_EQ(bf16->numel(), 12);
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(ElementAsFloat(*bf16, i), 1.0f + i);

  const TensorView* f16 = file->find("w.f16");
  ASSERT_NE(f16, nullptr);
  EXPECT_EQ(f16->dtype, DType::kF16);
  EXPECT_EQ(f16->nbytes, 10u);
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(ElementAsFloat(*f16, i), -2.0f + i);

  const TensorView* f32 = file->find("w.f32");
  ASSERT_NE(f32, nullptr);
  EXPECT_EQ(f32->dtype, DType::kF32);
  EXPECT_EQ(f32->shape, (std::vector<int64_t>{2, 3, 2}));
  EXPECT_EQ(f32->nbytes, 48u);
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(ElementAsFloat(*f32, i), 100.0f + i);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f32->data) % 4, 0u);

  EXPECT_EQ(file->find("__metadata__"), nullptr);
  EXPECT_EQ(file->find("missing"), nullptr);
}

TEST(SafetensorsFileTest, ListsTensorsInDataOrderAndAcceptsEmptyTensors) {
  TempDir dir;
  // Header entries in reverse data order: "b" first in JSON but at offset 8.
  const std::string header =
      "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"empty\":{\"dtype\":\"BF16\",\"shape\":[0,7],\"data_offsets\":[16,16]}}";
  write_file(dir / "x.safetensors", safetensors_with_header(header, 16));
  Result<SafetensorsFile> file = SafetensorsFile::open(dir / "x.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  ASSERT_EQ(file->tensors().size(), 3u);
  EXPECT_EQ(file->tensors()[0].name, "a");
  EXPECT_EQ(file->tensors()[1].name, "b");
  EXPECT_EQ(file->tensors()[2].name, "empty");
  EXPECT_EQ(file->tensors()[2].nbytes, 0u);
  EXPECT_EQ(file->tensors()[2].numel(), 0);
}

TEST(SafetensorsFileTest, ViewsStayValidAfterTheFileIsMoved) {
  TempDir dir;
  write_file(dir / "m.safetensors", safetensors_bytes({counting_tensor("t", "F32", {4}, 7.0f)}));
  Result<SafetensorsFile> file = SafetensorsFile::open(dir / "m.safetensors");
  ASSERT_TRUE(file.ok());
  const void* data = file->find("t")->data;
  SafetensorsFile moved = std::move(file).value();
  ASSERT_NE(moved.find("t"), nullptr);
  EXPECT_EQ(moved.find("t")->data, data);
  EXPECT_EQ(ElementAsFloat(*moved.find("t"), 3), 10.0f);
}

TEST(SafetensorsFileTest, AMissingFileIsNotFoundNamingThePath) {
  TempDir dir;
  ExpectError(OpenStatus(dir / "nope.safetensors"), StatusCode::kNotFound, {"nope.safetensors"});
}

TEST(SafetensorsFileTest, AFolderIsAnIoError) {
  TempDir dir;
  ExpectError(OpenStatus(dir.path()), StatusCode::kIoError, {dir.path().string()});
}

TEST(SafetensorsFileTest, AFileShorterThanTheLengthPrefixIsTruncated) {
  TempDir dir;
  write_file(dir / "empty.safetensors", "");
  ExpectError(OpenStatus(dir / "empty.safetensors"), StatusCode::kInvalidProgram,
              {"empty.safetensors", "truncated"});
  write_file(dir / "five.safetensors", "12345");
  ExpectError(OpenStatus(dir / "five.safetensors"), StatusCode::kInvalidProgram,
              {"five.safetensors", "truncated", "5 bytes"});
}

TEST(SafetensorsFileTest, AHeaderLengthPastTheEndOfTheFileIsRejected) {
  TempDir dir;
  write_file(dir / "h.safetensors", testing::le64(64) + "{}");
  ExpectError(OpenStatus(dir / "h.safetensors"), StatusCode::kInvalidProgram,
              {"h.safetensors", "header length 64", "past the end"});
}

TEST(SafetensorsFileTest, AnAbsurdHeaderLengthIsRejectedBeforeReading) {
  TempDir dir;
  write_file(dir / "big.safetensors", testing::le64(uint64_t{1} << 40) + "{}");
  ExpectError(OpenStatus(dir / "big.safetensors"), StatusCode::kInvalidProgram,
              {"big.safetensors", "exceeds"});
}

TEST(SafetensorsFileTest, MalformedHeaderJsonIsRejectedNamingTheFile) {
  TempDir dir;
  write_file(dir / "bad.safetensors", safetensors_with_header("{\"a\": {\"dtype\": ", 0));
  ExpectError(OpenStatus(dir / "bad.safetensors"), StatusCode::kInvalidProgram,
              {"bad.safetensors", "malformed JSON"});
  write_file(dir / "arr.safetensors", safetensors_with_header("[1,2]", 0));
  ExpectError(OpenStatus(dir / "arr.safetensors"), StatusCode::kInvalidProgram,
              {"arr.safetensors", "not a JSON object"});
}

TEST(SafetensorsFileTest, OffsetsOutsideTheDataSectionAreRejected) {
  TempDir dir;
  write_file(dir / "o.safetensors",
             safetensors_with_header(
                 "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 12));
  ExpectError(OpenStatus(dir / "o.safetensors"), StatusCode::kInvalidProgram,
              {"o.safetensors", "'w'", "[0, 16)", "12 bytes"});
}

TEST(SafetensorsFileTest, ATruncatedFileIsRejectedNamingTheTensorPastTheEnd) {
  TempDir dir;
  std::string bytes = safetensors_bytes(
      {counting_tensor("first", "F32", {4}), counting_tensor("second", "F32", {8})});
  write_file(dir / "t.safetensors", bytes.substr(0, bytes.size() - 5));
  ExpectError(OpenStatus(dir / "t.safetensors"), StatusCode::kInvalidProgram,
              {"t.safetensors", "'second'", "truncated"});
}

TEST(SafetensorsFileTest, OffsetsThatDisagreeWithShapeAndDtypeAreRejected) {
  TempDir dir;
  write_file(dir / "s.safetensors",
             safetensors_with_header(
                 "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,16]}}", 16));
  ExpectError(OpenStatus(dir / "s.safetensors"), StatusCode::kInvalidProgram,
              {"s.safetensors", "'w'", "[2, 3]", "BF16", "needs 12"});
  write_file(dir / "r.safetensors",
             safetensors_with_header(
                 "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 16));
  ExpectError(OpenStatus(dir / "r.safetensors"), StatusCode::kInvalidProgram,
              {"r.safetensors", "'w'", "end before they begin"});
}

TEST(SafetensorsFileTest, ShapesWhoseSizeOverflowsAreRejected) {
  TempDir dir;
  write_file(dir / "v.safetensors",
             safetensors_with_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,"
                                     "4294967296],\"data_offsets\":[0,8]}}",
                                     8));
  ExpectError(OpenStatus(dir / "v.safetensors"), StatusCode::kInvalidProgram,
              {"v.safetensors", "'w'"});
  write_file(dir / "n.safetensors",
             safetensors_with_header(
                 "{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8));
  ExpectError(OpenStatus(dir / "n.safetensors"), StatusCode::kInvalidProgram,
              {"n.safetensors", "'w'", "shape"});
}

// Found with the fuzz targets (tests/fuzz): a zero dimension made the tensor empty (0 bytes,
// accepted), but numel() still multiplied the other dimensions past int64 (undefined behaviour) for
// whoever asked.
TEST(SafetensorsFileTest, EmptyShapesWhoseOtherDimensionsOverflowAreRejected) {
  const std::string bytes = safetensors_with_header(
      "{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4611686018427387904,0],"
      "\"data_offsets\":[0,0]}}",
      0);
  Result<std::vector<TensorView>> views = parse_safetensors(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()),
      "mem.safetensors");
  ExpectError(views.status(), StatusCode::kInvalidProgram,
              {"mem.safetensors", "'w'", "[4611686018427387904, 4611686018427387904, 0]",
               "multiply past 2^63"});
}

// Found with the model_config fuzz target (the header parser is shared): a
// number past the range of a double threw out of the parser instead of an error.
TEST(SafetensorsFileTest, AHeaderNumberTooLargeForADoubleIsMalformedJson) {
  TempDir dir;
  write_file(dir / "big.safetensors",
             safetensors_with_header("{\"__metadata__\":{\"x\":-1e999}}", 0));
  ExpectError(OpenStatus(dir / "big.safetensors"), StatusCode::kInvalidProgram,
              {"big.safetensors", "malformed JSON", "number overflow"});
}

// parse_safetensors checks bytes held in memory exactly as open() checks a file.
TEST(SafetensorsFileTest, ParsesAFileHeldInMemory) {
  const std::string bytes = safetensors_with_header(
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"e\":{\"dtype\":\"F16\",\"shape\":[3,0],\"data_offsets\":[8,8]}}",
      8);
  Result<std::vector<TensorView>> views = parse_safetensors(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()),
      "mem.safetensors");
  ASSERT_TRUE(views.ok()) << views.status().to_string();
  ASSERT_EQ(views->size(), 2u);
  EXPECT_EQ((*views)[0].name, "a");
  EXPECT_EQ((*views)[0].nbytes, 8u);
  EXPECT_EQ((*views)[1].numel(), 0);
  EXPECT_EQ(static_cast<const std::byte*>((*views)[0].data),
            reinterpret_cast<const std::byte*>(bytes.data()) + bytes.size() - 8);
}

TEST(SafetensorsFileTest, OverlappingTensorsAreRejected) {
  TempDir dir;
  write_file(dir / "ov.safetensors",
             safetensors_with_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,"
                                     "16]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":"
                                     "[8,16]}}",
                                     16));
  ExpectError(OpenStatus(dir / "ov.safetensors"), StatusCode::kInvalidProgram,
              {"ov.safetensors", "'a'", "'b'", "overlap"});
}

TEST(SafetensorsFileTest, AnUnsupportedDtypeIsNotSupportedNamingTensorAndDtype) {
  TempDir dir;
  write_file(dir / "i.safetensors",
             safetensors_with_header(
                 "{\"pos\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16));
  ExpectError(OpenStatus(dir / "i.safetensors"), StatusCode::kNotSupported,
              {"i.safetensors", "'pos'", "I64"});
}

TEST(SafetensorsFileTest, MissingOrMistypedEntryFieldsAreRejected) {
  TempDir dir;
  write_file(dir / "d.safetensors",
             safetensors_with_header("{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8));
  ExpectError(OpenStatus(dir / "d.safetensors"), StatusCode::kInvalidProgram,
              {"d.safetensors", "'w'", "dtype"});
  write_file(
      dir / "p.safetensors",
      safetensors_with_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8));
  ExpectError(OpenStatus(dir / "p.safetensors"), StatusCode::kInvalidProgram,
              {"p.safetensors", "'w'", "data_offsets"});
  write_file(dir / "e.safetensors", safetensors_with_header("{\"w\":7}", 0));
  ExpectError(OpenStatus(dir / "e.safetensors"), StatusCode::kInvalidProgram,
              {"e.safetensors", "'w'", "object"});
}

TEST(SafetensorsFileTest, MisalignedDataIsRejected) {
  TempDir dir;
  write_file(dir / "al.safetensors",
             safetensors_with_header("{\"pad\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":"
                                     "[0,2]},\"w\":{\"dtype\":\"F32\",\"shape\":[1],"
                                     "\"data_offsets\":[2,6]}}",
                                     8));
  ExpectError(OpenStatus(dir / "al.safetensors"), StatusCode::kInvalidProgram,
              {"al.safetensors", "'w'", "aligned"});
}

std::string IndexJson(const std::vector<std::pair<std::string, std::string>>& weight_map) {
  std::string json = "{\"metadata\":{\"total_size\":0},\"weight_map\":{";
  for (size_t i = 0; i < weight_map.size(); ++i) {
    if (i > 0) json += ',';
    json += '"';
    json += weight_map[i].first;
    json += "\":\"";
    json += weight_map[i].second;
    json += '"';
  }
  return json + "}}";
}

TEST(SafetensorsCheckpointTest, OpensASingleModelSafetensors) {
  TempDir dir;
  write_file(dir / "model.safetensors", safetensors_bytes({counting_tensor("b", "F32", {2}),
                                                           counting_tensor("a", "F16", {3})}));
  Result<SafetensorsCheckpoint> checkpoint = SafetensorsCheckpoint::open_dir(dir.path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().to_string();
  EXPECT_EQ(checkpoint->num_tensors(), 2u);
  EXPECT_EQ(checkpoint->names(), (std::vector<std::string>{"a", "b"}));
  ASSERT_NE(checkpoint->find("a"), nullptr);
  EXPECT_EQ(checkpoint->find("a")->dtype, DType::kF16);
  EXPECT_EQ(checkpoint->find("c"), nullptr);
}

TEST(SafetensorsCheckpointTest, OpensShardsThroughTheIndexAndKeepsViewsValidWhenMoved) {
  TempDir dir;
  write_file(dir / "model-00001-of-00002.safetensors",
             safetensors_bytes({counting_tensor("x", "BF16", {2, 2}, 1.0f),
                                counting_tensor("y", "F32", {3}, 5.0f)}));
  write_file(dir / "model-00002-of-00002.safetensors",
             safetensors_bytes({counting_tensor("z", "F16", {4}, 9.0f)}));
  write_file(dir / "model.safetensors.index.json",
             IndexJson({{"x", "model-00001-of-00002.safetensors"},
                        {"y", "model-00001-of-00002.safetensors"},
                        {"z", "model-00002-of-00002.safetensors"}}));
  Result<SafetensorsCheckpoint> opened = SafetensorsCheckpoint::open_dir(dir.path());
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  SafetensorsCheckpoint checkpoint = std::move(opened).value();
  EXPECT_EQ(checkpoint.files().size(), 2u);
  EXPECT_EQ(checkpoint.names(), (std::vector<std::string>{"x", "y", "z"}));
  ASSERT_NE(checkpoint.find("x"), nullptr);
  ASSERT_NE(checkpoint.find("y"), nullptr);
  ASSERT_NE(checkpoint.find("z"), nullptr);
  EXPECT_EQ(ElementAsFloat(*checkpoint.find("x"), 3), 4.0f);
  EXPECT_EQ(ElementAsFloat(*checkpoint.find("y"), 2), 7.0f);
  EXPECT_EQ(ElementAsFloat(*checkpoint.find("z"), 0), 9.0f);
  EXPECT_EQ(checkpoint.find("z")->shape, (std::vector<int64_t>{4}));
}

TEST(SafetensorsCheckpointTest, AnIndexNamingATensorAbsentFromItsShardIsRejected) {
  TempDir dir;
  write_file(dir / "s1.safetensors", safetensors_bytes({counting_tensor("x", "F32", {1})}));
  write_file(dir / "model.safetensors.index.json",
             IndexJson({{"x", "s1.safetensors"}, {"ghost", "s1.safetensors"}}));
  ExpectError(SafetensorsCheckpoint::open_dir(dir.path()).status(), StatusCode::kInvalidProgram,
              {"model.safetensors.index.json", "'ghost'", "s1.safetensors"});
}

TEST(SafetensorsCheckpointTest, AMissingShardIsNotFoundNamingTheShard) {
  TempDir dir;
  write_file(dir / "model.safetensors.index.json", IndexJson({{"x", "gone.safetensors"}}));
  ExpectError(SafetensorsCheckpoint::open_dir(dir.path()).status(), StatusCode::kNotFound,
              {"gone.safetensors"});
}

TEST(SafetensorsCheckpointTest, ShardNamesOutsideTheFolderAreRejected) {
  TempDir dir;
  write_file(dir / "model.safetensors.index.json", IndexJson({{"x", "../elsewhere.safetensors"}}));
  ExpectError(SafetensorsCheckpoint::open_dir(dir.path()).status(), StatusCode::kInvalidProgram,
              {"model.safetensors.index.json", "'x'", "../elsewhere.safetensors"});
}

TEST(SafetensorsCheckpointTest, AMalformedIndexIsRejectedNamingTheIndex) {
  TempDir dir;
  write_file(dir / "model.safetensors.index.json", "{\"weight_map\": {");
  ExpectError(SafetensorsCheckpoint::open_dir(dir.path()).status(), StatusCode::kInvalidProgram,
              {"model.safetensors.index.json", "malformed JSON"});
  write_file(dir / "model.safetensors.index.json", "{\"metadata\": {}}");
  ExpectError(SafetensorsCheckpoint::open_dir(dir.path()).status(), StatusCode::kInvalidProgram,
              {"model.safetensors.index.json", "weight_map"});
}

TEST(SafetensorsCheckpointTest, AFolderWithoutWeightsIsNotFoundNamingBothFileNames) {
  TempDir dir;
  ExpectError(SafetensorsCheckpoint::open_dir(dir.path()).status(), StatusCode::kNotFound,
              {dir.path().string(), "model.safetensors", "model.safetensors.index.json"});
  ExpectError(SafetensorsCheckpoint::open_dir(dir / "absent").status(), StatusCode::kNotFound,
              {"absent", "does not exist"});
}

TEST(SafetensorsCheckpointTest, ErrorsInsideAShardNameTheShard) {
  TempDir dir;
  write_file(dir / "s1.safetensors", "123");
  write_file(dir / "model.safetensors.index.json", IndexJson({{"x", "s1.safetensors"}}));
  ExpectError(SafetensorsCheckpoint::open_dir(dir.path()).status(), StatusCode::kInvalidProgram,
              {"s1.safetensors", "truncated"});
}

}  // namespace
}  // namespace cellm
