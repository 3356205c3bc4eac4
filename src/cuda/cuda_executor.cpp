#include "cellm/cuda_executor.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <optional>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "cellm/sampler.h"
#include "core/cell_pool.h"
#include "core/session_table.h"
#include "core/step_plan.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_forward.h"
#include "cuda/gemm_tuning.h"
#include "cuda/kernels/embedding.h"
#include "cuda/kernels/kv_e4m3.h"
#include "cuda/launch_control.h"
#include "cuda/pool_sizing.h"
#include "cuda/score_rows.h"
#include "cuda/step_ahead_policy.h"
#include "cuda/step_processors.h"

namespace cellm {
namespace cuda {
namespace {

std::string prefixed(const std::string& m) {
  return "CudaExecutor: " + m;
}

int32_t decode_cap(const ExecutorLimits& l, const CudaExecutorOptions& o) {
  return o.max_decode_batch > 0 ? o.max_decode_batch : std::min(l.max_sessions, 512);
}

// The decode buckets: 1, 2, 4, 8, 16, 24, 32, then steps of 16, up to the cap.
int32_t bucket_for(int32_t b, int32_t cap) {
  int32_t bucket = 1;
  while (bucket < b) {
    if (bucket < 8) {
      bucket *= 2;
    } else if (bucket < 32) {
      bucket += 8;
    } else {
      bucket += 16;
    }
  }
  return std::min(bucket, cap);
}

}  // namespace

class ExecutorImpl {
 public:
  // REQUIRES: limits.max_cells resolved (not 0).
  ExecutorImpl(std::shared_ptr<const ModelWeights> weights, const ExecutorLimits& limits,
               const CudaExecutorOptions& options, std::unique_ptr<ForwardEngine> engine)
      : weights_(std::move(weights)),
        limits_(limits),
        options_(options),
        pool_(limits.max_cells - 1),
        sessions_(pool_, limits.max_sessions, limits.max_session_tokens,
                  static_cast<int32_t>(weights_->config().vocab_size()), limits.prefix_cache),
        engine_(std::move(engine)) {}

  std::shared_ptr<const ModelWeights> weights_;
  ExecutorLimits limits_;
  CudaExecutorOptions options_;
  CellPool pool_;
  SessionTable sessions_;
  std::vector<float> score_scratch_;  // token_logprobs' scratch for scored rows
  std::unique_ptr<ForwardEngine> engine_;
  CudaExecutor::KvSizing kv_sizing_;  // how create() sized the pool
  std::string last_error_;
  bool broken_ = false;  // a sticky CUDA error: every later batch fails
  CudaExecutor::MethodCalls calls_;
  CudaExecutor::StepTimes times_;
  double initialize_seconds_ = 0;
  int64_t warmed_prefill_kernels_ = 0;
  double batch_device_ms_ = 0;  // device time of the current batch's forwards

  // Adds the last forward's device time to the current batch's.
  void count_device_time() { batch_device_ms_ += engine_->last_device_ms(); }

  bool fail(std::string message) {
    last_error_ = prefixed(message);
    std::fprintf(stderr, "%s\n", last_error_.c_str());
    return false;
  }

  bool fail_cuda(const Status& s) {
    broken_ = true;
    return fail(s.to_string());
  }

  // Fills the sampling row of selected row `s` for batch input `input`.
  bool fill_sampling(int32_t s, const Input& input, Position next) {
    return fill_sampling_of(s, input.sid, next);
  }
  bool fill_sampling_of(int32_t s, SessionId sid, Position next) {
    const SamplingPolicy* policy = sessions_.policy_of(sid);
    if (policy == nullptr) return false;
    SamplingRow& r = engine_->host().sampling[s];
    r.temperature = policy->params.temperature;
    r.top_k = policy->params.top_k;
    r.top_p = policy->params.top_p;
    r.min_p = policy->params.min_p;
    r.seed = policy->seed;
    r.position = next;
    r.pad = 0;
    return true;
  }

  StepProcessors step_processors_{sessions_};  // the logits processors of a step's rows

  // The selected rows (indices into the step's selection) whose sessions want
  // logprobs; `sids[s]` is sampling row s's session, at selected row at[s] (s when
  // `at` is empty).
  std::vector<int32_t> logit_rows_for(std::span<const SessionId> sids,
                                      std::span<const int32_t> at = {}) const {
    std::vector<int32_t> rows;
    for (size_t s = 0; s < sids.size(); ++s) {
      if (sessions_.wants_logprobs(sids[s]))
        rows.push_back(at.empty() ? static_cast<int32_t>(s) : at[s]);
    }
    return rows;
  }

