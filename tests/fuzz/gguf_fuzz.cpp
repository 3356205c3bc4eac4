// Fuzzes the GGUF reader (parse_gguf, what GgufFile::open runs on the mapped
// file) and, for what parses, the model config mapping (gguf_model_config) and
// the tokenizer of the tokenizer.ggml.* keys (Tokenizer::from_gguf, then encode
// and decode of a short text). Two input forms:
//   - bytes that start with the magic "GGUF" are a file as they are (mutations
//     of the seeds: the fixtures with their tensors shrunk, and hand-made files
//     with every value type);
//   - anything else builds a file from the bytes: a version, metadata pairs
//     among the keys the model and tokenizer mappings read (mostly of their
//     expected type with values near the edges, sometimes of any type, arrays
//     nested), a tokenizer vocabulary (gpt2 or llama, tokens, scores, types,
//     merges of its own tokens), tensor infos with chosen names, dimensions,
//     ggml types and offsets (mostly aligned and in bounds), the alignment
//     padding and a data section.
// What parses must hold to the format: unique keys and tensor names, an aligned
// data section, every tensor inside the file with numel / block * block bytes
// (its first and last bytes are read: ASan checks the bounds).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "cellm/dtype.h"
#include "cellm/tokenizer.h"
#include "fuzz_check.h"
#include "model/gguf.h"
#include "model/gguf_model.h"

namespace {

using cellm::GgufValueType;

// Little-endian writer of a GGUF file.
struct Writer {
  std::string b;
  template <typename T>
  void put(T v) {
    char raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    b.append(raw, sizeof(T));
  }
  void u32(uint32_t v) { put(v); }
  void u64(uint64_t v) { put(v); }
  void str(const std::string& s) {
    u64(s.size());
    b += s;
  }
  void type(GgufValueType t) { u32(static_cast<uint32_t>(t)); }
};

constexpr GgufValueType kIntegerTypes[] = {
    GgufValueType::kUint32, GgufValueType::kInt32, GgufValueType::kUint64, GgufValueType::kInt64,
    GgufValueType::kUint8,  GgufValueType::kInt8,  GgufValueType::kUint16, GgufValueType::kInt16};

void put_integer(Writer& w, GgufValueType t, int64_t v) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      w.put(static_cast<uint8_t>(v));
      break;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      w.put(static_cast<uint16_t>(v));
      break;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
      w.put(static_cast<uint32_t>(v));
      break;
    default:
      w.put(static_cast<uint64_t>(v));
      break;
  }
}

// An integer near the edges, or small.
int64_t edge_value(FuzzedDataProvider& fdp) {
  switch (fdp.ConsumeIntegralInRange<int>(0, 9)) {
    case 0:
      return fdp.PickValueInArray<int64_t>({0, 1, -1, 2, 3});
    case 1:
      return fdp.PickValueInArray<int64_t>({INT32_MAX, INT32_MIN, UINT32_MAX, INT64_MAX, INT64_MIN,
                                            int64_t{1} << 31, int64_t{1} << 32, int64_t{1} << 40,
                                            int64_t{1} << 62});
    case 2:
      return fdp.ConsumeIntegral<int64_t>();
    default:
      return fdp.ConsumeIntegralInRange<int64_t>(0, 300);
  }
}

std::string short_string(FuzzedDataProvider& fdp, size_t max) {
  return fdp.ConsumeRandomLengthString(max);
}

void put_value(Writer& w, FuzzedDataProvider& fdp, GgufValueType t, int depth);

// Writes a type id and a value of that type (any type; arrays nest; now and then
// the unknown type 13, which the reader must refuse).
void put_any(Writer& w, FuzzedDataProvider& fdp, int depth) {
  auto t = static_cast<GgufValueType>(fdp.ConsumeIntegralInRange<uint32_t>(0, 13));
  if (t == GgufValueType::kArray && depth <= 0) t = GgufValueType::kString;
  w.type(t);
  if (static_cast<uint32_t>(t) <= 12) put_value(w, fdp, t, depth);
}

