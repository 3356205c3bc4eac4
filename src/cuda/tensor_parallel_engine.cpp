// TensorParallelEngine (cuda/tensor_parallel_engine.h): the rank workers, the setup
// that sizes the ranks, and the ForwardEngine calls run on every rank at once.
#include "cuda/tensor_parallel_engine.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "cuda/cuda_check.h"
#include "cuda/nccl_group.h"

namespace cellm::cuda {

// One rank's thread, bound to its device once; runs one posted job at a time.
class RankWorker {
 public:
  explicit RankWorker(int device) : device_(device), thread_([this] { loop(); }) {}
  ~RankWorker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  RankWorker(const RankWorker&) = delete;
  RankWorker& operator=(const RankWorker&) = delete;

  // REQUIRES: no job pending (post, then wait, before the next post).
  void post(std::function<Status()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = std::move(job);
      result_ = Status::Ok();
    }
    wake_.notify_all();
  }
  Status wait() {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return !job_; });
    return result_;
  }

 private:
  void loop() {
    const cudaError_t bound = cudaSetDevice(device_);
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [this] { return stop_ || static_cast<bool>(job_); });
      if (!job_) return;  // stopping with nothing pending
      std::function<Status()> job = job_;
      lock.unlock();
      Status status = bound == cudaSuccess
                          ? job()
                          : Internal("selecting device " + std::to_string(device_) + ": " +
                                     cudaGetErrorString(bound));
      lock.lock();
      result_ = std::move(status);
      job_ = nullptr;
      done_.notify_all();
    }
  }

  int device_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::function<Status()> job_;
  Status result_ = Status::Ok();
  bool stop_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

struct TensorParallelEngine::Setup::State {
  CudaExecutorOptions options;
  std::vector<int> devices;
  std::vector<ShardPlan> plans;
  VocabSlices slices;
  std::vector<std::optional<ModelWeights>> shards;  // on the host until build()
  std::vector<size_t> free;
  // Declared before the group and the engines, so destroyed after them.
  std::vector<std::unique_ptr<RankWorker>> workers;
  std::unique_ptr<NcclGroup> group;
  std::vector<std::unique_ptr<ForwardEngine>> engines;

  int world() const { return static_cast<int>(devices.size()); }
  RankLink link(int rank) const {
    RankLink l;
    l.group = group.get();
    l.rank = rank;
    l.slices = slices;
    return l;
  }
  // fn(r) on every worker at once; the first failing rank's error.
  Status each(const std::function<Status(int)>& fn) {
    for (int r = 0; r < world(); ++r) {
      workers[static_cast<size_t>(r)]->post([&fn, r] { return fn(r); });
    }
    Status first = Status::Ok();
    for (int r = 0; r < world(); ++r) {
      Status s = workers[static_cast<size_t>(r)]->wait();
      if (first.ok() && !s.ok()) first = std::move(s);
    }
    return first;
  }
  ~State() {
    // Each engine is released on its own device (its streams, events and buffers).
    if (!engines.empty() && workers.size() == engines.size()) {
      (void)each([this](int r) {
        engines[static_cast<size_t>(r)].reset();
        return Status::Ok();
      });
    }
  }
};

TensorParallelEngine::Setup::Setup(std::unique_ptr<State> state) : state_(std::move(state)) {}
TensorParallelEngine::Setup::~Setup() = default;
TensorParallelEngine::Setup::Setup(Setup&&) noexcept = default;
TensorParallelEngine::Setup& TensorParallelEngine::Setup::operator=(Setup&&) noexcept = default;

int TensorParallelEngine::Setup::world() const {
  return state_->world();
}

const ModelWeights& TensorParallelEngine::Setup::shard(int rank) const {
  return *state_->shards[static_cast<size_t>(rank)];
}

ForwardEngine::DeviceBytes TensorParallelEngine::Setup::device_bytes(
    int rank, const ForwardDims& dims) const {
  DeviceBytes b = ForwardEngine::device_bytes(shard(rank), dims, state_->options.precision);
  b.buffers += ForwardEngine::rank_link_bytes(dims, state_->link(rank));
  return b;
}

size_t TensorParallelEngine::Setup::free_bytes(int rank) const {
  return state_->free[static_cast<size_t>(rank)];
}