  // The output of selected row `s` for session `sid`, with logprobs computed on
  // the host from the row's copied raw logits when the session asked for them.
  Output output_for(SessionId sid, int32_t s, std::span<const int32_t> logit_rows) {
    const Token token = engine_->host().out_tokens[s];
    Output output{sid, {token}, {}};
    const auto it = std::lower_bound(logit_rows.begin(), logit_rows.end(), s);
    if (it != logit_rows.end() && *it == s) {
      const auto k = static_cast<size_t>(it - logit_rows.begin());
      std::optional<TokenLogprobs> lp = sessions_.logprobs(sid, engine_->host_logits(k), token);
      CELLM_CHECK_MSG(lp.has_value(), "a logit row for a session without logprobs");
      output.logprobs.push_back(std::move(*lp));
    }
    return output;
  }

  // True if the batch is single-token decodes of distinct sessions, each
  // wanting output, at most the decode cap.
  bool is_batched_decode(const BatchInput& batch) const {
    if (batch.inputs.empty() ||
        batch.inputs.size() > static_cast<size_t>(engine_->dims().max_rows) ||
        batch.inputs.size() > static_cast<size_t>(decode_cap(limits_, options_))) {
      return false;
    }
    std::set<SessionId> seen;
    for (const Input& in : batch.inputs) {
      if (in.size != 1 || !in.produce_output || !seen.insert(in.sid).second) return false;
    }
    return true;
  }

  bool execute(const BatchInput& batch, BatchOutput& out) {
    if (!options_.time_steps) return execute_batch(batch, out);
    const auto t0 = std::chrono::steady_clock::now();
    batch_device_ms_ = 0;
    const bool decode = is_batched_decode(batch);
    const bool ok = execute_batch(batch, out);
    const double wall =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (decode) {
      ++times_.decode_batches;
      times_.decode_wall_ms += wall;
      times_.decode_device_ms += batch_device_ms_;
    } else {
      ++times_.other_batches;
      times_.other_wall_ms += wall;
      times_.other_device_ms += batch_device_ms_;
    }
    return ok;
  }

  bool execute_batch(const BatchInput& batch, BatchOutput& out) {
    last_error_.clear();
    out.outputs.assign(batch.inputs.size(), std::nullopt);
    if (broken_) return fail("a previous CUDA error left the device unusable");
    // A batch that scores runs as eager slices (scored rows join their selection).
    const std::optional<ScoreTargets> targets = score_targets(batch);
    if (targets) out.scores.assign(batch.inputs.size(), {});
    if (ahead_) {
      std::optional<std::vector<size_t>> rows;
      if (!targets) rows = ahead_rows_for(batch);
      if (rows) return run_ahead(batch, *rows, out);
      if (!drop_ahead()) return false;
    }
    Result<PackedStep> packed_or = sessions_.pack(batch);
    if (!packed_or.ok()) return fail(packed_or.status().to_string());
    const PackedStep& packed = *packed_or;
    if (Status s = check_tokens_in_vocab(packed, weights_->config().vocab_size()); !s.ok()) {
      return fail(s.message());
    }
    if (!targets && is_batched_decode(batch)) return run_decode(batch, packed, out);
    const auto total = static_cast<int>(packed.tokens.size());
    for (const StepSlice& slice : plan_slices(total, limits_.step_width, options_.min_prefill)) {
      if (!run_slice(batch, packed, slice, targets ? &*targets : nullptr, out)) return false;
    }
    return true;
  }

  // Warms and captures the graph of every decode bucket up to the cap: each
  // bucket's first run is eager (it builds the cuBLASLt plans), the second
  // captures. The padded rows of a warm-up step all write the scratch cell, so
  // no session's state is touched.
  bool capture_decode_graphs() {
    const int32_t cap = decode_cap(limits_, options_);
    StepHost& h = engine_->host();
    for (int32_t b = 1; b <= cap;) {
      const int32_t bucket = bucket_for(b, cap);
      for (int32_t r = 0; r < bucket; ++r) {
        h.tokens[r] = 0;
        h.positions[r] = 0;
        h.row_seq[r] = engine_->scratch_seq();
        h.cells[r] = engine_->scratch_cell();
        h.selected[r] = r;
        h.sampling[r] = SamplingRow{};
      }
      for (int pass = 0; pass < 2; ++pass) {
        if (Status s = engine_->run_decode_graph(bucket); !s.ok()) return fail_cuda(s);
      }
      ++calls_.decode_graph_captures;
      b = bucket + 1;
    }
    return true;
  }

