#include "support/history_executor.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <new>
#include <utility>

#include "core/step_plan.h"

namespace cellm::testing {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t mix(uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z;
}

int32_t resolved_cells(const HistoryExecutorOptions& o) {
  if (o.max_cells > 0) return o.max_cells;
  return o.max_sessions * o.max_session_tokens + 1;
}

}  // namespace

HistoryExecutor::HistoryExecutor(const HistoryExecutorOptions& options)
    : options_(options),
      pool_(resolved_cells(options) - 1),
      table_(pool_, options.max_sessions, options.max_session_tokens, options.vocab_size,
             options.prefix_cache),
      cell_token_(static_cast<size_t>(pool_.capacity()), 0) {
  CELLM_CHECK(options.step_width > 0);
}

std::vector<float> HistoryExecutor::logits_for(std::span<const Token> history, int32_t vocab_size) {
  // Chained over (position, all 32 bits of the token): order, content and
  // length all reach the hash.
  uint64_t h = 0xCBF29CE484222325ull;
  for (size_t i = 0; i < history.size(); ++i) {
    const uint64_t word = (static_cast<uint64_t>(i) << 32) | static_cast<uint32_t>(history[i]);
    h = mix(h ^ mix(word + kGolden));
  }
  std::vector<float> row(static_cast<size_t>(vocab_size));
  for (int32_t v = 0; v < vocab_size; ++v) {
    const uint64_t bits = mix(h + (static_cast<uint64_t>(v) + 1) * kGolden);
    // In [-4, 4): enough spread that temperature, top-k/p and min-p matter.
    row[static_cast<size_t>(v)] = static_cast<float>(bits >> 40) * 0x1p-24f * 8.0f - 4.0f;
  }
  return row;
}

std::vector<Token> HistoryExecutor::greedy_continuation(std::vector<Token> history, int n) const {
  std::vector<Token> out;
  std::vector<float> scratch;
  for (int i = 0; i < n; ++i) {
    const std::vector<float> row = logits_for(history, options_.vocab_size);
    const Token next = sample_token(row, SamplingParams{}, 0.0f, scratch);
    out.push_back(next);
    history.push_back(next);
  }
  return out;
}

// ---------------------------------------------------------------------------
// Failure injection and observations.

void HistoryExecutor::refuse_next_clones(int n) {
  std::lock_guard<std::mutex> lock(mu_);
  refuse_next_ = n;
}

void HistoryExecutor::refuse_clones_of(SessionId source, bool refuse) {
  std::lock_guard<std::mutex> lock(mu_);
  if (refuse) {
    refused_sources_.insert(source);
  } else {
    refused_sources_.erase(source);
  }
}

void HistoryExecutor::fail_next_clone_allocations(int n) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_allocations_ = n;
}

void HistoryExecutor::set_retention_window(std::optional<Position> window) {
  std::lock_guard<std::mutex> lock(mu_);
  retention_window_ = window;
}

void HistoryExecutor::hold() {
  std::lock_guard<std::mutex> lock(mu_);
  held_ = true;
}

void HistoryExecutor::release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = false;
  }
  cv_.notify_all();
}

bool HistoryExecutor::wait_parked() const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::seconds(5), [this] { return parked_; });
}

int HistoryExecutor::open_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.size();
}

bool HistoryExecutor::wait_open_count(int n) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::seconds(5), [&] { return table_.size() == n; });
}

bool HistoryExecutor::is_open(SessionId sid) const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.seq_of(sid).has_value();
}

bool HistoryExecutor::wait_closed(SessionId sid) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::seconds(5), [&] { return !table_.seq_of(sid); });
}

std::vector<Token> HistoryExecutor::history(SessionId sid) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::optional<SeqId> seq = table_.seq_of(sid);
  if (!seq) return {};
  return read_history(*seq, pool_.pos(*seq));
}

std::vector<HistoryInput> HistoryExecutor::inputs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return inputs_;
}

std::vector<HistoryInput> HistoryExecutor::inputs_of(SessionId sid) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<HistoryInput> out;
  for (const HistoryInput& in : inputs_) {
    if (in.sid == sid) out.push_back(in);
  }
  return out;
}

std::vector<std::vector<SessionId>> HistoryExecutor::batches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return batches_;
}

std::vector<HistoryClone> HistoryExecutor::clones() const {
  std::lock_guard<std::mutex> lock(mu_);
  return clones_;
}

std::vector<std::string> HistoryExecutor::errors() const {
  std::lock_guard<std::mutex> lock(mu_);
  return errors_;
}

int32_t HistoryExecutor::cells_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pool_.used_cells();
}

// ---------------------------------------------------------------------------
// Executor.

size_t HistoryExecutor::preferred_batch_tokens() const {
  return static_cast<size_t>(options_.step_width);
}

std::optional<SessionId> HistoryExecutor::open_session() {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.open();
}

void HistoryExecutor::close_session(SessionId id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    table_.close(id);
    pool_.check_invariants();
  }
  cv_.notify_all();
}

std::optional<SessionId> HistoryExecutor::clone(SessionId source, Position upto) {
  std::lock_guard<std::mutex> lock(mu_);
  HistoryClone& call = clones_.emplace_back(HistoryClone{source, upto, std::nullopt});
  if (fail_allocations_ > 0) {
    fail_allocations_--;
    throw std::bad_alloc();
  }
  if (refuse_next_ > 0) {
    refuse_next_--;
    return std::nullopt;
  }
  if (refused_sources_.count(source) > 0) return std::nullopt;
  if (retention_window_) {
    const std::optional<SeqId> seq = table_.seq_of(source);
    if (seq && pool_.pos(*seq) - upto > *retention_window_) return std::nullopt;
  }
  call.child = table_.clone(source, upto);
  pool_.check_invariants();
  return call.child;
}

