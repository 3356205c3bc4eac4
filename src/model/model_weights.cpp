#include "cellm/model_weights.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>

#include "cellm/gguf.h"
#include "model/fp8.h"
#include "model/fp8_checkpoint.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/half.h"
#include "model/safetensors.h"
#include "model/weight_table.h"

namespace cellm {

using weights_internal::Slot;
using weights_internal::weight_table;

Result<ModelWeights> ModelWeights::load(const std::filesystem::path& dir) {
  if (is_gguf_path(dir)) return load_gguf(dir);
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return NotFound(dir.string() + ": the model folder does not exist");
  }
  CELLM_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::load(dir / "config.json"));
  CELLM_ASSIGN_OR_RETURN(const QuantizationConfig quantization,
                         load_quantization_config(dir / "config.json"));
  CELLM_ASSIGN_OR_RETURN(SafetensorsCheckpoint checkpoint, SafetensorsCheckpoint::open_dir(dir));
  return from_checkpoint(std::move(config), std::move(checkpoint), dir.string(),
                         quantization.present);
}

namespace {

// What the views of a safetensors model point into: the mapped files, and the
// per-row scales of its F8_E4M3 weights (widened to f32, one per row).
struct CheckpointStorage {
  SafetensorsCheckpoint checkpoint;
  std::vector<std::vector<float>> scales;
};

// The first NaN code among `t`'s bytes, or -1.
int64_t first_e4m3_nan(const TensorView& t) {
  const auto* bytes = static_cast<const uint8_t*>(t.data);
  for (size_t i = 0; i < t.nbytes; ++i) {
    if (e4m3_is_nan(bytes[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace

Result<ModelWeights> ModelWeights::from_checkpoint(ModelConfig config,
                                                   SafetensorsCheckpoint checkpoint,
                                                   const std::string& source, bool quantized) {
  auto storage = std::make_shared<CheckpointStorage>(CheckpointStorage{std::move(checkpoint), {}});
  ModelWeights weights(std::move(config), storage);
  for (const Slot<TensorView>& slot : weight_table(weights.config_, weights.tensors_)) {
    const TensorView* found = storage->checkpoint.find(slot.name);
    if (found == nullptr) {
      std::string message = source + ": missing tensor '" + slot.name + "' (expected shape " +
                            shape_to_string(slot.shape) + ")";
      if (slot.name == "lm_head.weight") {
        message += "; config.json does not set tie_word_embeddings";
      }
      return InvalidProgram(std::move(message));
    }
    if (found->shape != slot.shape) {
      // Name the file that holds the tensor (a shard, for sharded checkpoints).
      std::string file = source;
      for (const SafetensorsFile& f : storage->checkpoint.files()) {
        if (f.find(slot.name) == found) file = f.path().string();
      }
      return InvalidProgram(file + ": tensor '" + slot.name + "' has shape " +
                            shape_to_string(found->shape) + ", expected " +
                            shape_to_string(slot.shape) + " from " + weights.config_.source());
    }
    *slot.view = *found;
    if (found->dtype == DType::kF8E4M3) {
      const bool linear = slot.name.ends_with("_proj.weight") || slot.name == "lm_head.weight";
      if (!linear) {
        return NotSupported(source + ": tensor '" + slot.name +
                            "' is F8_E4M3; only linear weights (projections, lm_head) load as FP8");
      }
      if (!quantized) {
        return InvalidProgram(source + ": tensor '" + slot.name +
                              "' is F8_E4M3 but config.json has no quantization_config");
      }
      if (const int64_t at = first_e4m3_nan(*found); at >= 0) {
        return InvalidProgram(source + ": F8_E4M3 tensor '" + slot.name + "' holds NaN at " +
                              std::to_string(at));
      }
      CELLM_ASSIGN_OR_RETURN(std::vector<float> scales,
                             fp8_row_scales(storage->checkpoint, *found, source));
      slot.view->scales = storage->scales.emplace_back(std::move(scales)).data();
    }
  }
  if (weights.config_.tie_word_embeddings())
    weights.tensors_.lm_head = weights.tensors_.embed_tokens;
  weights.mapped_ = true;
  return weights;
}

namespace {

// What the views of a GGUF model point into: the mapping, and the rewritten
// copies of llama's q and k.
struct GgufStorage {
  GgufFile file;
  std::vector<std::vector<std::byte>> copies;
};

// How a GGUF tensor's elements are held: a DType for the float types, or a block
// type the CPU executor's quantized matmul (src/cpu/quant) runs (kept in its blocks, no
// dequantize at load). `cols` is the tensor's row length.
struct GgufElement {
  DType dtype = DType::kF32;
  std::optional<GgmlType> block_type;
};

Result<GgufElement> gguf_element_type(const GgufTensorInfo& t, int64_t cols,
                                      const std::string& source) {
  switch (t.type.type) {
    case GgmlType::kF32:
      return GgufElement{DType::kF32, std::nullopt};
    case GgmlType::kF16:
      return GgufElement{DType::kF16, std::nullopt};
    case GgmlType::kBF16:
      return GgufElement{DType::kBF16, std::nullopt};
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      break;
    default:
      return NotSupported(source + ": tensor " + t.name + " has type " + t.type.name +
                          ", which this build cannot run yet (supported: F32, F16, BF16, Q8_0, "
                          "Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)");
  }
  // Each row must be whole blocks (the matmul's check; the model layer reads the
  // same ggml type table that src/cpu/quant mirrors, since it cannot link it).
  const int64_t per_block = t.type.block_elements;
  if (cols <= 0 || cols % per_block != 0) {
    return InvalidProgram(source + ": tensor " + t.name + " has rows of " + std::to_string(cols) +
                          " weights, not a whole number of " + t.type.name + " blocks of " +
                          std::to_string(per_block));
  }
  const int64_t rows = t.numel() / cols;
  const auto row = static_cast<uint64_t>(cols / per_block) * t.type.block_bytes;
  if (row * static_cast<uint64_t>(rows) != t.nbytes) {
    return InvalidProgram(source + ": tensor " + t.name + " holds " + std::to_string(t.nbytes) +
                          " bytes, not " + std::to_string(rows) + " rows of " +
                          std::to_string(row) + " bytes of " + t.type.name);
  }
  return GgufElement{DType::kF32, t.type.type};
}

}  // namespace

Result<ModelWeights> ModelWeights::load_gguf(const std::filesystem::path& path) {
  const std::string source = path.string();
  CELLM_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
  auto storage = std::make_shared<GgufStorage>(GgufStorage{std::move(file), {}});
  const GgufParsed& parsed = storage->file.parsed();

  const float* rope_freqs = nullptr;
  std::vector<float> rope_divisors;
  if (const GgufTensorInfo* t = parsed.find("rope_freqs.weight")) {
    if (t->type.type != GgmlType::kF32 || t->dims.size() != 1) {
      return NotSupported(source + ": rope_freqs.weight must be a 1-D F32 tensor");
    }
    rope_divisors.resize(static_cast<size_t>(t->dims[0]));
    std::memcpy(rope_divisors.data(), storage->file.data(*t), t->nbytes);
    rope_freqs = rope_divisors.data();
    CELLM_ASSIGN_OR_RETURN(std::optional<std::string> arch,
                           parsed.metadata.get_string("general.architecture"));
    CELLM_ASSIGN_OR_RETURN(std::optional<int64_t> heads,
                           parsed.metadata.get_int(arch.value_or("") + ".attention.head_count"));
    CELLM_ASSIGN_OR_RETURN(std::optional<int64_t> hidden,
                           parsed.metadata.get_int(arch.value_or("") + ".embedding_length"));
    CELLM_ASSIGN_OR_RETURN(std::optional<int64_t> key_length,
                           parsed.metadata.get_int(arch.value_or("") + ".attention.key_length"));
    const int64_t head_dim =
        key_length.value_or(heads && *heads > 0 ? hidden.value_or(0) / *heads : 0);
    if (t->dims[0] * 2 != head_dim) {
      return InvalidProgram(source + ": rope_freqs.weight has " + std::to_string(t->dims[0]) +
                            " entries, expected half the head dim (" + std::to_string(head_dim) +
                            ")");
    }
  }
  CELLM_ASSIGN_OR_RETURN(ModelConfig config, gguf_model_config(parsed, rope_freqs, source));

  ModelWeights weights(std::move(config), storage);
  const bool permuted = gguf_permutes_qk(weights.config_.architecture());
  for (const Slot<TensorView>& slot : weight_table(weights.config_, weights.tensors_)) {
    const std::string name = gguf_tensor_name(slot.name);
    const GgufTensorInfo* t = parsed.find(name);
    if (t == nullptr) {
      return InvalidProgram(source + ": missing tensor '" + name + "' (expected shape " +
                            shape_to_string(slot.shape) + ")");
    }
    if (t->shape() != slot.shape) {
      return InvalidProgram(source + ": tensor '" + name + "' has shape " +
                            shape_to_string(t->shape()) + ", expected " +
                            shape_to_string(slot.shape));
    }
    CELLM_ASSIGN_OR_RETURN(const GgufElement element,
                           gguf_element_type(*t, slot.shape.back(), source));
    TensorView& view = *slot.view;
    view.name = slot.name;
    view.dtype = element.dtype;
    view.block_type = element.block_type;
    view.shape = slot.shape;
    view.nbytes = t->nbytes;
    view.data = storage->file.data(*t);
    // Blocks hold 16-bit scales (every block size is even): 2-byte alignment.
    const size_t align = element.block_type ? 2 : dtype_size_bytes(element.dtype);
    if (reinterpret_cast<uintptr_t>(view.data) % align != 0) {
      return InvalidProgram(source + ": tensor '" + name + "' is not aligned to its " +
                            (element.block_type
                                 ? std::string(t->type.name) + " blocks"
                                 : std::string(to_string(element.dtype)) + " elements") +
                            " (general.alignment " + std::to_string(parsed.alignment) + ")");
    }
    const bool is_q = slot.name.find("self_attn.q_proj.") != std::string::npos;
    const bool is_k = slot.name.find("self_attn.k_proj.") != std::string::npos;
    if (permuted && (is_q || is_k)) {
      const int64_t heads = is_q ? weights.config_.num_heads() : weights.config_.num_kv_heads();
      const int64_t rows = slot.shape[0];
      if (rows % (2 * heads) != 0) {
        return InvalidProgram(source + ": tensor '" + name + "' has " + std::to_string(rows) +
                              " rows, not whole heads of an even size");
      }
      std::vector<std::byte>& copy = storage->copies.emplace_back(t->nbytes);
      unpermute_qk_rows(storage->file.data(*t), copy.data(), rows,
                        t->nbytes / static_cast<size_t>(rows), heads);
      view.data = copy.data();
    }
  }
  if (weights.config_.tie_word_embeddings())
    weights.tensors_.lm_head = weights.tensors_.embed_tokens;
  return weights;
}

namespace {

// The role of the table's weight `name`.
WeightRole role_of(const std::string& name) {
  if (name == "model.embed_tokens.weight") return WeightRole::kEmbedding;
  if (name == "lm_head.weight") return WeightRole::kLmHead;
  if (name.ends_with(".bias")) return WeightRole::kBias;
  if (name.ends_with("_proj.weight")) return WeightRole::kLinear;
  return WeightRole::kNorm;
}

// Bytes a [.., cols] tensor of `numel` elements takes in the converted format, or
// nullopt when its rows are not whole blocks.
std::optional<size_t> converted_bytes(const ConvertedWeight& c, int64_t numel, int64_t cols) {
  if (c.dtype == DType::kF8E4M3 && !c.block_type &&
      static_cast<int64_t>(c.scales.size()) * cols != numel) {
    return std::nullopt;  // one scale per row
  }
  if (!c.block_type) return static_cast<size_t>(numel) * dtype_size_bytes(c.dtype);
  const std::optional<GgmlTypeInfo> info = ggml_type_info(static_cast<uint32_t>(*c.block_type));
  if (!info || cols <= 0 || cols % info->block_elements != 0) return std::nullopt;
  return static_cast<size_t>(numel / info->block_elements) * info->block_bytes;
}

// Hands the whole pages inside [data, data + n) of a read-only file mapping back to
// the kernel; they are read from the file again if touched.
void release_mapped_pages(const void* data, size_t n) {
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (page_size <= 0 || n == 0) return;
  const auto page = static_cast<uintptr_t>(page_size);
  const auto begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t last = (begin + n) / page * page;
  if (last > first) {
    // Advice only: a failure leaves the pages resident, nothing else.
    (void)madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
  }
}

// The storage of a converted copy: the source's, and the converted bytes.
struct ConvertedStorage {
  std::shared_ptr<const void> source;
  std::vector<std::vector<std::byte>> buffers;
  std::vector<std::vector<float>> scales;  // of the F8_E4M3 weights converted to
};

}  // namespace

Result<ModelWeights> ModelWeights::converted(const WeightConverter& convert) const {
  auto storage = std::make_shared<ConvertedStorage>();
  storage->source = storage_;
  ModelWeights out(config_, storage);
  out.shard_plan_ = shard_plan_;
  out.tensors_ = tensors_;
  // The listing walk (it engages no optional slot); its views are out's own.
  const Tensors& listed = out.tensors_;
  for (const Slot<const TensorView>& slot : weight_table(out.config_, listed)) {
    auto& view = const_cast<TensorView&>(*slot.view);
    CELLM_ASSIGN_OR_RETURN(std::optional<ConvertedWeight> c, convert(view, role_of(slot.name)));
    if (!c) continue;
    const int64_t cols = view.shape.empty() ? 1 : view.shape.back();
    const std::optional<size_t> want = converted_bytes(*c, view.numel(), cols);
    if (!want || *want != c->bytes.size()) {
      return InvalidArgument("converting " + slot.name + " " + shape_to_string(view.shape) + ": " +
                             std::to_string(c->bytes.size()) +
                             " bytes do not fit its shape in the format converted to");
    }
    if (mapped_) release_mapped_pages(view.data, view.nbytes);
    std::vector<std::byte>& bytes = storage->buffers.emplace_back(std::move(c->bytes));
    view.data = bytes.data();
    view.nbytes = bytes.size();
    view.dtype = c->dtype;
    view.block_type = c->block_type;
    view.scales = c->dtype == DType::kF8E4M3 && !c->block_type
                      ? storage->scales.emplace_back(std::move(c->scales)).data()
                      : nullptr;
  }
  if (out.config_.tie_word_embeddings()) out.tensors_.lm_head = out.tensors_.embed_tokens;
  return out;
}

const LayerWeights& ModelWeights::layer(int64_t i) const {
  // REQUIRES: 0 <= i < config().num_layers().
  CELLM_CHECK(i >= 0 && i < config_.num_layers());
  return tensors_.layers[static_cast<size_t>(i)];
}

std::vector<const TensorView*> ModelWeights::tensors() const {
  std::vector<const TensorView*> views;
  for (const Slot<const TensorView>& slot : weight_table(config_, tensors_)) {
    views.push_back(slot.view);
  }
  return views;
}

size_t ModelWeights::total_bytes() const {
  size_t total = 0;
  for (const TensorView* view : tensors()) total += view->nbytes;
  return total;
}

}  // namespace cellm