  // The engine's warm_products (CudaExecutorOptions::warm_prefill_gemms).
  bool warm_prefill_gemms() {
    Result<int64_t> ran = engine_->warm_products();
    if (!ran.ok()) return fail_cuda(ran.status());
    warmed_prefill_kernels_ = *ran;
    return true;
  }

  // One batched decode of B sessions from the bucket's graph (or eagerly).
  bool run_decode(const BatchInput& batch, const PackedStep& packed, BatchOutput& out) {
    const auto b = static_cast<int32_t>(packed.tokens.size());
    std::optional<StepPlacement> placement = pool_.declare_step(packed.seq_ids);
    if (!placement) return fail("the cell pool refused a decode of " + std::to_string(b));
    const int32_t bucket =
        options_.cuda_graph_for_decode ? bucket_for(b, decode_cap(limits_, options_)) : b;
    StepHost& h = engine_->host();
    for (int32_t r = 0; r < bucket; ++r) {
      const bool real = r < b;
      h.tokens[r] = real ? packed.tokens[static_cast<size_t>(r)] : 0;
      h.positions[r] = real ? packed.positions[static_cast<size_t>(r)] : 0;
      h.row_seq[r] = real ? packed.seq_ids[static_cast<size_t>(r)] : engine_->scratch_seq();
      h.cells[r] = real ? placement->cells[static_cast<size_t>(r)] : engine_->scratch_cell();
      h.selected[r] = r;
      if (real) {
        if (!fill_sampling(r, batch.inputs[static_cast<size_t>(r)], h.positions[r] + 1)) {
          return fail("session " + std::to_string(batch.inputs[static_cast<size_t>(r)].sid) +
                      " has no sampling policy");
        }
      } else {
        h.sampling[r] = SamplingRow{};
      }
    }
    const std::vector<int32_t> logit_rows = logit_rows_for(packed.sids);
    // Overlapped once the same sessions have decoded in the same order for as many
    // batches in a row as the policy asks (a step queued ahead of a batch that keeps
    // changing would mostly be dropped).
    stable_run_ = packed.sids == last_decode_sids_ ? stable_run_ + 1 : 1;
    last_decode_sids_ = packed.sids;
    // Processor rows (as logprob rows) never run ahead: a step queued ahead would sample
    // their tokens before the host prepared their adjustments.
    const AdjustmentSource* adjust = step_processors_.collect(packed.sids);
    if (options_.overlap_decode && ahead_policy_.should_queue(stable_run_) &&
        options_.cuda_graph_for_decode && logit_rows.empty() && adjust == nullptr &&
        engine_->has_decode_graph(bucket)) {
      Ahead step{bucket, packed.sids, packed.seq_ids, packed.positions, {}, {}};
      step.live.assign(packed.sids.size(), true);
      if (Status q = engine_->queue_decode_graph(bucket); !q.ok()) return fail_cuda(q);
      ++calls_.decode_graph_replays;
      std::vector<size_t> rows(packed.sids.size());
      for (size_t r = 0; r < rows.size(); ++r) rows[r] = r;
      return finish_overlapped(std::move(step), rows, out);
    }
    Status s;
    if (options_.cuda_graph_for_decode) {
      const int64_t captures = engine_->graph_captures();
      s = engine_->run_decode_graph(bucket, logit_rows, adjust);
      if (engine_->graph_captures() > captures) ++calls_.decode_graph_captures;
      ++calls_.decode_graph_replays;
    } else {
      s = engine_->run_eager(bucket, bucket, logit_rows, adjust);
      ++calls_.decode_eager;
    }
    if (!s.ok()) return fail_cuda(s);
    count_device_time();
    if (adjust != nullptr) step_processors_.accept(engine_->host().out_tokens);
    for (int32_t r = 0; r < b; ++r) {
      out.outputs[static_cast<size_t>(r)] =
          output_for(batch.inputs[static_cast<size_t>(r)].sid, r, logit_rows);
    }
    return true;
  }

  // The overlapped decode path (CudaExecutorOptions::overlap_decode). A decode step of
  // graph `bucket`: row r is session sids[r] (pool sequence seqs[r]) at positions[r];
  // `tokens` are the tokens it consumes, known on the host once the step before it is
  // read (a step queued ahead takes them from that step on the device). A row whose
  // session has left (`live[r]` false: it finished or was closed while the step was
  // queued) is a padded row in the steps queued after it: the rows keep their places, since
  // each takes its token from the same row of the step before.
  struct Ahead {
    int32_t bucket = 0;
    std::vector<SessionId> sids;
    std::vector<SeqId> seqs;
    std::vector<Position> positions;
    std::vector<Token> tokens;
    std::vector<bool> live;
  };
  // The step queued ahead of the runner's next batch, if any: `step` one position
  // further for the same sessions. Its cells are declared in the pool.
  std::optional<Ahead> ahead_;
  std::vector<SessionId> last_decode_sids_;  // the sessions of the last decode batch, in order
  int64_t stable_run_ = 0;  // decode batches in a row with those sessions, the last included
  StepAheadPolicy ahead_policy_{options_.tuning.overlap_adaptive};

