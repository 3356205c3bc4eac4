#include "support/fake_executor.h"

#include <chrono>
#include <map>
#include <stdexcept>
#include <utility>

namespace cellm::testing {
namespace {

constexpr auto kWaitLimit = std::chrono::seconds(5);

std::string describe(const BatchInput& batch) {
  std::string s = "execute [";
  for (size_t i = 0; i < batch.inputs.size(); ++i) {
    const Input& in = batch.inputs[i];
    if (i > 0) s += ",";
    s += std::to_string(in.sid) + "@" + std::to_string(in.start()) + "+" + std::to_string(in.size);
    if (in.produce_output) s += "!";
  }
  return s + "]";
}

}  // namespace

// --- configuration ---

void FakeExecutor::set_initialize_result(Status result) {
  std::lock_guard<std::mutex> lock(mu_);
  initialize_result_ = std::move(result);
}

void FakeExecutor::set_capacity(int max_open_sessions) {
  std::lock_guard<std::mutex> lock(mu_);
  capacity_ = max_open_sessions;
}

void FakeExecutor::set_clone_supported(bool supported) {
  std::lock_guard<std::mutex> lock(mu_);
  clone_supported_ = supported;
}

void FakeExecutor::set_clone_throws(bool throws) {
  std::lock_guard<std::mutex> lock(mu_);
  clone_throws_ = throws;
}

void FakeExecutor::set_accepts_processors(bool accepts) {
  std::lock_guard<std::mutex> lock(mu_);
  accepts_processors_ = accepts;
}

void FakeExecutor::set_tokens_per_output(int n) {
  std::lock_guard<std::mutex> lock(mu_);
  tokens_per_output_ = n;
}

void FakeExecutor::script_tokens(SessionId sid, std::vector<Token> tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& script = scripts_[sid];
  script.insert(script.end(), tokens.begin(), tokens.end());
}

void FakeExecutor::fail_batches_from(int64_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_from_ = index;
}

void FakeExecutor::set_malformation(Malformation m, int64_t from_batch) {
  std::lock_guard<std::mutex> lock(mu_);
  malformation_ = m;
  malformed_from_ = from_batch;
}

void FakeExecutor::set_execute_hook(std::function<void(int64_t, const BatchInput&)> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  execute_hook_ = std::move(hook);
}

void FakeExecutor::hold() {
  std::lock_guard<std::mutex> lock(mu_);
  held_ = true;
}

void FakeExecutor::hold_initialize() {
  std::lock_guard<std::mutex> lock(mu_);
  init_held_ = true;
}

void FakeExecutor::release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = false;
    init_held_ = false;
  }
  cv_.notify_all();
}

bool FakeExecutor::wait_in_execute() {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, kWaitLimit, [this] { return in_execute_; });
}

bool FakeExecutor::wait_in_initialize() {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, kWaitLimit, [this] { return initialize_entered_; });
}

// --- observations ---

std::vector<std::string> FakeExecutor::calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return calls_;
}

std::vector<ExecutedInput> FakeExecutor::executed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return executed_;
}

std::vector<int> FakeExecutor::batch_sizes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return batch_sizes_;
}

std::vector<SessionId> FakeExecutor::opened() const {
  std::lock_guard<std::mutex> lock(mu_);
  return opened_;
}

std::vector<SessionId> FakeExecutor::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

int FakeExecutor::open_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(sessions_.size());
}

bool FakeExecutor::wait_open_count(int n) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, kWaitLimit, [&] { return static_cast<int>(sessions_.size()) == n; });
}

int FakeExecutor::initialize_calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return initialize_calls_;
}

bool FakeExecutor::called_before_initialize() const {
  std::lock_guard<std::mutex> lock(mu_);
  return called_before_initialize_;
}

bool FakeExecutor::executed_without_sampling() const {
  std::lock_guard<std::mutex> lock(mu_);
  return executed_without_sampling_;
}

std::optional<SamplingInstall> FakeExecutor::sampling(SessionId sid) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sampling_.find(sid);
  if (it == sampling_.end()) return std::nullopt;
  return it->second;
}

std::vector<Token> FakeExecutor::history(SessionId sid) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(sid);
  return it == sessions_.end() ? std::vector<Token>{} : it->second;
}

std::set<std::thread::id> FakeExecutor::call_threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return call_threads_;
}

std::vector<std::string> FakeExecutor::violations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return violations_;
}

