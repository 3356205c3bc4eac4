// ModelWeights' random weights and tensor-parallel shards: both walk the whole
// model's weight table and give each weight the region a rank holds (all of it
// for a whole model), so a random shard is the same bytes as a shard of the whole
// random model.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cellm/model_weights.h"
#include "cellm/tensor_parallel.h"
#include "model/half.h"
#include "model/weight_table.h"

namespace cellm {

using weights_internal::RandomInit;
using weights_internal::Slot;
using weights_internal::weight_table;

namespace {

// The part of a [rows, full_cols] weight a rank holds: rows [row_begin, +rows) of
// columns [col_begin, +cols). A 1-D weight of n values is [n, 1].
struct Region {
  int64_t full_cols = 1;
  int64_t row_begin = 0;
  int64_t rows = 0;
  int64_t col_begin = 0;
  int64_t cols = 0;

  bool whole_rows() const { return col_begin == 0 && cols == full_cols; }
};

// The region of the whole model's weight `name` that `plan`'s rank holds (all of it
// without a plan); nullopt when the rank holds none of it (o_proj's bias beyond
// rank 0). The row and column slices are cellm/tensor_parallel.h's.
std::optional<Region> region_of(const std::string& name, const std::vector<int64_t>& shape,
                                const ModelConfig& config, const std::optional<ShardPlan>& plan) {
  const int64_t rows = shape.front();
  const int64_t cols = shape.size() > 1 ? shape[1] : 1;
  const Region whole{cols, 0, rows, 0, cols};
  if (!plan) return whole;
  const int64_t hd = config.head_dim();
  const auto by_rows = [&](int64_t begin, int64_t n) { return Region{cols, begin, n, 0, cols}; };
  const auto by_cols = [&](int64_t begin, int64_t n) { return Region{cols, 0, rows, begin, n}; };
  const auto is = [&](const char* projection) {
    const std::string p = projection;
    return name.ends_with(p + ".weight") || name.ends_with(p + ".bias");
  };
  if (is("self_attn.q_proj")) return by_rows(plan->head_begin * hd, plan->num_heads * hd);
  if (is("self_attn.k_proj") || is("self_attn.v_proj")) {
    return by_rows(plan->kv_head_begin * hd, plan->num_kv_heads * hd);
  }
  if (name.ends_with("self_attn.o_proj.weight")) {
    return by_cols(plan->head_begin * hd, plan->num_heads * hd);
  }
  if (name.ends_with("self_attn.o_proj.bias")) {
    return plan->rank == 0 ? std::optional<Region>(whole) : std::nullopt;
  }
  if (is("mlp.gate_proj") || is("mlp.up_proj")) return by_rows(plan->ffn_begin, plan->ffn_size);
  if (name.ends_with("mlp.down_proj.weight")) return by_cols(plan->ffn_begin, plan->ffn_size);
  if (name == "lm_head.weight") return by_rows(plan->vocab_begin, plan->vocab_size);
  return whole;
}

std::vector<int64_t> region_shape(const std::vector<int64_t>& shape, const Region& r) {
  return shape.size() > 1 ? std::vector<int64_t>{r.rows, r.cols} : std::vector<int64_t>{r.rows};
}

// Rows [begin, begin + n) of `t`: a view of the same bytes (and row scales).
TensorView slice_rows(const TensorView& t, int64_t begin, int64_t n) {
  TensorView out = t;
  const size_t row_bytes = t.nbytes / static_cast<size_t>(t.shape.front());
  out.data = static_cast<const std::byte*>(t.data) + static_cast<size_t>(begin) * row_bytes;
  out.nbytes = static_cast<size_t>(n) * row_bytes;
  out.shape.front() = n;
  if (t.scales) out.scales = t.scales + begin;
  return out;
}

// Columns [r.col_begin, +r.cols) of every row of `t`, copied into a new buffer of
// `buffers`. A block format's columns must fall on its blocks.
Result<TensorView> slice_columns(const TensorView& t, const Region& r, int world,
                                 std::vector<std::vector<std::byte>>& buffers) {
  int64_t unit = 1;
  size_t unit_bytes = dtype_size_bytes(t.dtype);
  if (t.block_type) {
    const std::optional<GgmlTypeInfo> info = ggml_type_info(static_cast<uint32_t>(*t.block_type));
    CELLM_CHECK(info.has_value());
    unit = info->block_elements;
    unit_bytes = info->block_bytes;
    if (r.col_begin % unit != 0 || r.cols % unit != 0) {
      return InvalidArgument("tensor parallel over " + std::to_string(world) + " GPUs: " + t.name +
                             " splits at column " + std::to_string(r.col_begin) + "+" +
                             std::to_string(r.cols) + ", not on its " + info->name + " blocks of " +
                             std::to_string(unit) + " values");
    }
  }
  const size_t src_row = static_cast<size_t>(r.full_cols / unit) * unit_bytes;
  const size_t offset = static_cast<size_t>(r.col_begin / unit) * unit_bytes;
  const size_t row = static_cast<size_t>(r.cols / unit) * unit_bytes;
  const auto rows = static_cast<size_t>(t.shape.front());
  std::vector<std::byte>& bytes = buffers.emplace_back(rows * row);
  const auto* src = static_cast<const std::byte*>(t.data);
  for (size_t i = 0; i < rows; ++i) std::memcpy(&bytes[i * row], src + i * src_row + offset, row);
  TensorView out = t;
  out.data = bytes.data();
  out.nbytes = bytes.size();
  out.shape = region_shape(t.shape, r);
  return out;
}

// The storage of a shard: the whole model's, and the column slices' copies.
struct ShardStorage {
  std::shared_ptr<const void> source;
  std::vector<std::vector<std::byte>> buffers;
};

// The views of `tensors` by checkpoint name (binding `config`'s table on them).
std::unordered_map<std::string, TensorView*> bind_by_name(const ModelConfig& config,
                                                          ModelWeights::Tensors& tensors) {
  std::unordered_map<std::string, TensorView*> views;
  for (const Slot<TensorView>& slot : weight_table(config, tensors)) views[slot.name] = slot.view;
  return views;
}

// A counter-based generator: the value of element i depends only on (key, i).
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Elements [begin, end) of region `r` (row-major over the region) of a weight
// filled from `key` by their index i in the whole weight.
void fill_random(void* data, DType dtype, const Region& r, int64_t begin, int64_t end, uint64_t key,
                 RandomInit init) {
  const float scale = init.half_range * 0x1p-23f;  // 24 random bits -> [-half_range, half_range)
  int64_t row = begin / r.cols;
  int64_t col = begin % r.cols;
  for (int64_t i = begin; i < end; ++i) {
    const int64_t whole = (r.row_begin + row) * r.full_cols + r.col_begin + col;
    if (++col == r.cols) {
      col = 0;
      ++row;
    }
    const uint64_t bits = splitmix64(key ^ static_cast<uint64_t>(whole) * 0xd1b54a32d192ed03ull);
    const float value =
        init.center + scale * (static_cast<float>(bits >> 40) - static_cast<float>(1 << 23));
    switch (dtype) {
      case DType::kBF16:
        static_cast<uint16_t*>(data)[i] = f32_to_bf16(value);
        break;
      case DType::kF16:
        static_cast<uint16_t*>(data)[i] = f32_to_f16(value);
        break;
      case DType::kF32:
        static_cast<float*>(data)[i] = value;
        break;
      case DType::kF8E4M3:  // random weights are float
        break;
    }
  }
}

constexpr size_t kSlabAlignment = 64;

size_t align_up(size_t n) {
  return (n + kSlabAlignment - 1) / kSlabAlignment * kSlabAlignment;
}

}  // namespace

ModelWeights ModelWeights::random(const ModelConfig& config, DType dtype, uint64_t seed) {
  return random_regions(config, config, dtype, seed, std::nullopt);
}

Result<ModelWeights> ModelWeights::random_shard(const ModelConfig& config, DType dtype,
                                                uint64_t seed, const ShardPlan& plan) {
  CELLM_ASSIGN_OR_RETURN(const ModelConfig shard, shard_config(config, plan));
  return random_regions(config, shard, dtype, seed, plan);
}

ModelWeights ModelWeights::random_regions(const ModelConfig& whole, const ModelConfig& config,
                                          DType dtype, uint64_t seed,
                                          const std::optional<ShardPlan>& plan) {
  CELLM_CHECK_MSG(dtype != DType::kF8E4M3, "random weights are float, not F8_E4M3");
  ModelWeights weights(config, nullptr);
  weights.shard_plan_ = plan;
  const std::unordered_map<std::string, TensorView*> views =
      bind_by_name(weights.config_, weights.tensors_);

  // One job per weight the rank holds; the key is the weight's index in the whole
  // model's table, so every rank draws the values of the whole model.
  struct Job {
    uint64_t key;
    TensorView* view;
    Region region;
    RandomInit init;
  };
  std::vector<Job> jobs;
  Tensors whole_tensors;
  const std::vector<Slot<TensorView>> table = weight_table(whole, whole_tensors);
  const size_t element_bytes = dtype_size_bytes(dtype);
  size_t slab_bytes = 0;
  for (size_t s = 0; s < table.size(); ++s) {
    const Slot<TensorView>& slot = table[s];
    const std::optional<Region> region = region_of(slot.name, slot.shape, whole, plan);
    if (!region) continue;
    TensorView& view = *views.at(slot.name);
    view.name = slot.name;
    view.dtype = dtype;
    view.shape = region_shape(slot.shape, *region);
    view.nbytes = static_cast<size_t>(view.numel()) * element_bytes;
    slab_bytes += align_up(view.nbytes);
    jobs.push_back({splitmix64(seed ^ splitmix64(s)), &view, *region, slot.init});
  }
  void* slab = std::aligned_alloc(kSlabAlignment, std::max(slab_bytes, kSlabAlignment));
  CELLM_CHECK_MSG(slab != nullptr,
                  "allocating " + std::to_string(slab_bytes) + " bytes of random weights failed");
  weights.storage_ =
      std::shared_ptr<const void>(slab, [](const void* p) { std::free(const_cast<void*>(p)); });
  size_t offset = 0;
  for (Job& job : jobs) {
    job.view->data = static_cast<std::byte*>(slab) + offset;
    offset += align_up(job.view->nbytes);
  }

  // Work items of up to kChunk elements, taken by the workers in any order; each
  // element's value depends only on (seed, weight, its index in the whole weight).
  constexpr int64_t kChunk = int64_t{1} << 20;
  struct Chunk {
    size_t job;
    int64_t begin;
    int64_t end;
  };
  std::vector<Chunk> chunks;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const int64_t numel = jobs[j].view->numel();
    for (int64_t b = 0; b < numel; b += kChunk)
      chunks.push_back({j, b, std::min(numel, b + kChunk)});
  }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t c = next.fetch_add(1); c < chunks.size(); c = next.fetch_add(1)) {
      const Job& job = jobs[chunks[c].job];
      fill_random(const_cast<void*>(job.view->data), dtype, job.region, chunks[c].begin,
                  chunks[c].end, job.key, job.init);
    }
  };
  const size_t num_threads =
      std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), chunks.size());
  std::vector<std::thread> workers;
  for (size_t t = 1; t < num_threads; ++t) workers.emplace_back(work);
  work();
  for (std::thread& w : workers) w.join();

  if (whole.tie_word_embeddings()) {
    weights.tensors_.lm_head =
        plan ? slice_rows(weights.tensors_.embed_tokens, plan->vocab_begin, plan->vocab_size)
             : weights.tensors_.embed_tokens;
  }
  return weights;
}