  // Cells the step ahead holds (kv_metrics leaves them out: no session has them yet).
  int32_t ahead_cells() const {
    return ahead_ ? static_cast<int32_t>(std::count(ahead_->live.begin(), ahead_->live.end(), true))
                  : 0;
  }

  // The step ahead's row of each of `batch`'s inputs when the batch is that step or part
  // of it: one-token decodes of sessions it holds, each at the step's position with the
  // token the step consumed, in any order. Its rows the batch leaves out are sessions
  // that finished (or paused): the step is still good for the others.
  std::optional<std::vector<size_t>> ahead_rows_for(const BatchInput& batch) const {
    const Ahead& a = *ahead_;
    if (!is_batched_decode(batch)) return std::nullopt;
    std::vector<size_t> rows;
    for (const Input& in : batch.inputs) {
      size_t r = 0;
      while (r < a.sids.size() && !(a.live[r] && a.sids[r] == in.sid)) ++r;
      if (r == a.sids.size() || in.start() != a.positions[r] || in.token(0) != a.tokens[r]) {
        return std::nullopt;
      }
      rows.push_back(r);
    }
    return rows;
  }

  // Gives up the step ahead: waits for it (the device may still run it, and its staging
  // slot is reused), drops its tokens and gives its cells back. The device's cell table
  // may keep entries past a sequence's length; nothing reads them, and later steps
  // overwrite them in stream order.
  bool drop_ahead() {
    Ahead a = std::move(*ahead_);
    ahead_.reset();
    ++calls_.decode_steps_ahead_dropped;
    ahead_policy_.dropped();
    for (size_t r = 0; r < a.seqs.size(); ++r) {
      if (a.live[r] && pool_.seq_live(a.seqs[r])) pool_.rewind(a.seqs[r], a.positions[r]);
    }
    if (Result<std::span<const int32_t>> done = engine_->wait_queued(); !done.ok()) {
      return fail_cuda(done.status());
    }
    return true;
  }

  // The live row of `sid` in the step ahead, if it holds one.
  std::optional<size_t> ahead_row_of(SessionId sid) const {
    if (!ahead_) return std::nullopt;
    for (size_t r = 0; r < ahead_->sids.size(); ++r) {
      if (ahead_->live[r] && ahead_->sids[r] == sid) return r;
    }
    return std::nullopt;
  }

  // Executor calls that change a session or its policy settle the step ahead first when
  // it holds that session.
  void settle_for(SessionId sid) {
    if (ahead_row_of(sid)) drop_ahead();
  }

  // Empties a session whose attached cells never reached the device table: it
  // caches nothing (the cells stay cached for others) and goes back to position 0.
  void release_cells_of(SessionId sid) {
    sessions_.taint(sid);
    sessions_.release_cells(sid);
  }

  // A session closing leaves the step ahead: its row stays on the device (its cells go
  // back to the pool with the rest of the session's, reused only by steps queued after
  // this one) and the step stays good for the other sessions.
  void leave_ahead(SessionId sid) {
    const std::optional<size_t> r = ahead_row_of(sid);
    if (!r) return;
    ahead_->live[*r] = false;
    if (ahead_cells() == 0) drop_ahead();
  }

  // The runner's batch is the step ahead, or the part of it `rows` names (row of each
  // input), already queued: the rows it leaves out give their cells back; then queue the
  // step after it and wait for it.
  bool run_ahead(const BatchInput& batch, const std::vector<size_t>& rows, BatchOutput& out) {
    Ahead step = std::move(*ahead_);
    ahead_.reset();
    std::vector<bool> kept(step.sids.size(), false);
    for (size_t r : rows) kept[r] = true;
    for (size_t r = 0; r < step.sids.size(); ++r) {
      if (step.live[r] && !kept[r]) {
        pool_.rewind(step.seqs[r], step.positions[r]);
        step.live[r] = false;
      }
    }
    // The batch's tokens went in without pack(): record them in the histories (only the
    // prefix cache keeps histories, so a step without it pays no lookup per row).
    if (sessions_.prefix_cache() != nullptr) {
      for (const Input& in : batch.inputs)
        sessions_.note_committed(in.sid, in.start(), in.token(0));
    }
    ++calls_.decode_steps_ahead_used;
    ahead_policy_.used();
    ++stable_run_;
    last_decode_sids_.clear();
    for (const Input& in : batch.inputs) last_decode_sids_.push_back(in.sid);
    return finish_overlapped(std::move(step), rows, out);
  }

