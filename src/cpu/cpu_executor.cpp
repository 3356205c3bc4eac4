#include "cellm/cpu_executor.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>

#include "core/cell_pool.h"
#include "core/session_table.h"
#include "core/step_plan.h"
#include "cpu/cpu_forward.h"
#include "cpu/kernels/thread_pool.h"
#include "cpu/kv_store.h"

namespace cellm {
namespace {

std::string prefixed(const std::string& message) {
  return "CpuExecutor: " + message;
}

cpu::KvStorage kv_storage(const ExecutorLimits& l) {
  return l.kv_dtype == KvDtype::kFp8 ? cpu::KvStorage::kFp8 : cpu::KvStorage::kF32;
}

// One cell's K and V over every layer as `l` stores them.
int64_t store_cell_bytes(const ModelConfig& c, const ExecutorLimits& l) {
  return cpu::KvStore::cell_bytes(c.num_layers(), c.kv_dim(), kv_storage(l), c.head_dim());
}

std::string number(double x) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", x);
  return text;
}

// Cells a pool sized by memory never exceeds: a cell id is an int32 below 2^31 - 1,
// and beyond 16 times what every resident session could hold the cells could only
// ever keep cached prefixes (the pool's bookkeeping costs 13 host bytes a cell).
int64_t memory_cells_cap(const ExecutorLimits& l, int64_t per_session) {
  return std::min<int64_t>(int64_t{std::numeric_limits<int32_t>::max()} - 1,
                           16 * int64_t{l.max_sessions} * per_session);
}

// Validates `l` (in the order create() documents) and resolves max_cells and
// max_session_tokens.
Result<ExecutorLimits> resolve(const ModelWeights* weights, ExecutorLimits l,
                               const CpuExecutorOptions& o) {
  if (weights == nullptr) return InvalidArgument(prefixed("no model was given"));
  if (l.kv_dtype == KvDtype::kBF16) {
    return NotSupported(
        prefixed("--kv-dtype bf16: the CPU executor stores K/V as f32 (auto, f32) or e4m3 (fp8)"));
  }
  const ModelConfig& c = weights->config();
  const int64_t context = c.max_position_embeddings();
  const bool cap_given = l.max_session_tokens != 0;
  // The model's context, or the cap given (checked against it next).
  const auto per_session = static_cast<int32_t>(
      cap_given ? l.max_session_tokens
                : std::min<int64_t>(context, std::numeric_limits<int32_t>::max() - 1));
  CELLM_RETURN_IF_ERROR(
      validate_session_limits("CpuExecutor", l.max_sessions, per_session, context));
  if (l.step_width <= 0 || o.initial_cells <= 0) {
    return InvalidArgument(prefixed("step_width " + std::to_string(l.step_width) +
                                    " and initial_cells " + std::to_string(o.initial_cells) +
                                    " must be positive"));
  }
  if (l.max_cells < 0) {
    return InvalidArgument(prefixed("max_cells " + std::to_string(l.max_cells) +
                                    " must be positive (or 0 for the default)"));
  }
  if (l.kv_memory_bytes < 0) {
    return InvalidArgument(prefixed("kv_memory_bytes " + std::to_string(l.kv_memory_bytes) +
                                    " must be positive (or 0 when unset)"));
  }
  if (!(l.kv_memory_fraction >= 0 && l.kv_memory_fraction <= 1)) {
    return InvalidArgument(prefixed("kv_memory_fraction " + number(l.kv_memory_fraction) +
                                    " must be in (0, 1] (or 0 when unset)"));
  }

  // max_cells: given, else from the byte budget, else by the rule.
  int64_t cells = l.max_cells;
  std::string source;  // how a pool sized by memory got its cells, for messages
  if (cells == 0 && l.kv_memory_bytes > 0) {
    const int64_t per_cell = store_cell_bytes(c, l);
    cells = std::min(l.kv_memory_bytes / per_cell, memory_cells_cap(l, per_session));
    source = " (kv_memory_bytes " + std::to_string(l.kv_memory_bytes) + " at " +
             std::to_string(per_cell) + " bytes a cell)";
  } else if (cells == 0 && l.capacity_rule) {
    cells = int64_t{l.max_sessions} * per_session + 1;
  } else if (cells == 0) {
    return InvalidArgument(
        prefixed("with capacity_rule off the KV pool is sized by max_cells or kv_memory_bytes, "
                 "and both are 0"));
  }
  const std::string pool = "max_cells " + std::to_string(cells) + source;
  if (cells < 2) {
    return InvalidArgument(
        prefixed(pool + " leaves no cell for a session (one cell is the scratch row)"));
  }
  if (l.step_width > cells) {
    return InvalidArgument(
        prefixed("step_width " + std::to_string(l.step_width) + " exceeds " + pool));
  }
  if (l.capacity_rule) {
    CELLM_RETURN_IF_ERROR(validate_capacity("CpuExecutor", l.max_sessions, per_session, cells));
    l.max_session_tokens = per_session;
  } else if (cap_given && per_session >= cells) {
    return InvalidArgument(prefixed("max_session_tokens " + std::to_string(per_session) +
                                    " needs " + std::to_string(int64_t{per_session} + 1) +
                                    " cells (one is the scratch row) but the pool "
                                    "holds " +
                                    pool));
  } else {
    l.max_session_tokens = static_cast<int32_t>(std::min<int64_t>(per_session, cells - 1));
  }
  if (o.num_threads < 0) {
    return InvalidArgument(
        prefixed("num_threads " + std::to_string(o.num_threads) + " must be >= 0"));
  }
  l.max_cells = static_cast<int32_t>(cells);
  return l;
}

CpuExecutorOptions resolved(CpuExecutorOptions o, const ExecutorLimits& l) {
  o.initial_cells = std::min(o.initial_cells, l.max_cells);
  return o;
}

}  // namespace