// --- Executor ---

void FakeExecutor::log(std::string call) {
  calls_.push_back(std::move(call));
}

void FakeExecutor::note_call() {
  call_threads_.insert(std::this_thread::get_id());
  if (initialize_calls_ == 0) called_before_initialize_ = true;
}

Token FakeExecutor::next_token(SessionId sid, Position p) {
  auto it = scripts_.find(sid);
  if (it != scripts_.end() && !it->second.empty()) {
    const Token t = it->second.front();
    it->second.pop_front();
    return t;
  }
  return token_at(sid, p);
}

Status FakeExecutor::initialize() {
  std::unique_lock<std::mutex> lock(mu_);
  call_threads_.insert(std::this_thread::get_id());
  initialize_entered_ = true;
  cv_.notify_all();
  cv_.wait(lock, [this] { return !init_held_; });
  initialize_calls_++;
  log("initialize");
  return initialize_result_;
}

std::optional<SessionId> FakeExecutor::open_session() {
  std::lock_guard<std::mutex> lock(mu_);
  note_call();
  if (static_cast<int>(sessions_.size()) >= capacity_) {
    log("open refused");
    return std::nullopt;
  }
  const SessionId id = next_id_++;
  sessions_[id];
  opened_.push_back(id);
  log("open " + std::to_string(id));
  cv_.notify_all();
  return id;
}

void FakeExecutor::close_session(SessionId id) {
  std::lock_guard<std::mutex> lock(mu_);
  note_call();
  log("close " + std::to_string(id));
  closed_.push_back(id);
  sessions_.erase(id);
  sampling_.erase(id);
  processors_.erase(id);
  cv_.notify_all();
}

std::optional<SessionId> FakeExecutor::clone(SessionId source, Position upto) {
  std::lock_guard<std::mutex> lock(mu_);
  note_call();
  const std::string call = "clone " + std::to_string(source) + "@" + std::to_string(upto);
  if (clone_throws_) {
    log(call + " threw");
    throw std::runtime_error("clone failed");
  }
  auto it = sessions_.find(source);
  if (it == sessions_.end() || upto < 0 || static_cast<size_t>(upto) > it->second.size()) {
    violations_.push_back(call + " outside the committed history");
    log(call + " refused");
    return std::nullopt;
  }
  if (!clone_supported_ || static_cast<int>(sessions_.size()) >= capacity_) {
    log(call + " refused");
    return std::nullopt;
  }
  const SessionId id = next_id_++;
  sessions_[id] = std::vector<Token>(it->second.begin(), it->second.begin() + upto);
  opened_.push_back(id);
  log(call + " -> " + std::to_string(id));
  cv_.notify_all();
  return id;
}

void FakeExecutor::set_sampling(SessionId id, const SamplingParams& params,
                                std::optional<uint64_t> seed) {
  std::lock_guard<std::mutex> lock(mu_);
  note_call();
  log("set_sampling " + std::to_string(id));
  if (sessions_.count(id) == 0) violations_.push_back("set_sampling on a closed session");
  sampling_[id] = SamplingInstall{params, seed};
  processors_.erase(id);  // a new policy has no processor until one is set
}

bool FakeExecutor::set_logits_processor(SessionId id, std::shared_ptr<LogitsProcessor> processor) {
  std::lock_guard<std::mutex> lock(mu_);
  note_call();
  log("set_logits_processor " + std::to_string(id));
  if (!accepts_processors_ || sessions_.count(id) == 0 || sampling_.count(id) == 0) return false;
  processors_[id] = std::move(processor);
  return true;
}

std::shared_ptr<LogitsProcessor> FakeExecutor::logits_processor(SessionId sid) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = processors_.find(sid);
  return it == processors_.end() ? nullptr : it->second;
}