  // `step` is queued (the newest on the stream): queues the step after it when it can,
  // then waits for `step` and answers the batch with its tokens (input i's from row
  // rows[i]).
  bool finish_overlapped(Ahead step, const std::vector<size_t>& rows, BatchOutput& out) {
    std::optional<Ahead> next;
    if (ahead_policy_.should_queue(stable_run_)) next = queue_next(step);
    if (broken_) return false;
    Result<std::span<const int32_t>> tokens = engine_->wait_queued();
    if (!tokens.ok()) return fail_cuda(tokens.status());
    count_device_time();
    for (size_t i = 0; i < rows.size(); ++i) {
      out.outputs[i] = Output{step.sids[rows[i]], {(*tokens)[rows[i]]}, {}};
    }
    if (next) {
      const auto b = static_cast<std::ptrdiff_t>(step.sids.size());
      next->tokens.assign(tokens->begin(), tokens->begin() + b);
      ahead_ = std::move(next);
    }
    return true;
  }

  // Queues `step`'s successor (each live row one position further, fed the token `step`
  // samples for it; the other rows padded) and returns it, or nullopt when a row would
  // pass its session's budget, the pool has no cells for it, a session now wants
  // logprobs or has a logits processor, or the live rows would fit a smaller bucket (the
  // next batch then runs alone, in that bucket's graph, and queues the steps after it
  // there).
  std::optional<Ahead> queue_next(const Ahead& step) {
    const auto b = static_cast<int32_t>(step.sids.size());
    const auto live = static_cast<int32_t>(std::count(step.live.begin(), step.live.end(), true));
    if (bucket_for(live, decode_cap(limits_, options_)) != step.bucket) return std::nullopt;
    Ahead next{step.bucket, step.sids, step.seqs, step.positions, {}, step.live};
    std::vector<SeqId> live_seqs;
    for (int32_t r = 0; r < b; ++r) {
      const auto i = static_cast<size_t>(r);
      if (!next.live[i]) continue;
      if (++next.positions[i] + 1 > limits_.max_session_tokens ||
          sessions_.wants_logprobs(step.sids[i]) ||
          sessions_.logits_processor(step.sids[i]) != nullptr) {
        return std::nullopt;
      }
      live_seqs.push_back(next.seqs[i]);
    }
    std::optional<StepPlacement> placement = pool_.declare_step(live_seqs);
    if (!placement) return std::nullopt;
    const auto give_back = [&] {
      for (size_t k = 0; k < next.seqs.size(); ++k) {
        if (next.live[k]) pool_.rewind(next.seqs[k], next.positions[k]);
      }
    };
    StepHost& h = engine_->host();
    size_t cell = 0;  // the next of placement's cells (one per live row, in row order)
    for (int32_t r = 0; r < step.bucket; ++r) {
      const auto i = static_cast<size_t>(r);
      const bool real = r < b && next.live[i];
      h.tokens[r] = real ? kFedToken : 0;  // real rows take `step`'s tokens on the device
      h.positions[r] = real ? next.positions[i] : 0;
      h.row_seq[r] = real ? next.seqs[i] : engine_->scratch_seq();
      h.cells[r] = real ? placement->cells[cell++] : engine_->scratch_cell();
      h.selected[r] = r;
      if (!real) {
        h.sampling[r] = SamplingRow{};
      } else if (!fill_sampling_of(r, next.sids[i], next.positions[i] + 1)) {
        give_back();
        return std::nullopt;
      }
    }
    if (Status q = engine_->queue_decode_graph(step.bucket); !q.ok()) {
      give_back();
      fail_cuda(q);
      return std::nullopt;
    }
    ++calls_.decode_graph_replays;
    return next;
  }