Result<std::unique_ptr<CpuExecutor>> CpuExecutor::create(
    std::shared_ptr<const ModelWeights> weights, const ExecutorLimits& limits,
    const CpuExecutorOptions& options) {
  CELLM_ASSIGN_OR_RETURN(const ExecutorLimits l, resolve(weights.get(), limits, options));
  return std::unique_ptr<CpuExecutor>(new CpuExecutor(std::move(weights), l, resolved(options, l)));
}

CpuExecutor::CpuExecutor(std::shared_ptr<const ModelWeights> weights, const ExecutorLimits& limits,
                         const CpuExecutorOptions& options)
    : weights_(std::move(weights)),
      limits_(limits),
      options_(options),
      pool_(std::make_unique<CellPool>(limits.max_cells - 1)),
      sessions_(std::make_unique<SessionTable>(
          *pool_, limits.max_sessions, limits.max_session_tokens,
          static_cast<int32_t>(weights_->config().vocab_size()), limits.prefix_cache)) {
  const ModelConfig& c = weights_->config();
  threads_ = std::make_unique<cpu::ThreadPool>(options_.num_threads);
  kv_ = std::make_unique<cpu::KvStore>(c.num_layers(), c.kv_dim(), limits_.max_cells,
                                       options_.initial_cells, kv_storage(limits_), c.head_dim());
  forward_ = std::make_unique<cpu::CpuForward>(weights_, *threads_, limits_.step_width,
                                               options_.bf16_activations);
}

CpuExecutor::~CpuExecutor() = default;

size_t CpuExecutor::preferred_batch_tokens() const {
  return static_cast<size_t>(limits_.step_width);
}

std::optional<SessionId> CpuExecutor::open_session() {
  return sessions_->open();
}

void CpuExecutor::close_session(SessionId id) {
  sessions_->close(id);
}