size_t TensorParallelEngine::Setup::planning_free_bytes(const ForwardDims& dims) const {
  const size_t base = device_bytes(0, dims).total();
  size_t least = free_bytes(0);
  for (int r = 1; r < world(); ++r) {
    const size_t need = device_bytes(r, dims).total();
    const size_t extra = need > base ? need - base : 0;
    const size_t avail = free_bytes(r) > extra ? free_bytes(r) - extra : 0;
    least = std::min(least, avail);
  }
  return least;
}

Result<TensorParallelEngine::Setup> TensorParallelEngine::prepare(
    const ModelConfig& config, const std::vector<int>& devices, const ShardSource& shards,
    const CudaExecutorOptions& options) {
  const int world = static_cast<int>(devices.size());
  if (world < 1 || world > kMaxVocabRanks) {
    return InvalidArgument("tensor parallelism over " + std::to_string(world) +
                           " GPUs: between 1 and " + std::to_string(kMaxVocabRanks) +
                           " are supported");
  }
  auto state = std::make_unique<Setup::State>();
  state->options = options;
  state->devices = devices;
  state->slices.world = world;
  for (int r = 0; r < world; ++r) {
    Result<ShardPlan> plan = plan_shard(config, r, world);
    if (!plan.ok()) {
      return InvalidArgument("--tensor-parallel " + std::to_string(world) + ": " +
                             plan.status().message());
    }
    state->slices.begin[r] = plan->vocab_begin;
    state->slices.size[r] = plan->vocab_size;
    state->plans.push_back(*plan);
  }
  CELLM_ASSIGN_OR_RETURN(state->group, NcclGroup::create(devices));
  state->shards.resize(static_cast<size_t>(world));
  state->free.assign(static_cast<size_t>(world), 0);
  for (int device : devices) state->workers.push_back(std::make_unique<RankWorker>(device));
  Setup::State* s = state.get();
  CELLM_RETURN_IF_ERROR(s->each([s, &shards](int r) -> Status {
    const auto i = static_cast<size_t>(r);
    Result<ModelWeights> w = shards(s->plans[i]);
    if (!w.ok()) return w.status();
    s->shards[i].emplace(std::move(*w));
    size_t total = 0;
    CELLM_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&s->free[i], &total), "reading free device memory");
    return Status::Ok();
  }));
  return Setup(std::move(state));
}

Result<std::unique_ptr<TensorParallelEngine>> TensorParallelEngine::build(Setup setup,
                                                                          const ForwardDims& dims) {
  Setup::State* s = setup.state_.get();
  s->engines.resize(static_cast<size_t>(s->world()));
  CELLM_RETURN_IF_ERROR(s->each([s, &dims](int r) -> Status {
    const auto i = static_cast<size_t>(r);
    CELLM_ASSIGN_OR_RETURN(s->engines[i],
                           ForwardEngine::create_rank(*s->shards[i], dims, s->options, s->link(r)));
    s->shards[i].reset();  // uploaded
    return Status::Ok();
  }));
  return std::unique_ptr<TensorParallelEngine>(new TensorParallelEngine(std::move(setup.state_)));
}

TensorParallelEngine::TensorParallelEngine(std::unique_ptr<Setup::State> state)
    : state_(std::move(state)) {}

TensorParallelEngine::~TensorParallelEngine() = default;

int TensorParallelEngine::world() const {
  return state_->world();
}

ForwardEngine& TensorParallelEngine::rank(int r) {
  return *state_->engines[static_cast<size_t>(r)];
}

Status TensorParallelEngine::on_all(const std::function<Status(int, ForwardEngine&)>& fn) {
  return state_->each([this, &fn](int r) { return fn(r, rank(r)); });
}

void TensorParallelEngine::share_staging(int32_t n, int32_t n_sel) {
  const StepHost& from = host();
  const auto rows = static_cast<size_t>(n);
  const auto sel = static_cast<size_t>(n_sel);
  for (int r = 1; r < world(); ++r) {
    StepHost& to = rank(r).host();
    std::memcpy(to.tokens, from.tokens, rows * sizeof(int32_t));
    std::memcpy(to.positions, from.positions, rows * sizeof(int32_t));
    std::memcpy(to.row_seq, from.row_seq, rows * sizeof(int32_t));
    std::memcpy(to.cells, from.cells, rows * sizeof(int32_t));
    std::memcpy(to.selected, from.selected, sel * sizeof(int32_t));
    std::memcpy(to.sampling, from.sampling, sel * sizeof(SamplingRow));
  }
}

namespace {

// A run's adjustments computed once, by the first rank that asks, for every rank.
class SharedAdjustments {
 public:
  explicit SharedAdjustments(const AdjustmentSource* source) : source_(source) {}
  const AdjustmentSource* get() const { return source_ == nullptr ? nullptr : &each_; }