void put_value(Writer& w, FuzzedDataProvider& fdp, GgufValueType t, int depth) {
  switch (t) {
    case GgufValueType::kFloat32:
      w.put(fdp.ConsumeFloatingPoint<float>());
      return;
    case GgufValueType::kFloat64:
      w.put(fdp.ConsumeFloatingPoint<double>());
      return;
    case GgufValueType::kBool:
      w.put(static_cast<uint8_t>(fdp.ConsumeIntegralInRange<int>(0, 7)
                                     ? fdp.ConsumeBool()
                                     : fdp.ConsumeIntegral<uint8_t>()));
      return;
    case GgufValueType::kString:
      w.str(short_string(fdp, 16));
      return;
    case GgufValueType::kArray:
      break;
    default:
      put_integer(w, t, edge_value(fdp));
      return;
  }
  // An array: its element type, its length (now and then one that does not match
  // what follows), the elements; arrays of arrays nest up to `depth`.
  auto et = static_cast<GgufValueType>(fdp.ConsumeIntegralInRange<uint32_t>(0, 12));
  if (et == GgufValueType::kArray && depth <= 1) et = GgufValueType::kUint8;
  const uint64_t n = fdp.ConsumeIntegralInRange<uint64_t>(0, 6);
  w.type(et);
  w.u64(fdp.ConsumeIntegralInRange<int>(0, 15) ? n : static_cast<uint64_t>(edge_value(fdp)));
  for (uint64_t i = 0; i < n; ++i) put_value(w, fdp, et, depth - 1);
}

// A key's value, mostly an integer of a chosen integer type.
void put_int_value(Writer& w, FuzzedDataProvider& fdp, int64_t likely) {
  const int r = fdp.ConsumeIntegralInRange<int>(0, 15);
  if (r == 0) return put_any(w, fdp, 2);
  const GgufValueType t = r < 10 ? GgufValueType::kUint32 : fdp.PickValueInArray(kIntegerTypes);
  w.type(t);
  put_integer(w, t, r < 13 ? likely : edge_value(fdp));
}

void put_real_value(Writer& w, FuzzedDataProvider& fdp, double likely) {
  const int r = fdp.ConsumeIntegralInRange<int>(0, 15);
  if (r == 0) return put_any(w, fdp, 2);
  if (r < 12) {
    w.type(GgufValueType::kFloat32);
    w.put(static_cast<float>(r < 10 ? likely : fdp.ConsumeFloatingPoint<float>()));
  } else {
    w.type(GgufValueType::kFloat64);
    w.put(fdp.ConsumeFloatingPoint<double>());
  }
}

void put_string_value(Writer& w, FuzzedDataProvider& fdp, const std::string& likely) {
  if (fdp.ConsumeIntegralInRange<int>(0, 15) == 0) return put_any(w, fdp, 2);
  w.type(GgufValueType::kString);
  w.str(likely);
}

void put_bool_value(Writer& w, FuzzedDataProvider& fdp) {
  if (fdp.ConsumeIntegralInRange<int>(0, 15) == 0) return put_any(w, fdp, 2);
  w.type(GgufValueType::kBool);
  w.put(static_cast<uint8_t>(fdp.ConsumeBool()));
}