  // One slice of the plan: an eager prefill, or a one-token decode.
  bool run_slice(const BatchInput& batch, const PackedStep& packed, const StepSlice& slice,
                 const ScoreTargets* targets, BatchOutput& out) {
    const auto off = static_cast<size_t>(slice.offset);
    const auto len = static_cast<size_t>(slice.length);
    std::span<const SeqId> seq_ids(packed.seq_ids.data() + off, len);
    std::optional<StepPlacement> placement = pool_.declare_step(seq_ids);
    if (!placement) return fail("the cell pool refused a slice of " + std::to_string(len));
    StepHost& h = engine_->host();
    for (size_t r = 0; r < len; ++r) {
      h.tokens[r] = packed.tokens[off + r];
      h.positions[r] = packed.positions[off + r];
      h.row_seq[r] = packed.seq_ids[off + r];
      h.cells[r] = placement->cells[r];
    }
    SliceRows rows = select_rows(packed, slice.offset, slice.length);
    if (rows.inputs.empty()) rows.selector.clear();
    // The sampling rows and, when scoring, the scored rows; a scored row's token is
    // sampled greedily and dropped.
    const SliceSelection sel =
        select_with_scores(rows.selector, targets, slice.offset, slice.length);
    for (size_t k = 0; k < sel.rows.size(); ++k) {
      h.selected[k] = sel.rows[k];
      h.sampling[k] = SamplingRow{};
    }
    for (size_t s = 0; s < rows.selector.size(); ++s) {
      const Input& in = batch.inputs[static_cast<size_t>(rows.inputs[s])];
      const Position next = packed.positions[off + static_cast<size_t>(rows.selector[s])] + 1;
      if (!fill_sampling(sel.sampling[s], in, next)) {
        return fail("session " + std::to_string(in.sid) + " has no sampling policy");
      }
    }
    std::vector<SessionId> selected_sids;
    for (int32_t input : rows.inputs)
      selected_sids.push_back(batch.inputs[static_cast<size_t>(input)].sid);
    std::vector<int32_t> logit_rows = logit_rows_for(selected_sids, sel.sampling);
    logit_rows.insert(logit_rows.end(), sel.scored.begin(), sel.scored.end());
    std::sort(logit_rows.begin(), logit_rows.end());
    logit_rows.erase(std::unique(logit_rows.begin(), logit_rows.end()), logit_rows.end());
    const AdjustmentSource* adjust = step_processors_.collect(selected_sids, sel.sampling);
    const auto n_sel = static_cast<int32_t>(sel.rows.size());
    Status st;
    if (slice.method == StepMethod::kDecode && options_.cuda_graph_for_decode &&
        rows.selector.size() == 1 && sel.scored.empty()) {
      st = engine_->run_decode_graph(1, logit_rows, adjust);
      ++calls_.decode_graph_replays;
    } else {
      st = engine_->run_eager(static_cast<int32_t>(len), n_sel, logit_rows, adjust);
      ++(slice.method == StepMethod::kDecode ? calls_.decode_eager : calls_.prefill);
    }
    if (!st.ok()) return fail_cuda(st);
    count_device_time();
    if (adjust != nullptr) step_processors_.accept(engine_->host().out_tokens);
    if (targets != nullptr) {
      Status scored =
          score_slice(batch, *targets, sel, logit_rows, *engine_, sessions_, score_scratch_, out);
      if (!scored.ok()) return fail(scored.message());
    }
    for (size_t s = 0; s < rows.inputs.size(); ++s) {
      const auto input = static_cast<size_t>(rows.inputs[s]);
      out.outputs[input] = output_for(batch.inputs[input].sid, sel.sampling[s], logit_rows);
    }
    return true;
  }
};

}  // namespace cuda

Result<std::unique_ptr<CudaExecutor>> CudaExecutor::create(
    std::shared_ptr<const ModelWeights> weights, const ExecutorLimits& limits,
    const CudaExecutorOptions& options) {
  // K/V are stored in the precision's type, or as e4m3 codes with per-head scales (fp8).
  const KvDtype stored = options.precision == CudaPrecision::kF32 ? KvDtype::kF32 : KvDtype::kBF16;
  const bool kv_e4m3 = limits.kv_dtype == KvDtype::kFp8;
  if (kv_e4m3 && (weights->config().head_dim() > cuda::kMaxKvE4m3HeadDim ||
                  weights->config().head_dim() % 2 != 0)) {
    return NotSupported(cuda::prefixed("--kv-dtype fp8 needs an even head_dim of at most " +
                                       std::to_string(cuda::kMaxKvE4m3HeadDim) +
                                       ", the model's is " +
                                       std::to_string(weights->config().head_dim())));
  }
  if (limits.kv_dtype != KvDtype::kAuto && !kv_e4m3 && limits.kv_dtype != stored) {
    return NotSupported(cuda::prefixed(std::string("--kv-dtype ") + to_string(limits.kv_dtype) +
                                       ": the CUDA executor in this precision stores K/V as " +
                                       to_string(stored)));
  }
  CELLM_ASSIGN_OR_RETURN(ExecutorLimits l, cuda::validate_limits(weights.get(), limits, options));
  // The device kernels read bf16/f16/f32 elements only; a block-format (GGUF
  // quantized) tensor is refused by name rather than read as elements.
  for (const TensorView* t : weights->tensors()) {
    if (t->block_type) {
      const std::optional<GgmlTypeInfo> info =
          ggml_type_info(static_cast<uint32_t>(*t->block_type));
      return NotSupported(cuda::prefixed("the CUDA executor cannot run block-quantized tensor " +
                                         t->name + " (" + (info ? info->name : "?") +
                                         ") yet; use the CPU executor (--executor cpu)"));
    }
  }
  const CudaExecutorOptions& o = options;
  if (!cuda::gpu_available()) {
    return NotSupported(cuda::prefixed("no usable CUDA device (cudaGetDeviceCount found none)"));
  }
  CELLM_CUDA_RETURN_IF_ERROR(cudaSetDevice(o.device), "CudaExecutor: selecting the device");
  cuda::set_programmatic_launch(o.tuning.programmatic_launch);
  cuda::ForwardDims dims;
  dims.max_rows = std::max(l.step_width, cuda::decode_cap(l, o));
  dims.max_cells = l.max_cells;  // 0 while the pool is sized by memory
  dims.max_seqs = l.max_sessions;
  dims.max_session_tokens = l.max_session_tokens;
  dims.kv_e4m3 = kv_e4m3;
  size_t free_bytes = 0, total_bytes = 0;
  CELLM_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes),
                             "CudaExecutor: reading free device memory");
  const bool by_memory = l.max_cells == 0;
  if (by_memory) {
    CELLM_RETURN_IF_ERROR(cuda::size_pool_by_memory(*weights, limits, l, dims, o, free_bytes));
  }
  const cuda::ForwardEngine::DeviceBytes bytes =
      cuda::ForwardEngine::device_bytes(*weights, dims, o.precision);
  const size_t need = bytes.total();
  if (need > free_bytes) {
    return OutOfResources(cuda::prefixed(
        "needs " + std::to_string(need >> 20) + " MiB of device memory (weights, KV pool of " +
        std::to_string(l.max_cells) + " cells, buffers) but only " +
        std::to_string(free_bytes >> 20) + " MiB are free"));
  }
  CudaExecutor::KvSizing sizing;
  sizing.cells = l.max_cells;
  sizing.bytes_per_cell = static_cast<int64_t>(bytes.kv_per_cell);
  sizing.pool_bytes = static_cast<int64_t>(bytes.kv);
  sizing.table_bytes = static_cast<int64_t>(bytes.table);
  sizing.max_context = l.max_session_tokens;
  sizing.weights_bytes = static_cast<int64_t>(bytes.weights);
  sizing.buffer_bytes = static_cast<int64_t>(bytes.buffers);
  sizing.free_bytes = static_cast<int64_t>(free_bytes);
  sizing.by_memory = by_memory;
  CELLM_ASSIGN_OR_RETURN(std::unique_ptr<cuda::ForwardEngine> engine,
                         cuda::ForwardEngine::create(*weights, dims, o));
  if (o.time_steps) CELLM_RETURN_IF_ERROR(engine->set_timing(true));
  auto impl = std::make_unique<cuda::ExecutorImpl>(std::move(weights), l, o, std::move(engine));
  impl->kv_sizing_ = sizing;
  return std::unique_ptr<CudaExecutor>(new CudaExecutor(std::move(impl)));
}