 private:
  std::span<const RowAdjustments> rows() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) {
      rows_ = (*source_)();
      done_ = true;
    }
    return rows_;
  }
  const AdjustmentSource* source_;
  std::mutex mu_;
  bool done_ = false;
  std::span<const RowAdjustments> rows_;
  AdjustmentSource each_ = [this] { return rows(); };
};

}  // namespace

StepHost& TensorParallelEngine::host() {
  return rank(0).host();
}

const ForwardDims& TensorParallelEngine::dims() const {
  return state_->engines.front()->dims();
}

Status TensorParallelEngine::run_eager(int32_t n, int32_t n_sel,
                                       std::span<const int32_t> logit_rows,
                                       const AdjustmentSource* adjust) {
  share_staging(n, n_sel);
  SharedAdjustments shared(adjust);
  return on_all(
      [&](int, ForwardEngine& e) { return e.run_eager(n, n_sel, logit_rows, shared.get()); });
}

Status TensorParallelEngine::run_decode_graph(int32_t bucket, std::span<const int32_t> logit_rows,
                                              const AdjustmentSource* adjust) {
  share_staging(bucket, bucket);
  SharedAdjustments shared(adjust);
  return on_all(
      [&](int, ForwardEngine& e) { return e.run_decode_graph(bucket, logit_rows, shared.get()); });
}

bool TensorParallelEngine::has_decode_graph(int32_t bucket) const {
  return state_->engines.front()->has_decode_graph(bucket);
}

Status TensorParallelEngine::queue_decode_graph(int32_t bucket) {
  share_staging(bucket, bucket);
  return on_all([&](int, ForwardEngine& e) { return e.queue_decode_graph(bucket); });
}

Result<std::span<const int32_t>> TensorParallelEngine::wait_queued() {
  std::vector<std::span<const int32_t>> tokens(static_cast<size_t>(world()));
  CELLM_RETURN_IF_ERROR(on_all([&](int r, ForwardEngine& e) -> Status {
    CELLM_ASSIGN_OR_RETURN(tokens[static_cast<size_t>(r)], e.wait_queued());
    return Status::Ok();
  }));
  return tokens.front();
}

std::span<const float> TensorParallelEngine::host_logits(size_t k) const {
  return state_->engines.front()->host_logits(k);
}

Result<int64_t> TensorParallelEngine::warm_products() {
  std::vector<int64_t> ran(static_cast<size_t>(world()), 0);
  CELLM_RETURN_IF_ERROR(on_all([&](int r, ForwardEngine& e) -> Status {
    CELLM_ASSIGN_OR_RETURN(ran[static_cast<size_t>(r)], e.warm_products());
    return Status::Ok();
  }));
  return ran.front();
}

Status TensorParallelEngine::copy_table_prefix(int32_t dst, int32_t src, int32_t upto) {
  return on_all([&](int, ForwardEngine& e) { return e.copy_table_prefix(dst, src, upto); });
}

Status TensorParallelEngine::write_table_row(int32_t seq, std::span<const int32_t> cells) {
  return on_all([&](int, ForwardEngine& e) { return e.write_table_row(seq, cells); });
}

Status TensorParallelEngine::set_timing(bool on) {
  return on_all([&](int, ForwardEngine& e) { return e.set_timing(on); });
}

double TensorParallelEngine::last_device_ms() const {
  double ms = 0;
  for (const auto& e : state_->engines) ms = std::max(ms, e->last_device_ms());
  return ms;
}

int64_t TensorParallelEngine::kv_bytes_per_cell() const {
  return state_->engines.front()->kv_bytes_per_cell();
}
int64_t TensorParallelEngine::kv_allocated_bytes() const {
  return state_->engines.front()->kv_allocated_bytes();
}
int64_t TensorParallelEngine::graph_captures() const {
  return state_->engines.front()->graph_captures();
}
int64_t TensorParallelEngine::graph_replays() const {
  return state_->engines.front()->graph_replays();
}
int64_t TensorParallelEngine::logits_graph_captures() const {
  return state_->engines.front()->logits_graph_captures();
}
int64_t TensorParallelEngine::adjusted_rows() const {
  return state_->engines.front()->adjusted_rows();
}
const std::vector<std::string>& TensorParallelEngine::graph_notes() const {
  return state_->engines.front()->graph_notes();
}

}  // namespace cellm::cuda
