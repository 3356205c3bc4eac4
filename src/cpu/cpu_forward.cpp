#include "cpu/cpu_forward.h"

#include <algorithm>
#include <array>
#include <optional>

#include "cellm/status.h"
#include "cpu/kernels/activation.h"
#include "cpu/kernels/attention.h"
#include "cpu/kernels/embedding.h"
#include "cpu/kernels/matmul.h"
#include "cpu/kernels/rmsnorm.h"
#include "cpu/kernels/rope.h"
#include "cpu/quant/bf16_dot_matmul.h"
#include "cpu/quant/block_formats.h"
#include "cpu/quant/fp8_matmul.h"
#include "cpu/quant/quant_matmul.h"
#include "model/rope.h"

namespace cellm::cpu {
namespace {

TypedPtr typed(const TensorView& t) {
  return {t.data, t.dtype};
}

TypedPtr typed(const std::optional<TensorView>& t) {
  return t ? typed(*t) : TypedPtr{};
}

// The quant view of a block-format weight [rows, cols]. REQUIRES: w.block_type set.
quant::QuantWeights quant_weights(const TensorView& w) {
  return {w.data, static_cast<quant::QuantType>(static_cast<uint32_t>(*w.block_type)), w.shape[0],
          w.shape[1]};
}

// out[i, :] = the embedding rows of tokens[i], dequantized from their blocks.
void embedding_gather_blocks(const TensorView& table, std::span<const Token> tokens, float* out) {
  const quant::QuantWeights w = quant_weights(table);
  const int64_t row_bytes = quant::row_bytes(w.type, w.cols).value();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const Token t = tokens[i];
    CELLM_CHECK_MSG(t >= 0 && t < w.rows, "embedding_gather: token id out of range");
    quant::dequantize_row(w.type, static_cast<const unsigned char*>(w.data) + t * row_bytes, w.cols,
                          out + static_cast<int64_t>(i) * w.cols);
  }
}

}  // namespace

CpuForward::CpuForward(std::shared_ptr<const ModelWeights> weights, ThreadPool& pool,
                       int64_t max_rows, bool bf16_activations)
    : weights_(std::move(weights)),
      pool_(pool),
      max_rows_(max_rows),
      bf16_dot_(bf16_activations && quant::bf16_dot_supported()) {
  CELLM_CHECK(max_rows > 0);
  const ModelConfig& c = weights_->config();
  inv_freq_ = rope_inv_freq_for(c);
  const auto rows = static_cast<size_t>(max_rows);
  x_.resize(rows * c.hidden_size());
  h_.resize(rows * c.hidden_size());
  o_.resize(rows * c.hidden_size());
  q_.resize(rows * c.q_dim());
  attn_.resize(rows * c.q_dim());
  k_.resize(rows * c.kv_dim());
  v_.resize(rows * c.kv_dim());
  gate_.resize(rows * c.intermediate_size());
  up_.resize(rows * c.intermediate_size());
}

// y = x · Wᵀ (+ bias): block-format weights through quant_matmul (activations
// quantized to 8 bits), bf16 weights through bf16_dot_matmul when asked for (activations
// rounded to bf16), every other weight through cpu::matmul unchanged (exact products).
void CpuForward::linear(const float* x, int64_t m, int64_t k, const TensorView& w, int64_t n,
                        TypedPtr bias, float* y) {
  if (w.block_type) {
    quant::quant_matmul(pool_, x, m, quant_weights(w), bias, y);
  } else if (w.dtype == DType::kF8E4M3) {
    const quant::Fp8Weights w8{static_cast<const uint8_t*>(w.data), w.scales, n, k};
    quant::fp8_matmul(pool_, x, m, w8, bias, y, bf16_dot_);
  } else if (bf16_dot_ && w.dtype == DType::kBF16) {
    quant::bf16_dot_matmul(pool_, x, m, k, static_cast<const uint16_t*>(w.data), n, y);
    quant::add_bias(m, n, bias, y);
  } else {
    matmul(pool_, x, m, k, typed(w), n, bias, y);
  }
}