// The tokenizer.ggml.* arrays of a vocabulary; returns the pairs written.
int put_vocabulary(Writer& w, FuzzedDataProvider& fdp, bool spm) {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  static const char* const kHex = "0123456789ABCDEF";
  if (spm) {
    for (const char* special : {"<unk>", "<s>", "</s>"}) tokens.emplace_back(special);
    types = {2, 3, 3};
    for (int b = 0; b < 256; b += fdp.ConsumeIntegralInRange<int>(1, 64)) {
      tokens.push_back(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">");
      types.push_back(6);
    }
  } else {
    for (int c = '!'; c <= '~'; c += fdp.ConsumeIntegralInRange<int>(1, 8)) {
      tokens.emplace_back(1, static_cast<char>(c));
      types.push_back(1);
    }
    tokens.emplace_back("\xC4\xA0");  // the byte-level space
    types.push_back(1);
  }
  for (int n = fdp.ConsumeIntegralInRange<int>(0, 24); n > 0; --n) {
    std::string piece;
    switch (fdp.ConsumeIntegralInRange<int>(0, 3)) {
      case 0:
        piece = short_string(fdp, 6);
        break;
      case 1:
        piece = (spm ? "\xE2\x96\x81" : "\xC4\xA0") + short_string(fdp, 3);
        break;
      default:
        // Two tokens joined: a merge target.
        piece = tokens[fdp.ConsumeIntegralInRange<size_t>(0, tokens.size() - 1)] +
                tokens[fdp.ConsumeIntegralInRange<size_t>(0, tokens.size() - 1)];
        break;
    }
    tokens.push_back(piece);
    types.push_back(
        fdp.ConsumeIntegralInRange<int>(0, 7) ? 1 : fdp.ConsumeIntegralInRange<int32_t>(0, 7));
  }
  int pairs = 0;
  w.str("tokenizer.ggml.tokens");
  w.type(GgufValueType::kArray);
  w.type(GgufValueType::kString);
  w.u64(tokens.size());
  for (const std::string& t : tokens) w.str(t);
  ++pairs;
  if (spm || fdp.ConsumeIntegralInRange<int>(0, 3) == 0) {
    w.str("tokenizer.ggml.scores");
    w.type(GgufValueType::kArray);
    w.type(GgufValueType::kFloat32);
    const size_t n = tokens.size() - (fdp.ConsumeIntegralInRange<int>(0, 15) == 0 ? 1 : 0);
    w.u64(n);
    for (size_t i = 0; i < n; ++i) {
      w.put(fdp.ConsumeIntegralInRange<int>(0, 3) ? -static_cast<float>(i)
                                                  : fdp.ConsumeFloatingPoint<float>());
    }
    ++pairs;
  }
  if (fdp.ConsumeIntegralInRange<int>(0, 7)) {
    w.str("tokenizer.ggml.token_type");
    w.type(GgufValueType::kArray);
    w.type(GgufValueType::kInt32);
    const size_t n = types.size() - (fdp.ConsumeIntegralInRange<int>(0, 15) == 0 ? 1 : 0);
    w.u64(n);
    for (size_t i = 0; i < n; ++i) w.put(types[i]);
    ++pairs;
  }
  if (!spm) {
    std::vector<std::string> merges;
    for (int n = fdp.ConsumeIntegralInRange<int>(0, 16); n > 0; --n) {
      const auto pick = [&] {
        return fdp.ConsumeIntegralInRange<int>(0, 5) == 0
                   ? short_string(fdp, 3)
                   : tokens[fdp.ConsumeIntegralInRange<size_t>(0, tokens.size() - 1)];
      };
      const std::string left = pick();
      merges.push_back(left + (fdp.ConsumeIntegralInRange<int>(0, 15) ? " " : "") + pick());
    }
    w.str("tokenizer.ggml.merges");
    w.type(GgufValueType::kArray);
    w.type(GgufValueType::kString);
    w.u64(merges.size());
    for (const std::string& m : merges) w.str(m);
    ++pairs;
  }
  return pairs;
}

struct TensorPlan {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type = 0;
  uint64_t offset = 0;
};