std::optional<SessionId> CpuExecutor::clone(SessionId source, Position upto) {
  return sessions_->clone(source, upto);
}

void CpuExecutor::set_sampling(SessionId id, const SamplingParams& params,
                               std::optional<uint64_t> seed) {
  sessions_->set_sampling(id, params, seed);
}

bool CpuExecutor::set_logits_processor(SessionId id, std::shared_ptr<LogitsProcessor> processor) {
  return sessions_->set_logits_processor(id, std::move(processor));
}

Status CpuExecutor::execute(const BatchInput& batch, BatchOutput& out) {
  out.outputs.assign(batch.inputs.size(), std::nullopt);
  Result<PackedStep> packed_or = sessions_->pack(batch);
  if (!packed_or.ok()) {
    // pack changes nothing on error: the sessions' histories still hold.
    return Status(packed_or.status().code(), prefixed(packed_or.status().message()));
  }
  Status s = run_packed(batch, *packed_or, out);
  if (!s.ok()) {
    // Some of the batch's cells may not hold what the histories say: cache none of them.
    for (const Input& in : batch.inputs) sessions_->taint(in.sid);
  }
  return s;
}

Status CpuExecutor::run_packed(const BatchInput& batch, const PackedStep& packed,
                               BatchOutput& out) {
  const int64_t vocab = weights_->config().vocab_size();
  if (Status s = check_tokens_in_vocab(packed, vocab); !s.ok()) {
    return Status(s.code(), prefixed(s.message()));
  }

  const auto total = static_cast<int>(packed.tokens.size());
  // Scoring: which input each flat row belongs to (pack flattens in input order), and
  // for a scored input's row the token that follows it in the buffer (-1: none).
  std::vector<int32_t> row_input;
  std::vector<Token> row_target;
  const bool scoring = std::any_of(batch.inputs.begin(), batch.inputs.end(),
                                   [](const Input& in) { return in.score; });
  if (scoring) {
    out.scores.assign(batch.inputs.size(), {});
    row_input.reserve(packed.tokens.size());
    row_target.reserve(packed.tokens.size());
    for (size_t i = 0; i < batch.inputs.size(); ++i) {
      const Input& in = batch.inputs[i];
      for (size_t t = 0; t < in.size; ++t) {
        const size_t next = in.offset + t + 1;
        row_input.push_back(static_cast<int32_t>(i));
        row_target.push_back(in.score && next < in.tokens->size() ? (*in.tokens)[next] : -1);
      }
    }
  }
  std::vector<std::span<const CellId>> seq_cells;
  // The CPU forward takes any width from 1 to W, so every piece of the plan is
  // one forward (a lone tail token is a one-row forward).
  for (const StepSlice& slice : plan_slices(total, limits_.step_width, 1)) {
    const auto off = static_cast<size_t>(slice.offset);
    const auto len = static_cast<size_t>(slice.length);
    std::span<const SeqId> seq_ids(packed.seq_ids.data() + off, len);
    kv_->ensure_rows(std::min<int64_t>(limits_.max_cells, pool_->used_end() + slice.length));
    std::optional<StepPlacement> placement = pool_->declare_step(seq_ids);
    if (!placement)
      return OutOfResources(prefixed("the cell pool refused a slice of " + std::to_string(len) +
                                     " tokens (" + std::to_string(pool_->free_cells()) +
                                     " free cells)"));
    for (size_t r = 0; r < len; ++r) {
      CELLM_CHECK_MSG(placement->positions[r] == packed.positions[off + r],
                      "pool placement disagrees with the packed positions");
    }
    seq_cells.clear();
    for (size_t r = 0; r < len; ++r) seq_cells.push_back(pool_->cells_of(seq_ids[r]));

    // Only rows that answer an input need logits (select_rows' padding row is
    // for programs that always produce one; the CPU forward does not).
    SliceRows rows = select_rows(packed, slice.offset, slice.length);
    if (rows.inputs.empty()) rows.selector.clear();
    // The rows to compute logits for: those that sample, and the scored ones.
    std::vector<int32_t> selected = rows.selector;
    if (scoring) {
      for (int32_t r = 0; r < slice.length; ++r) {
        if (row_target[off + static_cast<size_t>(r)] >= 0) selected.push_back(r);
      }
      std::sort(selected.begin(), selected.end());
      selected.erase(std::unique(selected.begin(), selected.end()), selected.end());
    }
    auto logits_row = [&](int32_t r) {
      const auto at = static_cast<size_t>(std::lower_bound(selected.begin(), selected.end(), r) -
                                          selected.begin());
      return std::span<const float>(logits_.data() + at * static_cast<size_t>(vocab),
                                    static_cast<size_t>(vocab));
    };
    logits_.resize(selected.size() * static_cast<size_t>(vocab));

    cpu::ForwardSlice fs;
    fs.tokens = std::span<const Token>(packed.tokens.data() + off, len);
    fs.positions = std::span<const Position>(packed.positions.data() + off, len);
    fs.cells = placement->cells;
    fs.seq_cells = seq_cells;
    fs.selected_rows = selected;
    forward_->run(fs, *kv_, logits_);

    if (scoring) {
      for (int32_t r = 0; r < slice.length; ++r) {
        const Token target = row_target[off + static_cast<size_t>(r)];
        if (target < 0) continue;
        if (target >= vocab) {
          return InvalidArgument(prefixed("a scored token (" + std::to_string(target) +
                                          ") lies outside the vocabulary"));
        }
        const auto input = static_cast<size_t>(row_input[off + static_cast<size_t>(r)]);
        out.scores[input].push_back(token_logprobs(logits_row(r), target,
                                                   sessions_->num_logprobs(batch.inputs[input].sid),
                                                   score_scratch_));
      }
    }

    for (size_t s = 0; s < rows.inputs.size(); ++s) {
      const auto input = static_cast<size_t>(rows.inputs[s]);
      const SessionId sid = batch.inputs[input].sid;
      const Position next = packed.positions[off + static_cast<size_t>(rows.selector[s])] + 1;
      std::span<const float> row = logits_row(rows.selector[s]);
      std::optional<SampledToken> sampled = sessions_->sample_with_logprobs(sid, row, next);
      if (!sampled) {
        return InvalidState(prefixed("session " + std::to_string(sid) + " has no sampling policy"));
      }
      Output output{sid, {sampled->token}, {}};
      if (sampled->logprobs) output.logprobs.push_back(std::move(*sampled->logprobs));
      out.outputs[input] = std::move(output);
    }
  }
  return Status::Ok();
}

KvMetrics CpuExecutor::kv_metrics() const {
  KvMetrics m;
  sessions_->fill_kv_metrics(m);
  m.rows_allocated = kv_->rows();
  m.allocated_bytes = kv_->allocated_bytes();
  m.bytes_per_cell = kv_->bytes_per_cell();
  m.growth_count = kv_->growth_count();
  return m;
}

int64_t CpuExecutor::kv_bytes_per_cell() const {
  return kv_->bytes_per_cell();
}

int64_t CpuExecutor::cell_bytes(const ModelConfig& config, KvDtype dtype) {
  ExecutorLimits l;
  l.kv_dtype = dtype;
  return store_cell_bytes(config, l);
}

KvBudget CpuExecutor::kv_budget() const {
  return sessions_->kv_budget();
}

Position CpuExecutor::attach_prefix(SessionId id, std::span<const Token> tokens) {
  return sessions_->attach_prefix(id, tokens, std::numeric_limits<int64_t>::max());
}

bool CpuExecutor::release_cells(SessionId id) {
  return sessions_->release_cells(id);
}

bool CpuExecutor::reserve(SessionId id, int64_t cells) {
  return sessions_->reserve(id, cells);
}

}  // namespace cellm