void CpuForward::linear_shared(const float* x, int64_t m, int64_t k,
                               std::initializer_list<Linear> products) {
  constexpr size_t kMaxProducts = 4;
  CELLM_CHECK(products.size() <= kMaxProducts);
  std::array<quant::QuantProduct, kMaxProducts> blocks;
  std::array<quant::Bf16Product, kMaxProducts> bf16;
  std::array<const Linear*, kMaxProducts> bf16_of;
  size_t n_blocks = 0, n_bf16 = 0;
  for (const Linear& p : products) {
    if (p.w->block_type) {
      blocks[n_blocks++] = quant::QuantProduct{quant_weights(*p.w), p.bias, p.y};
    } else if (bf16_dot_ && p.w->dtype == DType::kBF16) {
      bf16_of[n_bf16] = &p;
      bf16[n_bf16++] = quant::Bf16Product{static_cast<const uint16_t*>(p.w->data), p.n, p.y};
    } else {
      linear(x, m, k, *p.w, p.n, p.bias, p.y);
    }
  }
  if (n_blocks > 0) {
    quant::quant_matmul_shared(pool_, x, m,
                               std::span<const quant::QuantProduct>(blocks.data(), n_blocks));
  }
  if (n_bf16 > 0) {
    quant::bf16_dot_matmul_shared(pool_, x, m, k,
                                  std::span<const quant::Bf16Product>(bf16.data(), n_bf16));
    for (size_t i = 0; i < n_bf16; ++i)
      quant::add_bias(m, bf16_of[i]->n, bf16_of[i]->bias, bf16_of[i]->y);
  }
}

void CpuForward::run(const ForwardSlice& slice, KvStore& kv, std::span<float> logits) {
  const ModelConfig& c = weights_->config();
  const auto n = static_cast<int64_t>(slice.tokens.size());
  const int64_t d = c.hidden_size();
  const auto n_sel = static_cast<int64_t>(slice.selected_rows.size());
  // The LM head's rows: the vocabulary, or a tensor-parallel shard's slice of it.
  const int64_t vocab_out = weights_->lm_head().shape[0];
  CELLM_CHECK(n > 0 && n <= max_rows_);
  CELLM_CHECK(static_cast<int64_t>(slice.positions.size()) == n);
  CELLM_CHECK(static_cast<int64_t>(slice.cells.size()) == n);
  CELLM_CHECK(static_cast<int64_t>(slice.seq_cells.size()) == n);
  CELLM_CHECK(static_cast<int64_t>(logits.size()) == n_sel * vocab_out);

  if (weights_->embed_tokens().block_type) {
    embedding_gather_blocks(weights_->embed_tokens(), slice.tokens, x_.data());
  } else {
    embedding_gather(typed(weights_->embed_tokens()), c.vocab_size(), d, slice.tokens, x_.data());
  }
  for (int64_t l = 0; l < c.num_layers(); ++l) layer(l, slice, n, kv);

  // Final norm only for the rows that need logits; h_ holds them compacted.
  for (int64_t s = 0; s < n_sel; ++s) {
    const int32_t row = slice.selected_rows[static_cast<size_t>(s)];
    CELLM_CHECK(row >= 0 && row < n);
    std::copy_n(x_.begin() + row * d, d, h_.begin() + s * d);
  }
  rmsnorm(pool_, h_.data(), n_sel, d, typed(weights_->final_norm()),
          static_cast<float>(c.rms_norm_eps()), h_.data());
  if (weights_->lm_head().block_type || weights_->lm_head().dtype == DType::kF8E4M3 ||
      (bf16_dot_ && weights_->lm_head().dtype == DType::kBF16)) {
    // h_ holds exactly the selected rows, in order.
    if (n_sel > 0) {
      linear(h_.data(), n_sel, d, weights_->lm_head(), vocab_out, TypedPtr{}, logits.data());
    }
    return;
  }
  std::vector<int32_t> rows(static_cast<size_t>(n_sel));
  for (int64_t s = 0; s < n_sel; ++s) rows[static_cast<size_t>(s)] = static_cast<int32_t>(s);
  cpu::logits(pool_, h_.data(), n_sel, d, rows, typed(weights_->lm_head()), vocab_out,
              logits.data());
}