// A GGUF file from the fuzzer's bytes (see the top of the file).
std::string build_file(FuzzedDataProvider& fdp) {
  Writer meta;
  int pairs = 0;
  const std::string arch = fdp.ConsumeIntegralInRange<int>(0, 15)
                               ? fdp.PickValueInArray<std::string>({"llama", "qwen2", "qwen3"})
                               : short_string(fdp, 8);
  const int64_t heads = fdp.PickValueInArray<int64_t>({1, 2, 4});
  const int64_t kv_heads = fdp.PickValueInArray<int64_t>({1, 2, 4});
  const int64_t head_dim = fdp.PickValueInArray<int64_t>({2, 4, 8, 16});
  const int64_t hidden = heads * head_dim;
  const int64_t vocab = fdp.ConsumeIntegralInRange<int64_t>(1, 512);
  uint64_t alignment = cellm::kGgufDefaultAlignment;

  const auto key = [&](const std::string& k) {
    meta.str(k);
    ++pairs;
  };
  const std::string a = arch + ".";
  for (int n = fdp.ConsumeIntegralInRange<int>(0, 28); n > 0 && fdp.remaining_bytes() > 0; --n) {
    switch (fdp.ConsumeIntegralInRange<int>(0, 27)) {
      case 0:
        key("general.architecture");
        put_string_value(meta, fdp, arch);
        break;
      case 1: {
        key("general.alignment");
        const int64_t v = fdp.PickValueInArray<int64_t>({32, 64, 8, 1, 0, 3, 48, -32, 1 << 20});
        put_int_value(meta, fdp, v);
        if (v > 0 && (v & (v - 1)) == 0) alignment = static_cast<uint64_t>(v);
        break;
      }
      case 2:
        key(a + "embedding_length");
        put_int_value(meta, fdp, hidden);
        break;
      case 3:
        key(a + "block_count");
        put_int_value(meta, fdp, fdp.ConsumeIntegralInRange<int64_t>(1, 4));
        break;
      case 4:
        key(a + "feed_forward_length");
        put_int_value(meta, fdp, 2 * hidden);
        break;
      case 5:
        key(a + "attention.head_count");
        put_int_value(meta, fdp, heads);
        break;
      case 6:
        key(a + "attention.head_count_kv");
        put_int_value(meta, fdp, kv_heads);
        break;
      case 7:
        key(a + "attention.key_length");
        put_int_value(meta, fdp, head_dim);
        break;
      case 8:
        key(a + "attention.value_length");
        put_int_value(meta, fdp, head_dim);
        break;
      case 9:
        key(a + "context_length");
        put_int_value(meta, fdp, 256);
        break;
      case 10:
        key(a + "vocab_size");
        put_int_value(meta, fdp, vocab);
        break;
      case 11:
        key(a + "rope.dimension_count");
        put_int_value(meta, fdp, head_dim);
        break;
      case 12:
        key(a + "attention.layer_norm_rms_epsilon");
        put_real_value(meta, fdp, 1e-5);
        break;
      case 13:
        key(a + "rope.freq_base");
        put_real_value(meta, fdp, 10000.0);
        break;
      case 14:
        key(a + "rope.scaling.type");
        put_string_value(meta, fdp, fdp.PickValueInArray<std::string>({"none", "llama3", ""}));
        break;
      case 15:
        key(a + "rope.scaling.original_context_length");
        put_int_value(meta, fdp, 64);
        break;
      case 16:
        key("tokenizer.ggml.model");
        put_string_value(meta, fdp, fdp.PickValueInArray<std::string>({"gpt2", "llama", "bert"}));
        break;
      case 17:
        key("tokenizer.ggml.pre");
        put_string_value(meta, fdp,
                         fdp.PickValueInArray<std::string>(
                             {"default", "gpt2", "llama-bpe", "qwen2", "smollm", "", "x"}));
        break;
      case 18:
        pairs += put_vocabulary(meta, fdp, fdp.ConsumeBool());
        break;
      case 19:
      case 20:
        key(fdp.PickValueInArray<std::string>(
            {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
             "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id",
             "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id"}));
        put_int_value(meta, fdp, fdp.ConsumeIntegralInRange<int64_t>(0, 40));
        break;
      case 21:
        key(fdp.PickValueInArray<std::string>({"tokenizer.ggml.add_bos_token",
                                               "tokenizer.ggml.add_eos_token",
                                               "tokenizer.ggml.add_space_prefix"}));
        put_bool_value(meta, fdp);
        break;
      case 22:
        key("tokenizer.chat_template");
        put_string_value(meta, fdp, short_string(fdp, 64));
        break;
      default:
        // Any key (sometimes a duplicate of one above), any value.
        key(fdp.ConsumeBool() ? "general.name" : short_string(fdp, 24));
        put_any(meta, fdp, 3);
        break;
    }
  }

  // Tensor infos: names the model mapping looks for, types with and without blocks.
  static const char* const kNames[] = {"token_embd.weight",   "output.weight",
                                       "rope_freqs.weight",   "output_norm.weight",
                                       "blk.0.attn_q.bias",   "blk.0.attn_output.bias",
                                       "blk.0.attn_q.weight", "blk.1.ffn_down.weight"};
  static const uint32_t kTypes[] = {0, 1, 30, 8, 2, 3, 6, 12, 14, 10, 24, 28};
  std::vector<TensorPlan> tensors;
  uint64_t data_end = 0;
  for (int n = fdp.ConsumeIntegralInRange<int>(0, 6); n > 0; --n) {
    TensorPlan t;
    t.name = fdp.ConsumeIntegralInRange<int>(0, 7) ? fdp.PickValueInArray(kNames)
                                                   : short_string(fdp, 12);
    t.type = fdp.ConsumeIntegralInRange<int>(0, 15) ? fdp.PickValueInArray(kTypes)
                                                    : fdp.ConsumeIntegralInRange<uint32_t>(0, 48);
    const std::optional<cellm::GgmlTypeInfo> info = cellm::ggml_type_info(t.type);
    const int64_t block = info ? info->block_elements : 1;
    uint64_t numel = 1;
    const int n_dims = fdp.ConsumeIntegralInRange<int>(0, 15)
                           ? fdp.ConsumeIntegralInRange<int>(1, 4)
                           : fdp.ConsumeIntegralInRange<int>(0, 6);
    for (int d = 0; d < n_dims; ++d) {
      uint64_t dim = fdp.ConsumeIntegralInRange<uint64_t>(1, 4);
      if (d == 0) dim *= static_cast<uint64_t>(block);
      if (fdp.ConsumeIntegralInRange<int>(0, 31) == 0) dim = static_cast<uint64_t>(edge_value(fdp));
      t.dims.push_back(dim);
      numel *= dim;  // wraps on purpose for edge dimensions
    }
    const uint64_t nbytes = info ? numel / static_cast<uint64_t>(block) * info->block_bytes : numel;
    t.offset = (data_end + alignment - 1) / alignment * alignment;
    if (fdp.ConsumeIntegralInRange<int>(0, 15) == 0) {
      t.offset = fdp.ConsumeBool() ? t.offset + fdp.ConsumeIntegralInRange<uint64_t>(1, 40)
                                   : static_cast<uint64_t>(edge_value(fdp));
    }
    if (nbytes < 4096 && t.offset < 65536) data_end = std::max(data_end, t.offset + nbytes);
    tensors.push_back(std::move(t));
  }

  Writer w;
  w.u32(0x46554747);
  w.u32(fdp.ConsumeIntegralInRange<int>(0, 15) ? 3 : fdp.PickValueInArray<uint32_t>({2, 1, 4}));
  w.u64(fdp.ConsumeIntegralInRange<int>(0, 15) ? tensors.size()
                                               : static_cast<uint64_t>(edge_value(fdp)));
  w.u64(fdp.ConsumeIntegralInRange<int>(0, 15) ? static_cast<uint64_t>(pairs)
                                               : static_cast<uint64_t>(edge_value(fdp)));
  w.b += meta.b;
  for (const TensorPlan& t : tensors) {
    w.str(t.name);
    w.u32(static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) w.u64(d);
    w.u32(t.type);
    w.u64(t.offset);
  }
  // Padding to the alignment (sometimes short), then the data section (sometimes
  // short), its bytes from the input.
  size_t pad = (alignment - w.b.size() % alignment) % alignment;
  if (fdp.ConsumeIntegralInRange<int>(0, 15) == 0) pad = fdp.ConsumeIntegralInRange<size_t>(0, pad);
  w.b.append(pad, '\0');
  uint64_t data = data_end;
  if (fdp.ConsumeIntegralInRange<int>(0, 15) == 0)
    data -= std::min<uint64_t>(data, 1 + fdp.ConsumeIntegralInRange<uint64_t>(0, 64));
  std::string bytes = fdp.ConsumeBytesAsString(static_cast<size_t>(data));
  bytes.resize(static_cast<size_t>(data), '\0');
  w.b += bytes;
  return w.b;
}