Status FakeExecutor::execute(const BatchInput& batch, BatchOutput& out) {
  int64_t index = 0;
  std::function<void(int64_t, const BatchInput&)> hook;
  {
    std::lock_guard<std::mutex> lock(mu_);
    note_call();
    index = n_batches_++;
    log(describe(batch));
    batch_sizes_.push_back(static_cast<int>(batch.inputs.size()));
    for (const Input& in : batch.inputs) {
      ExecutedInput e;
      e.batch = index;
      e.sid = in.sid;
      e.position = in.position;
      e.offset = in.offset;
      e.size = in.size;
      e.produce_output = in.produce_output;
      e.tokens.assign(in.tokens->begin() + static_cast<std::ptrdiff_t>(in.offset),
                      in.tokens->begin() + static_cast<std::ptrdiff_t>(in.offset + in.size));
      executed_.push_back(std::move(e));
    }
    in_execute_ = true;
    hook = execute_hook_;
  }
  cv_.notify_all();
  if (hook) hook(index, batch);

  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !held_; });
  in_execute_ = false;
  if (fail_from_ >= 0 && index >= fail_from_) return Internal(kFailedBatchMessage);

  // A session's inputs in one batch are chunks in order, each starting where
  // the previous ended, and only the last may want output.
  std::map<SessionId, const Input*> previous;
  for (const Input& in : batch.inputs) {
    auto [it, first] = previous.emplace(in.sid, &in);
    if (!first) {
      if (it->second->produce_output || in.start() != it->second->end()) {
        violations_.push_back("session " + std::to_string(in.sid) +
                              " has non-contiguous inputs in one batch");
      }
      it->second = &in;
    }
  }

  out.outputs.assign(batch.inputs.size(), std::nullopt);
  for (size_t i = 0; i < batch.inputs.size(); ++i) {
    const Input& in = batch.inputs[i];
    auto it = sessions_.find(in.sid);
    if (it == sessions_.end()) {
      violations_.push_back("execute on closed session " + std::to_string(in.sid));
      return InvalidState(violations_.back());
    }
    if (sampling_.count(in.sid) == 0) executed_without_sampling_ = true;
    std::vector<Token>& history = it->second;
    if (in.start() < 0 || static_cast<size_t>(in.start()) > history.size()) {
      violations_.push_back("gap in session " + std::to_string(in.sid));
      return InvalidArgument(violations_.back());
    }
    history.resize(static_cast<size_t>(in.start()));  // rewind (no-op when appending)
    for (size_t k = 0; k < in.size; ++k) history.push_back(in.token(k));
    if (!in.produce_output) continue;
    Output o;
    o.sid = in.sid;
    for (int j = 0; j < tokens_per_output_; ++j) {
      o.tokens.push_back(next_token(in.sid, in.end() + j));
    }
    history.insert(history.end(), o.tokens.begin(), o.tokens.end() - 1);
    if (auto proc = processors_.find(in.sid); proc != processors_.end()) {
      LogitAdjustments adjustments;
      for (Token token : o.tokens) {
        proc->second->prepare(adjustments);
        proc->second->accept(token);
      }
    }
    auto policy = sampling_.find(in.sid);
    if (policy != sampling_.end() && policy->second.params.num_logprobs > 0) {
      for (Token token : o.tokens) o.logprobs.push_back(logprobs_for(token));
    }
    out.outputs[i] = std::move(o);
  }

  if (malformation_ != Malformation::kNone && index >= malformed_from_) {
    for (size_t i = 0; i < out.outputs.size(); ++i) {
      std::optional<Output>& o = out.outputs[i];
      switch (malformation_) {
        case Malformation::kMissingOutput:
          o.reset();
          break;
        case Malformation::kUnexpectedOutput:
          if (!o) o = Output{batch.inputs[i].sid, {999}, {}};
          break;
        case Malformation::kEmptyTokens:
          if (o) o->tokens.clear();
          break;
        case Malformation::kWrongSid:
          if (o) o->sid += 1000;
          break;
        case Malformation::kExtraLogprobs:
          if (o) o->logprobs.push_back(logprobs_for(0));
          break;
        case Malformation::kMissingLogprobs:
          if (o) o->logprobs.clear();
          break;
        case Malformation::kShortBatch:
        case Malformation::kNone:
          break;
      }
    }
    if (malformation_ == Malformation::kShortBatch && !out.outputs.empty()) {
      out.outputs.pop_back();
    }
  }
  return Status::Ok();
}

KvMetrics FakeExecutor::kv_metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  KvMetrics m;
  m.cells_capacity = 4096;
  for (const auto& [sid, history] : sessions_) {
    m.cells_in_use += static_cast<int64_t>(history.size());
  }
  m.used_end = m.cells_in_use;
  m.rows_allocated = m.cells_in_use;
  m.bytes_per_cell = 64;
  m.allocated_bytes = m.rows_allocated * m.bytes_per_cell;
  return m;
}

}  // namespace cellm::testing