CudaExecutor::CudaExecutor(std::unique_ptr<cuda::ExecutorImpl> impl) : impl_(std::move(impl)) {}
CudaExecutor::~CudaExecutor() = default;

Status CudaExecutor::initialize() {
  const CudaExecutorOptions& o = impl_->options_;
  const auto t0 = std::chrono::steady_clock::now();
  bool ok = true;
  // The decode graphs first: with tune_gemm their shapes are timed as they warm, and the
  // prefill warm-up then finds those plans built.
  if (o.cuda_graph_for_decode && o.capture_graphs_at_start) ok = impl_->capture_decode_graphs();
  if (ok && o.warm_prefill_gemms) ok = impl_->warm_prefill_gemms();
  impl_->initialize_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return ok ? Status::Ok() : Internal(impl_->last_error_);
}

size_t CudaExecutor::preferred_batch_tokens() const {
  return static_cast<size_t>(impl_->limits_.step_width);
}

std::optional<SessionId> CudaExecutor::open_session() {
  return impl_->sessions_.open();
}

void CudaExecutor::close_session(SessionId id) {
  impl_->leave_ahead(id);
  impl_->sessions_.close(id);
}

std::optional<SessionId> CudaExecutor::clone(SessionId source, Position upto) {
  impl_->settle_for(source);
  std::optional<SeqId> src_seq = impl_->sessions_.seq_of(source);
  std::optional<SessionId> child = impl_->sessions_.clone(source, upto);
  if (!child) return std::nullopt;
  const SeqId dst_seq = *impl_->sessions_.seq_of(*child);
  const Status s = impl_->engine_->copy_table_prefix(dst_seq, *src_seq, upto);
  if (!s.ok()) {
    impl_->sessions_.close(*child);
    impl_->fail_cuda(s);
    return std::nullopt;
  }
  return child;
}