// The tokenizer.ggml.* keys as the text layer's GgufVocab, as the engine reads them
// (src/engine/model_loading.cpp); false when a key has the wrong type.
bool read_vocab(const cellm::GgufMetadata& m, cellm::GgufVocab& v) {
  auto model = m.get_string("tokenizer.ggml.model");
  auto pre = m.get_string("tokenizer.ggml.pre");
  auto tokens = m.get_strings("tokenizer.ggml.tokens");
  auto scores = m.get_reals("tokenizer.ggml.scores");
  auto types = m.get_ints("tokenizer.ggml.token_type");
  auto merges = m.get_strings("tokenizer.ggml.merges");
  if (!model.ok() || !*model || !pre.ok() || !tokens.ok() || *tokens == nullptr || !scores.ok() ||
      !types.ok() || !merges.ok()) {
    return false;
  }
  v.model = **model;
  v.pre = pre->value_or("");
  v.tokens = **tokens;
  if (*scores) v.scores.assign((*scores)->begin(), (*scores)->end());
  if (*types) v.token_types.assign((*types)->begin(), (*types)->end());
  if (*merges) v.merges = **merges;
  const auto id = [&](const char* key, std::optional<cellm::Token>& out) {
    auto value = m.get_int(key);
    if (!value.ok()) return false;
    if (*value) {
      if (**value < 0 || **value > INT32_MAX) return false;
      out = static_cast<cellm::Token>(**value);
    }
    return true;
  };
  if (!id("tokenizer.ggml.bos_token_id", v.bos_id) ||
      !id("tokenizer.ggml.eos_token_id", v.eos_id) ||
      !id("tokenizer.ggml.eot_token_id", v.eot_id) ||
      !id("tokenizer.ggml.eom_token_id", v.eom_id) ||
      !id("tokenizer.ggml.unknown_token_id", v.unk_id) ||
      !id("tokenizer.ggml.padding_token_id", v.pad_id)) {
    return false;
  }
  auto add_bos = m.get_bool("tokenizer.ggml.add_bos_token");
  auto add_eos = m.get_bool("tokenizer.ggml.add_eos_token");
  auto space = m.get_bool("tokenizer.ggml.add_space_prefix");
  if (!add_bos.ok() || !add_eos.ok() || !space.ok()) return false;
  v.add_bos = *add_bos;
  v.add_eos = *add_eos;
  v.add_space_prefix = *space;
  return true;
}

