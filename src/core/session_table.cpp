#include "core/session_table.h"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <random>
#include <string>
#include <utility>

namespace cellm {
namespace {

std::string session_name(SessionId sid) {
  return "session " + std::to_string(sid);
}

// Where one sequence stands while a batch is being checked.
struct Cursor {
  SeqId seq = 0;
  int64_t next = 0;  // the position the sequence's next input must start at
};

}  // namespace

SliceRows select_rows(const PackedStep& step, int32_t offset, int32_t length) {
  // REQUIRES: the slice [offset, offset + length) is non-empty and inside the step.
  CELLM_CHECK_MSG(
      offset >= 0 && length > 0 &&
          static_cast<size_t>(offset) + static_cast<size_t>(length) <= step.tokens.size(),
      "slice [" + std::to_string(offset) + ", +" + std::to_string(length) + ") of a step of " +
          std::to_string(step.tokens.size()) + " tokens");
  SliceRows rows;
  for (size_t input = 0; input < step.output_rows.size(); ++input) {
    const std::optional<int32_t>& row = step.output_rows[input];
    if (!row || *row < offset || *row >= offset + length) continue;
    rows.selector.push_back(*row - offset);
    rows.inputs.push_back(static_cast<int32_t>(input));
  }
  if (rows.selector.empty()) rows.selector.push_back(length - 1);
  return rows;
}

SessionTable::SessionTable(CellPool& pool, int32_t max_sessions, int32_t max_session_tokens,
                           int32_t vocab_size, bool prefix_cache)
    : pool_(pool),
      max_sessions_(max_sessions),
      max_session_tokens_(max_session_tokens),
      vocab_size_(vocab_size) {
  CELLM_CHECK(max_sessions > 0);
  CELLM_CHECK(max_session_tokens > 0);
  CELLM_CHECK(vocab_size > 0);
  if (prefix_cache) {
    cache_ = std::make_unique<RadixCache>(pool_);
    pool_.set_reclaimer([this](int64_t need) { return cache_->evict(need); });
  }
}

SessionTable::~SessionTable() {
  if (cache_) {
    pool_.set_reclaimer({});
    cache_.reset();
  }
}

std::optional<SessionId> SessionTable::open() {
  if (size() >= max_sessions_) return std::nullopt;
  const SessionId sid = next_sid_++;
  sessions_.emplace(sid, Entry{pool_.seq_new(), std::nullopt, {}, false});
  return sid;
}

void SessionTable::close(SessionId sid) {
  auto it = sessions_.find(sid);
  if (it == sessions_.end()) return;
  if (cache_) cache_history(it->second);
  pool_.seq_rm(it->second.seq);
  sessions_.erase(it);
}

void SessionTable::cache_history(const Entry& entry) {
  if (entry.tainted) return;
  const size_t n = std::min(entry.tokens.size(), static_cast<size_t>(pool_.pos(entry.seq)));
  const std::span<const Token> tokens(entry.tokens);
  cache_->insert(tokens.first(n), pool_.cells_of(entry.seq).first(n));
}

void SessionTable::note_committed(SessionId sid, Position position, Token token) {
  if (!cache_) return;
  auto it = sessions_.find(sid);
  if (it == sessions_.end() || it->second.tainted) return;
  Entry& entry = it->second;
  if (position < 0 || static_cast<size_t>(position) > entry.tokens.size()) {
    taint(sid);
    return;
  }
  entry.tokens.resize(static_cast<size_t>(position));
  entry.tokens.push_back(token);
}

void SessionTable::taint(SessionId sid) {
  auto it = sessions_.find(sid);
  if (it == sessions_.end()) return;
  it->second.tainted = true;
  std::vector<Token>().swap(it->second.tokens);
}

Position SessionTable::attach_prefix(SessionId sid, std::span<const Token> tokens,
                                     int64_t max_pin) {
  auto it = sessions_.find(sid);
  if (!cache_ || it == sessions_.end() || pool_.pos(it->second.seq) != 0) return 0;
  Entry& entry = it->second;
  // Pinning no more than the unreserved room keeps every reservation whole.
  const int64_t pin = std::min(max_pin, pool_.unreserved_cells());
  ++stats_.lookups;
  const std::vector<CellId> cells = cache_->match(tokens, max_session_tokens_, pin);
  if (cells.empty() || !pool_.seq_attach(entry.seq, cells)) return 0;
  ++stats_.hits;
  stats_.hit_tokens += static_cast<int64_t>(cells.size());
  entry.tokens.assign(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(cells.size()));
  entry.tainted = false;
  return static_cast<Position>(cells.size());
}

bool SessionTable::release_cells(SessionId sid) {
  auto it = sessions_.find(sid);
  if (it == sessions_.end()) return false;
  Entry& entry = it->second;
  if (cache_) cache_history(entry);
  const bool rewound = pool_.rewind(entry.seq, 0);
  CELLM_CHECK(rewound);
  entry.tokens.clear();
  entry.tainted = false;
  return true;
}

std::span<const Token> SessionTable::history(SessionId sid) const {
  auto it = sessions_.find(sid);
  if (!cache_ || it == sessions_.end() || it->second.tainted) return {};
  return it->second.tokens;
}

bool SessionTable::reserve(SessionId sid, int64_t cells) {
  auto it = sessions_.find(sid);
  if (it == sessions_.end()) return false;
  return pool_.set_reservation(it->second.seq, cells);
}

KvBudget SessionTable::kv_budget(int64_t in_flight) const {
  KvBudget b;
  b.capacity = pool_.capacity();
  b.free = int64_t{pool_.free_cells()} + in_flight;
  b.cached = pool_.cached_only_cells();
  b.reserved = pool_.reserved_cells();
  b.max_context = max_session_tokens_;
  return b;
}

void SessionTable::fill_kv_metrics(KvMetrics& m, int64_t in_flight) const {
  m.cells_capacity = pool_.capacity();
  m.cells_in_use = int64_t{pool_.used_cells()} - pool_.cached_only_cells() - in_flight;
  m.cells_cached = pool_.cached_only_cells();
  m.cells_reserved = pool_.reserved_cells();
  m.used_end = pool_.used_end();
  m.prefix_lookups = stats_.lookups;
  m.prefix_hits = stats_.hits;
  m.prefix_hit_tokens = stats_.hit_tokens;
  m.evicted_cells = cache_ ? cache_->evicted_cells() : 0;
}

std::optional<SessionId> SessionTable::clone(SessionId src, Position upto) {
  auto it = sessions_.find(src);
  if (it == sessions_.end() || size() >= max_sessions_) return std::nullopt;
  if (upto < 0 || upto > max_session_tokens_ || upto > pool_.pos(it->second.seq)) {
    return std::nullopt;
  }
  const std::optional<SeqId> seq = pool_.seq_clone(it->second.seq, upto);
  if (!seq) return std::nullopt;
  const SessionId sid = next_sid_++;
  Entry entry{*seq, std::nullopt, {}, false};
  if (cache_) {
    const Entry& source = it->second;
    entry.tainted = source.tainted || source.tokens.size() < static_cast<size_t>(upto);
    if (!entry.tainted) entry.tokens.assign(source.tokens.begin(), source.tokens.begin() + upto);
  }
  sessions_.emplace(sid, std::move(entry));
  return sid;
}

void SessionTable::set_sampling(SessionId sid, const SamplingParams& params,
                                std::optional<uint64_t> seed) {
  // REQUIRES: validate_sampling(params).ok().
  CELLM_CHECK_MSG(validate_sampling(params).ok(), validate_sampling(params).message());
  auto it = sessions_.find(sid);
  if (it == sessions_.end()) return;
  uint64_t s = 0;
  if (seed) {
    s = *seed;
  } else {
    std::random_device device;
    s = (static_cast<uint64_t>(device()) << 32) | device();
  }
  it->second.policy = SamplingPolicy{params, s, nullptr};
}

bool SessionTable::set_logits_processor(SessionId sid, std::shared_ptr<LogitsProcessor> processor) {
  auto it = sessions_.find(sid);
  if (it == sessions_.end() || !it->second.policy) return false;
  it->second.policy->processor = std::move(processor);
  return true;
}

LogitsProcessor* SessionTable::logits_processor(SessionId sid) const {
  const SamplingPolicy* policy = policy_of(sid);
  return policy != nullptr ? policy->processor.get() : nullptr;
}

Result<PackedStep> SessionTable::pack(const BatchInput& batch) {
  PackedStep step;
  step.output_rows.reserve(batch.inputs.size());
  const size_t total = batch.size();
  step.tokens.reserve(total);
  step.positions.reserve(total);
  step.seq_ids.reserve(total);
  step.sids.reserve(total);

  // Every input is checked (and flattened into the local step) before anything
  // changes; the rewinds wait until all have passed.
  std::unordered_map<SessionId, Cursor> cursors;
  std::vector<std::pair<SeqId, Position>> rewinds;
  for (size_t i = 0; i < batch.inputs.size(); ++i) {
    const Input& in = batch.inputs[i];
    auto entry = sessions_.find(in.sid);
    if (entry == sessions_.end()) {
      return InvalidArgument("input " + std::to_string(i) + ": " + session_name(in.sid) +
                             " is not open");
    }
    const auto where = [&] { return "input " + std::to_string(i) + " of " + session_name(in.sid); };
    if (!in.tokens) return InvalidArgument(where() + ": no token buffer");
    if (in.size == 0) return InvalidArgument(where() + ": empty slice");
    const size_t buffer = in.tokens->size();
    if (in.offset > buffer || in.size > buffer - in.offset) {
      return InvalidArgument(where() + ": slice [" + std::to_string(in.offset) + ", " +
                             std::to_string(in.offset + in.size) +
                             ") lies outside its token buffer of " + std::to_string(buffer) +
                             " tokens");
    }
    const int64_t start = static_cast<int64_t>(in.position) + static_cast<int64_t>(in.offset);
    const int64_t end = start + static_cast<int64_t>(in.size);
    if (start < 0) {
      return InvalidArgument(where() + ": slice starts at negative position " +
                             std::to_string(start));
    }

    auto [cursor, first] = cursors.try_emplace(in.sid, Cursor{entry->second.seq, 0});
    if (first) cursor->second.next = pool_.pos(entry->second.seq);
    const int64_t next = cursor->second.next;
    if (start > next) {
      return InvalidArgument(where() + ": starts at position " + std::to_string(start) +
                             " but the session continues at " + std::to_string(next) + " (a gap)");
    }
    if (start < next) {
      if (!first) {
        return InvalidArgument(where() + ": starts at position " + std::to_string(start) +
                               ", overlapping the batch's earlier input that ends at " +
                               std::to_string(next));
      }
      if (start == 0) {
        return InvalidArgument(where() + ": reopens from the start (position 0) a session of " +
                               std::to_string(next) + " tokens");
      }
      rewinds.emplace_back(entry->second.seq, static_cast<Position>(start));
    }
    if (end > max_session_tokens_) {
      return OutOfResources(where() + ": slice [" + std::to_string(start) + ", " +
                            std::to_string(end) + ") ends past max_session_tokens " +
                            std::to_string(max_session_tokens_));
    }
    cursor->second.next = end;

    for (size_t t = 0; t < in.size; ++t) {
      step.tokens.push_back(in.token(t));
      step.positions.push_back(static_cast<Position>(start + static_cast<int64_t>(t)));
      step.seq_ids.push_back(entry->second.seq);
      step.sids.push_back(in.sid);
    }
    if (in.produce_output) {
      step.output_rows.emplace_back(static_cast<int32_t>(step.tokens.size() - 1));
    } else {
      step.output_rows.emplace_back(std::nullopt);
    }
  }

  for (const auto& [seq, position] : rewinds) {
    const bool rewound = pool_.rewind(seq, position);
    CELLM_CHECK_MSG(rewound, "a checked rewind of sequence " + std::to_string(seq) + " to " +
                                 std::to_string(position) + " failed");
  }
  if (cache_) {
    for (const Input& in : batch.inputs) {
      Entry& entry = sessions_.at(in.sid);
      const auto start = static_cast<size_t>(in.start());
      if (entry.tokens.size() < start) taint(in.sid);  // a hole: the history is unknown
      if (entry.tainted) continue;
      entry.tokens.resize(start);
      for (size_t t = 0; t < in.size; ++t) entry.tokens.push_back(in.token(t));
    }
  }
  return step;
}

std::optional<Token> SessionTable::sample(SessionId sid, std::span<const float> logits_row,
                                          Position position) {
  auto it = sessions_.find(sid);
  if (it == sessions_.end() || !it->second.policy) return std::nullopt;
  if (logits_row.size() != static_cast<size_t>(vocab_size_)) return std::nullopt;
  const SamplingPolicy& policy = *it->second.policy;
  const float u = sampling_uniform(policy.seed, position);
  if (policy.processor == nullptr)
    return sample_token(logits_row, policy.params, u, sample_scratch_);
  policy.processor->prepare(adjustments_);
  std::span<const float> row = logits_row;
  if (!adjustments_.empty()) {
    adjusted_row_.assign(logits_row.begin(), logits_row.end());
    apply_logit_adjustments(adjusted_row_, adjustments_);
    row = adjusted_row_;
  }
  const Token token = sample_token(row, policy.params, u, sample_scratch_);
  policy.processor->accept(token);
  return token;
}

std::optional<SampledToken> SessionTable::sample_with_logprobs(SessionId sid,
                                                               std::span<const float> logits_row,
                                                               Position position) {
  const std::optional<Token> token = sample(sid, logits_row, position);
  if (!token) return std::nullopt;
  return SampledToken{*token, logprobs(sid, logits_row, *token)};
}

std::optional<TokenLogprobs> SessionTable::logprobs(SessionId sid,
                                                    std::span<const float> logits_row,
                                                    Token sampled) {
  // REQUIRES: a sampled token inside the vocabulary.
  CELLM_CHECK_MSG(sampled >= 0 && sampled < vocab_size_,
                  "sampled token " + std::to_string(sampled) + " outside the vocabulary");
  if (!wants_logprobs(sid)) return std::nullopt;
  if (logits_row.size() != static_cast<size_t>(vocab_size_)) return std::nullopt;
  const SamplingPolicy& policy = *sessions_.at(sid).policy;
  return token_logprobs(logits_row, sampled, policy.params.num_logprobs, logprob_scratch_);
}

int32_t SessionTable::num_logprobs(SessionId sid) const {
  const SamplingPolicy* policy = policy_of(sid);
  return policy != nullptr ? policy->params.num_logprobs : 0;
}

bool SessionTable::wants_logprobs(SessionId sid) const {
  const SamplingPolicy* policy = policy_of(sid);
  return policy != nullptr && policy->params.num_logprobs > 0;
}

std::optional<SeqId> SessionTable::seq_of(SessionId sid) const {
  auto it = sessions_.find(sid);
  if (it == sessions_.end()) return std::nullopt;
  return it->second.seq;
}

const SamplingPolicy* SessionTable::policy_of(SessionId sid) const {
  auto it = sessions_.find(sid);
  if (it == sessions_.end() || !it->second.policy) return nullptr;
  return &*it->second.policy;
}

Status validate_session_limits(std::string_view who, int32_t max_sessions,
                               int32_t max_session_tokens, int64_t context_tokens) {
  const std::string prefix = std::string(who) + ": ";
  if (max_sessions <= 0 || max_session_tokens <= 0 ||
      int64_t{max_sessions} * max_session_tokens >= std::numeric_limits<int32_t>::max()) {
    return InvalidArgument(prefix + "invalid session limits: max_sessions " +
                           std::to_string(max_sessions) + " x max_session_tokens " +
                           std::to_string(max_session_tokens) +
                           " must be positive and below 2^31 - 1");
  }
  if (max_session_tokens > context_tokens) {
    return InvalidArgument(prefix + "max_session_tokens " + std::to_string(max_session_tokens) +
                           " exceeds the model's context of " + std::to_string(context_tokens) +
                           " tokens");
  }
  return Status::Ok();
}

Status validate_capacity(std::string_view who, int32_t max_sessions, int32_t max_session_tokens,
                         int64_t max_cells) {
  const int64_t cells = int64_t{max_sessions} * max_session_tokens;
  if (cells >= max_cells) {
    return InvalidArgument(std::string(who) + ": max_sessions " + std::to_string(max_sessions) +
                           " x max_session_tokens " + std::to_string(max_session_tokens) + " = " +
                           std::to_string(cells) + " cells must be below max_cells " +
                           std::to_string(max_cells) +
                           " (one cell is a scratch row that is never handed out)");
  }
  return Status::Ok();
}

Status check_tokens_in_vocab(const PackedStep& step, int64_t vocab_size) {
  for (size_t i = 0; i < step.tokens.size(); ++i) {
    if (step.tokens[i] < 0 || step.tokens[i] >= vocab_size) {
      return InvalidArgument("token " + std::to_string(step.tokens[i]) + " of session " +
                             std::to_string(step.sids[i]) + " is outside the vocabulary [0, " +
                             std::to_string(vocab_size) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace cellm