void CudaExecutor::set_sampling(SessionId id, const SamplingParams& params,
                                std::optional<uint64_t> seed) {
  impl_->settle_for(id);
  impl_->sessions_.set_sampling(id, params, seed);
}

bool CudaExecutor::set_logits_processor(SessionId id, std::shared_ptr<LogitsProcessor> processor) {
  // A step queued ahead may hold the session's next token, sampled without the processor.
  impl_->settle_for(id);
  return impl_->sessions_.set_logits_processor(id, std::move(processor));
}

Status CudaExecutor::execute(const BatchInput& batch, BatchOutput& out) {
  if (impl_->execute(batch, out)) return Status::Ok();
  // The batch's cells may not hold what its sessions' histories say: cache none of them.
  for (const Input& in : batch.inputs) impl_->sessions_.taint(in.sid);
  return Internal(impl_->last_error_);
}

KvBudget CudaExecutor::kv_budget() const {
  // The step ahead's cells are free to the next batch: it uses them or gives them back.
  return impl_->sessions_.kv_budget(impl_->ahead_cells());
}

Position CudaExecutor::attach_prefix(SessionId id, std::span<const Token> tokens) {
  // An empty session holds no row of the step ahead (release_cells settled it).
  const Position n =
      impl_->sessions_.attach_prefix(id, tokens, std::numeric_limits<int64_t>::max());
  if (n == 0) return 0;
  const SeqId seq = *impl_->sessions_.seq_of(id);
  // In stream order after a step ahead that may still write the row of a closed
  // session that had this sequence id.
  const Status s = impl_->engine_->write_table_row(seq, impl_->pool_.cells_of(seq));
  if (!s.ok()) {
    impl_->release_cells_of(id);
    impl_->fail_cuda(s);
    return 0;
  }
  return n;
}

bool CudaExecutor::release_cells(SessionId id) {
  impl_->settle_for(id);
  return impl_->sessions_.release_cells(id);
}

bool CudaExecutor::reserve(SessionId id, int64_t cells) {
  impl_->settle_for(id);
  return impl_->sessions_.reserve(id, cells);
}

KvMetrics CudaExecutor::kv_metrics() const {
  KvMetrics m;
  impl_->sessions_.fill_kv_metrics(m, impl_->ahead_cells());
  m.rows_allocated = impl_->limits_.max_cells;
  m.allocated_bytes = impl_->engine_->kv_allocated_bytes();
  m.bytes_per_cell = impl_->engine_->kv_bytes_per_cell();
  m.growth_count = 0;
  return m;
}

const CudaExecutorOptions& CudaExecutor::options() const {
  return impl_->options_;
}
const ExecutorLimits& CudaExecutor::limits() const {
  return impl_->limits_;
}
const CudaExecutor::KvSizing& CudaExecutor::kv_sizing() const {
  return impl_->kv_sizing_;
}
const std::string& CudaExecutor::last_error() const {
  return impl_->last_error_;
}
CudaExecutor::MethodCalls CudaExecutor::method_calls() const {
  MethodCalls calls = impl_->calls_;
  calls.logits_graph_captures = impl_->engine_->logits_graph_captures();
  calls.adjusted_rows = impl_->engine_->adjusted_rows();
  return calls;
}
CudaExecutor::StepTimes CudaExecutor::step_times() const {
  return impl_->times_;
}

double CudaExecutor::initialize_seconds() const {
  return impl_->initialize_seconds_;
}
int64_t CudaExecutor::warmed_prefill_kernels() const {
  return impl_->warmed_prefill_kernels_;
}

std::vector<std::string> CudaExecutor::decode_graph_notes() const {
  return impl_->engine_->graph_notes();
}

}  // namespace cellm