void check_parsed(const cellm::GgufParsed& p, size_t size) {
  std::set<std::string> keys;
  for (const auto& [k, v] : p.metadata.entries()) {
    FUZZ_CHECK(keys.insert(k).second, "metadata keys are unique");
    if (v.is_array()) {
      FUZZ_CHECK(v.array_size() == v.integers.size() || v.array_size() == v.reals.size() ||
                     v.array_size() == v.strings.size() || v.array_size() == v.arrays.size(),
                 "an array holds one kind of element");
    }
  }
  FUZZ_CHECK(p.alignment > 0 && (p.alignment & (p.alignment - 1)) == 0,
             "the alignment is a power of two");
  FUZZ_CHECK(p.data_offset % p.alignment == 0, "the data section is aligned");
  std::set<std::string> names;
  volatile uint8_t sink = 0;
  for (const cellm::GgufTensorInfo& t : p.tensors) {
    FUZZ_CHECK(names.insert(t.name).second, "tensor names are unique");
    FUZZ_CHECK(p.find(t.name) == &t, "find gives the tensor");
    FUZZ_CHECK(!t.dims.empty() && t.dims.size() <= 4, "1 to 4 dimensions");
    for (int64_t d : t.dims) FUZZ_CHECK(d > 0, "positive dimensions");
    FUZZ_CHECK(t.dims[0] % t.type.block_elements == 0, "whole blocks");
    FUZZ_CHECK(
        static_cast<uint64_t>(t.numel() / t.type.block_elements) * t.type.block_bytes == t.nbytes,
        "nbytes = numel / block * block bytes");
    FUZZ_CHECK(t.offset % p.alignment == 0, "tensors are aligned");
    FUZZ_CHECK(p.data_offset <= size && t.offset <= size - p.data_offset &&
                   t.nbytes <= size - p.data_offset - t.offset,
               "a tensor lies inside the file");
  }
  (void)sink;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string file;
  if (size >= 4 && std::memcmp(data, "GGUF", 4) == 0) {
    file.assign(reinterpret_cast<const char*>(data), size);
  } else {
    FuzzedDataProvider fdp(data, size);
    file = build_file(fdp);
  }
  // A copy of exactly the file's bytes, so ASan sees a read past its end.
  std::vector<std::byte> bytes(file.size());
  std::memcpy(bytes.data(), file.data(), file.size());
  cellm::Result<cellm::GgufParsed> parsed =
      cellm::parse_gguf(std::span<const std::byte>(bytes.data(), bytes.size()), "fuzz.gguf");
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.status().message().rfind("fuzz.gguf", 0) == 0, "an error names the file");
    return 0;
  }
  const cellm::GgufParsed& p = *parsed;
  check_parsed(p, bytes.size());
  volatile uint8_t sink = 0;
  for (const cellm::GgufTensorInfo& t : p.tensors) {
    if (t.nbytes == 0) continue;
    const std::byte* first = bytes.data() + p.data_offset + t.offset;
    sink = sink ^ static_cast<uint8_t>(first[0]) ^ static_cast<uint8_t>(first[t.nbytes - 1]);
  }
  (void)sink;

  // The model config, with rope_freqs.weight as ModelWeights::load_gguf passes it:
  // a 1-D F32 tensor of half the head dim.
  std::vector<float> rope;
  const float* rope_freqs = nullptr;
  if (const cellm::GgufTensorInfo* t = p.find("rope_freqs.weight")) {
    const auto integer = [&](const std::string& key) -> std::optional<int64_t> {
      auto v = p.metadata.get_int(key);
      return v.ok() ? *v : std::nullopt;
    };
    auto arch = p.metadata.get_string("general.architecture");
    const std::string a = (arch.ok() ? arch->value_or("") : "") + ".";
    const std::optional<int64_t> heads = integer(a + "attention.head_count");
    const std::optional<int64_t> hidden = integer(a + "embedding_length");
    const int64_t head_dim = integer(a + "attention.key_length")
                                 .value_or(heads && *heads > 0 ? hidden.value_or(0) / *heads : 0);
    if (t->type.type == cellm::GgmlType::kF32 && t->dims.size() == 1 &&
        t->dims[0] * 2 == head_dim) {
      rope.resize(static_cast<size_t>(t->dims[0]));
      std::memcpy(rope.data(), bytes.data() + p.data_offset + t->offset, t->nbytes);
      rope_freqs = rope.data();
    }
  }
  cellm::Result<cellm::ModelConfig> config = cellm::gguf_model_config(p, rope_freqs, "fuzz.gguf");
  if (config.ok()) {
    const cellm::ModelConfig& c = *config;
    FUZZ_CHECK(c.q_dim() == c.num_heads() * c.head_dim(), "q_dim = heads * head_dim");
    FUZZ_CHECK(c.num_queries_per_kv() * c.num_kv_heads() == c.num_heads(), "kv heads divide heads");
    for (cellm::Token id : c.eos_token_ids()) {
      FUZZ_CHECK(id >= 0 && id < c.vocab_size(), "eos ids inside the vocabulary");
    }
    FUZZ_CHECK(c.num_parameters() > 0, "a positive parameter count");
  } else {
    FUZZ_CHECK(config.status().message().find("fuzz.gguf") != std::string::npos,
               "a config error names the file");
  }

  cellm::GgufVocab vocab;
  if (!read_vocab(p.metadata, vocab)) return 0;
  cellm::Result<cellm::Tokenizer> tok = cellm::Tokenizer::from_gguf(vocab, "fuzz.gguf");
  if (!tok.ok()) {
    FUZZ_CHECK(tok.status().message().rfind("fuzz.gguf", 0) == 0,
               "a tokenizer error names the file");
    return 0;
  }
  static const std::string kTexts[] = {"Hello, world! 123", " \xE2\x96\x81 a\tb\n\n",
                                       "\xC3\xA9\xF0\x9F\x98\x80\xFF<s></s>"};
  for (const std::string& text : kTexts) {
    const std::vector<cellm::Token> ids = tok->encode(text, /*add_special_tokens=*/true);
    for (cellm::Token id : ids) {
      FUZZ_CHECK(id >= 0 && static_cast<size_t>(id) < tok->vocab_size(),
                 "ids inside the vocabulary");
    }
    (void)tok->decode(ids);
    (void)tok->decode(ids, /*skip_special_tokens=*/true);
    cellm::IncrementalDecoder stream(*tok);
    for (cellm::Token id : ids) (void)stream.feed(id);
    (void)stream.flush();
  }
  const std::vector<cellm::Token> odd = {-1, 0, static_cast<cellm::Token>(tok->vocab_size()),
                                         std::numeric_limits<cellm::Token>::max()};
  (void)tok->decode(odd);
  return 0;
}