Result<ModelWeights> ModelWeights::shard(const ShardPlan& plan) const {
  if (shard_plan_) {
    return InvalidArgument(config_.source() + ": a tensor-parallel shard cannot be split again");
  }
  CELLM_ASSIGN_OR_RETURN(ModelConfig config, shard_config(config_, plan));
  auto storage = std::make_shared<ShardStorage>();
  storage->source = storage_;
  ModelWeights out(std::move(config), storage);
  out.shard_plan_ = plan;
  const std::unordered_map<std::string, TensorView*> views =
      bind_by_name(out.config_, out.tensors_);
  for (const Slot<const TensorView>& slot : weight_table(config_, tensors_)) {
    const std::optional<Region> region = region_of(slot.name, slot.shape, config_, plan);
    if (!region) continue;
    TensorView& view = *views.at(slot.name);
    if (region->whole_rows()) {
      view = slice_rows(*slot.view, region->row_begin, region->rows);
    } else {
      CELLM_ASSIGN_OR_RETURN(view,
                             slice_columns(*slot.view, *region, plan.world, storage->buffers));
    }
  }
  if (config_.tie_word_embeddings()) {
    out.tensors_.lm_head = slice_rows(tensors_.embed_tokens, plan.vocab_begin, plan.vocab_size);
  }
  return out;
}

}  // namespace cellm