void HistoryExecutor::set_sampling(SessionId id, const SamplingParams& params,
                                   std::optional<uint64_t> seed) {
  std::lock_guard<std::mutex> lock(mu_);
  table_.set_sampling(id, params, seed);
}

bool HistoryExecutor::set_logits_processor(SessionId id,
                                           std::shared_ptr<LogitsProcessor> processor) {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.set_logits_processor(id, std::move(processor));
}

Status HistoryExecutor::fail(std::string message) {
  errors_.push_back(message);
  return Internal("HistoryExecutor: " + message);
}

std::vector<Token> HistoryExecutor::read_history(SeqId seq, Position end) const {
  const std::span<const CellId> cells = pool_.cells_of(seq);
  CELLM_CHECK(end >= 0 && static_cast<size_t>(end) <= cells.size());
  std::vector<Token> tokens;
  tokens.reserve(static_cast<size_t>(end));
  for (Position p = 0; p < end; ++p) {
    const CellId cell = cells[static_cast<size_t>(p)];
    CELLM_CHECK_MSG(pool_.cell_position(cell) == p, "a cell holds the wrong position");
    tokens.push_back(cell_token_[static_cast<size_t>(cell)]);
  }
  return tokens;
}

Status HistoryExecutor::execute(const BatchInput& batch, BatchOutput& out) {
  std::unique_lock<std::mutex> lock(mu_);
  if (held_) {
    parked_ = true;
    cv_.notify_all();
    cv_.wait(lock, [this] { return !held_; });
    parked_ = false;
  }
  const int64_t index = n_batches_++;
  out.outputs.assign(batch.inputs.size(), std::nullopt);
  std::vector<SessionId>& sids = batches_.emplace_back();
  for (const Input& in : batch.inputs) {
    sids.push_back(in.sid);
    HistoryInput record{index, in.sid, in.start(), {}, in.produce_output};
    if (in.tokens && in.offset <= in.tokens->size() && in.size <= in.tokens->size() - in.offset) {
      for (size_t i = 0; i < in.size; ++i) record.tokens.push_back(in.token(i));
    }
    inputs_.push_back(std::move(record));
  }

  Result<PackedStep> packed_or = table_.pack(batch);
  if (!packed_or.ok()) return fail(packed_or.status().to_string());
  const PackedStep& packed = *packed_or;

  const auto total = static_cast<int>(packed.tokens.size());
  for (const StepSlice& slice :
       plan_slices(total, options_.step_width, options_.min_prefill_tokens)) {
    const auto off = static_cast<size_t>(slice.offset);
    const auto len = static_cast<size_t>(slice.length);
    const std::span<const SeqId> seq_ids(packed.seq_ids.data() + off, len);
    const std::optional<StepPlacement> placement = pool_.declare_step(seq_ids);
    if (!placement) {
      for (const Input& in : batch.inputs) table_.taint(in.sid);
      return fail("the cell pool refused a forward of " + std::to_string(len) + " tokens (" +
                  std::to_string(pool_.free_cells()) + " free cells)");
    }
    for (size_t r = 0; r < len; ++r) {
      CELLM_CHECK_MSG(placement->positions[r] == packed.positions[off + r],
                      "pool placement disagrees with the packed positions");
      cell_token_[static_cast<size_t>(placement->cells[r])] = packed.tokens[off + r];
    }

    const SliceRows rows = select_rows(packed, slice.offset, slice.length);
    for (size_t s = 0; s < rows.inputs.size(); ++s) {
      const auto input = static_cast<size_t>(rows.inputs[s]);
      const size_t flat = off + static_cast<size_t>(rows.selector[s]);
      const SessionId sid = packed.sids[flat];
      const Position next = packed.positions[flat] + 1;
      const std::vector<Token> seen = read_history(packed.seq_ids[flat], next);
      const std::vector<float> row = logits_for(seen, options_.vocab_size);
      std::optional<SampledToken> sampled = table_.sample_with_logprobs(sid, row, next);
      if (!sampled) {
        for (const Input& in : batch.inputs) table_.taint(in.sid);
        return fail("session " + std::to_string(sid) + " has no sampling policy");
      }
      Output output{sid, {sampled->token}, {}};
      if (sampled->logprobs) output.logprobs.push_back(std::move(*sampled->logprobs));
      out.outputs[input] = std::move(output);
    }
  }
  pool_.check_invariants();
  return Status::Ok();
}

KvMetrics HistoryExecutor::kv_metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  KvMetrics m;
  table_.fill_kv_metrics(m);
  m.rows_allocated = pool_.capacity();
  m.bytes_per_cell = static_cast<int64_t>(sizeof(Token));
  m.allocated_bytes = m.rows_allocated * m.bytes_per_cell;
  return m;
}

KvBudget HistoryExecutor::kv_budget() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.kv_budget();
}

Position HistoryExecutor::attach_prefix(SessionId id, std::span<const Token> tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  const Position n = table_.attach_prefix(id, tokens, std::numeric_limits<int64_t>::max());
  pool_.check_invariants();
  return n;
}

bool HistoryExecutor::release_cells(SessionId id) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool released = table_.release_cells(id);
  pool_.check_invariants();
  return released;
}

bool HistoryExecutor::reserve(SessionId id, int64_t cells) {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.reserve(id, cells);
}

}  // namespace cellm::testing
