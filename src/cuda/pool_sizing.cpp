// The CUDA executor's limits and the size of its KV pool (cuda/pool_sizing.h).
#include "cuda/pool_sizing.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>

#include "core/session_table.h"

namespace cellm::cuda {
namespace {

std::string prefixed(const std::string& m) {
  return "CudaExecutor: " + m;
}

std::string number(double x) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", x);
  return text;
}

std::string mib(size_t bytes) {
  return std::to_string(bytes >> 20) + " MiB";
}

}  // namespace

Result<ExecutorLimits> validate_limits(const ModelWeights* w, ExecutorLimits l,
                                       const CudaExecutorOptions& o) {
  if (w == nullptr) return InvalidArgument(prefixed("no model was given"));
  const int64_t context = w->config().max_position_embeddings();
  const bool cap_given = l.max_session_tokens != 0;
  const auto per_session = static_cast<int32_t>(
      cap_given ? l.max_session_tokens
                : std::min<int64_t>(context, std::numeric_limits<int32_t>::max() - 1));
  CELLM_RETURN_IF_ERROR(
      validate_session_limits("CudaExecutor", l.max_sessions, per_session, context));
  if (l.kv_memory_bytes < 0) {
    return InvalidArgument(prefixed("kv_memory_bytes " + std::to_string(l.kv_memory_bytes) +
                                    " must be positive (or 0 when unset)"));
  }
  if (!(l.kv_memory_fraction >= 0 && l.kv_memory_fraction <= 1)) {
    return InvalidArgument(prefixed("kv_memory_fraction " + number(l.kv_memory_fraction) +
                                    " must be in (0, 1] (or 0 when unset)"));
  }
  const bool by_memory = l.max_cells == 0 && l.kv_memory_fraction > 0;
  if (l.max_cells == 0 && !by_memory && !l.capacity_rule) {
    return InvalidArgument(
        prefixed("with capacity_rule off the KV pool is sized by max_cells or "
                 "kv_memory_fraction, and both are 0"));
  }
  const int64_t sessions_cells = int64_t{l.max_sessions} * per_session;
  const int64_t max_cells = l.max_cells == 0 ? sessions_cells + 1 : l.max_cells;
  if (o.min_prefill < 2 || o.min_prefill > l.step_width ||
      (!by_memory && l.step_width > max_cells)) {
    return InvalidArgument(prefixed(
        "need 2 <= min_prefill <= W <= max_cells, got min_prefill " +
        std::to_string(o.min_prefill) + ", W " + std::to_string(l.step_width) + ", max_cells " +
        (by_memory ? std::string("sized by memory") : std::to_string(max_cells))));
  }
  l.max_session_tokens = per_session;
  if (!by_memory) {
    if (l.capacity_rule) {
      CELLM_RETURN_IF_ERROR(
          validate_capacity("CudaExecutor", l.max_sessions, per_session, max_cells));
    } else if (max_cells < 2) {
      return InvalidArgument(prefixed("max_cells " + std::to_string(max_cells) +
                                      " leaves no cell for a session (one is the scratch row)"));
    } else if (cap_given && per_session >= max_cells) {
      return InvalidArgument(
          prefixed("max_session_tokens " + std::to_string(per_session) + " needs " +
                   std::to_string(int64_t{per_session} + 1) +
                   " cells (one is the scratch row) but the pool holds max_cells " +
                   std::to_string(max_cells)));
    } else {
      l.max_session_tokens = static_cast<int32_t>(std::min<int64_t>(per_session, max_cells - 1));
    }
    l.max_cells = static_cast<int32_t>(max_cells);
  }
  if (o.max_decode_batch < 0) {
    return InvalidArgument(prefixed("max_decode_batch must be >= 0"));
  }
  return l;
}

Status size_pool_by_memory(const ModelWeights& w, const ExecutorLimits& given, ExecutorLimits& l,
                           ForwardDims& dims, const CudaExecutorOptions& o, size_t free_bytes) {
  const ForwardEngine::DeviceBytes fixed = ForwardEngine::device_bytes(w, dims, o.precision);
  const size_t other = fixed.weights + fixed.buffers + fixed.table;
  const double f = l.kv_memory_fraction;
  const std::string what = "kv_memory_fraction " + number(f) + " of " + mib(free_bytes) +
                           " free (weights " + mib(fixed.weights) + ", buffers " +
                           mib(fixed.buffers) + ", cell table " + mib(fixed.table) + ")";
  const size_t avail = free_bytes > other ? free_bytes - other : 0;
  const double share = f * static_cast<double>(avail);
  const double room = static_cast<double>(avail) - static_cast<double>(kMinHeadroomBytes);
  const double kv_bytes = std::max(0.0, std::min(share, room));
  const int64_t cap = std::min<int64_t>(int64_t{std::numeric_limits<int32_t>::max()} - 1,
                                        16 * int64_t{l.max_sessions} * dims.max_session_tokens);
  const auto cells = std::min<int64_t>(
      static_cast<int64_t>(kv_bytes / static_cast<double>(fixed.kv_per_cell)), cap);
  const std::string pool = std::to_string(cells) + " cells of " +
                           std::to_string(fixed.kv_per_cell) + " bytes from " + what;
  if (cells < 2 || cells < l.step_width) {
    return OutOfResources(
        prefixed(pool + ": fewer than step_width " + std::to_string(l.step_width) + " and 2"));
  }
  if (l.capacity_rule) {
    CELLM_RETURN_IF_ERROR(
        validate_capacity("CudaExecutor", l.max_sessions, l.max_session_tokens, cells));
  } else if (given.max_session_tokens != 0 && l.max_session_tokens >= cells) {
    return OutOfResources(prefixed("max_session_tokens " + std::to_string(l.max_session_tokens) +
                                   " needs " + std::to_string(l.max_session_tokens + 1) +
                                   " cells (one is the scratch row) but the pool holds " + pool));
  } else {
    l.max_session_tokens = static_cast<int32_t>(std::min<int64_t>(l.max_session_tokens, cells - 1));
  }
  l.max_cells = static_cast<int32_t>(cells);
  dims.max_cells = l.max_cells;
  dims.max_session_tokens = l.max_session_tokens;
  return Status::Ok();
}

}  // namespace cellm::cuda