void CpuForward::layer(int64_t l, const ForwardSlice& slice, int64_t n, KvStore& kv) {
  const ModelConfig& c = weights_->config();
  const LayerWeights& w = weights_->layer(l);
  const int64_t d = c.hidden_size();
  const int64_t hd = c.head_dim();
  const auto eps = static_cast<float>(c.rms_norm_eps());

  // Attention block.
  rmsnorm(pool_, x_.data(), n, d, typed(w.input_norm), eps, h_.data());
  linear_shared(h_.data(), n, d,
                {{&w.q_proj, c.q_dim(), typed(w.q_bias), q_.data()},
                 {&w.k_proj, c.kv_dim(), typed(w.k_bias), k_.data()},
                 {&w.v_proj, c.kv_dim(), typed(w.v_bias), v_.data()}});
  if (c.qk_norm()) {
    rmsnorm(pool_, q_.data(), n * c.num_heads(), hd, typed(w.q_norm), eps, q_.data());
    rmsnorm(pool_, k_.data(), n * c.num_kv_heads(), hd, typed(w.k_norm), eps, k_.data());
  }
  rope(pool_, q_.data(), c.num_heads(), k_.data(), c.num_kv_heads(), n, hd, slice.positions,
       inv_freq_);
  const bool fp8_kv = kv.storage() == KvStorage::kFp8;
  if (fp8_kv) {
    write_kv_e4m3(k_.data(), v_.data(), n, c.num_kv_heads(), hd, slice.cells, kv.k_codes(l),
                  kv.k_scales(l), kv.v_codes(l), kv.v_scales(l), kv.rows());
  } else {
    write_kv(k_.data(), v_.data(), n, c.kv_dim(), slice.cells, kv.k(l), kv.v(l), kv.rows());
  }

  AttentionArgs args;
  args.q = q_.data();
  args.n_rows = n;
  args.n_heads = c.num_heads();
  args.n_kv_heads = c.num_kv_heads();
  args.head_dim = hd;
  if (fp8_kv) {
    args.k_codes = kv.k_codes(l);
    args.v_codes = kv.v_codes(l);
    args.k_scales = kv.k_scales(l);
    args.v_scales = kv.v_scales(l);
  } else {
    args.k_cells = kv.k(l);
    args.v_cells = kv.v(l);
  }
  args.max_cells = kv.rows();
  args.q_pos = slice.positions;
  args.cells_of_row = slice.seq_cells;
  args.window = static_cast<int32_t>(c.window(l));
  args.out = attn_.data();
  attention(pool_, args);
  linear(attn_.data(), n, c.q_dim(), w.o_proj, d, typed(w.o_bias), o_.data());
  if (partial_sums_) partial_sums_(o_.data(), n * d);

  // MLP block: x += o, h = rmsnorm(x) fused.
  add_rmsnorm(pool_, x_.data(), o_.data(), n, d, typed(w.post_attention_norm), eps, h_.data());
  const int64_t ff = c.intermediate_size();
  linear_shared(
      h_.data(), n, d,
      {{&w.gate_proj, ff, TypedPtr{}, gate_.data()}, {&w.up_proj, ff, TypedPtr{}, up_.data()}});
  silu_mul(pool_, gate_.data(), up_.data(), n * ff, gate_.data());
  linear(gate_.data(), n, ff, w.down_proj, d, TypedPtr{}, o_.data());
  if (partial_sums_) partial_sums_(o_.data(), n * d);
  for (int64_t i = 0; i < n * d; ++i) x_[static_cast<size_t>(i)] += o_[static_cast<size_t>(i)];
}

}  // namespace cellm::cpu
