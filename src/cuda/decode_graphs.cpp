// The decode graphs of CudaForward<T> (cuda/cuda_forward_impl.h): each bucket's step
// captured once per way of building it (trigger placement, early edges after cuBLASLt
// kernels, the L2 prefetch), the candidates timed by replays and the fastest kept, then
// captured again for the other staging slot.
#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/cuda_forward_impl.h"
#include "cuda/graph_edges.h"
#include "cuda/launch_control.h"

namespace cellm::cuda {

template <typename T>
Status CudaForward<T>::capture(int32_t bucket) {
  // Without programmatic launch the triggers and edges are no-ops: nothing to choose.
  const bool pdl = programmatic_launch_enabled();
  const CudaTuning& t = tuning();
  std::vector<bool> placements = {t.early_triggers == TimedChoice::kOn};
  if (pdl && t.early_triggers == TimedChoice::kTimed) placements = {false, true};
  std::vector<bool> edge_choices = {pdl && t.early_after_cublas == TimedChoice::kOn};
  if (pdl && t.early_after_cublas == TimedChoice::kTimed) edge_choices = {false, true};
  std::vector<GraphExec> graphs;
  std::vector<std::pair<bool, bool>> ways;  // (early triggers, early edges) of each
  std::vector<std::string> labels;
  int edges = 0;
  // The ways are timed (and the idle launch noted) from the current slot, which holds
  // the step being run: each replay recomputes that step, writing the K/V it writes.
  // A replay from another slot would recompute whatever step that slot last held.
  const int current = slot_;
  for (const bool early : placements) {
    CELLM_ASSIGN_OR_RETURN(cudaGraph_t graph, capture_graph(bucket, early, current, false));
    for (const bool rewrite : edge_choices) {
      Result<GraphExec> exec = instantiate(graph, rewrite);
      if (!exec.ok()) {
        cudaGraphDestroy(graph);
        return exec.status();
      }
      if (rewrite) edges = last_rewritten_edges_;
      graphs.push_back(std::move(*exec));
      ways.emplace_back(early, rewrite);
      labels.push_back(std::string(early ? "early" : "late") + (rewrite ? "+edges" : ""));
    }
    cudaGraphDestroy(graph);
  }
  std::string note = "B=" + std::to_string(bucket) + ": ";
  const std::string edges_note = std::to_string(edges) + " edges early after cuBLASLt";
  size_t kept = 0;
  if (graphs.size() == 1) {
    note += std::string(placements[0] ? "early" : "late") + " triggers";
    if (edge_choices[0]) note += ", " + edges_note;
  } else {
    std::vector<double> ms;
    CELLM_RETURN_IF_ERROR(time_replays(graphs, &ms));
    for (size_t i = 0; i < graphs.size(); ++i) {
      if (ms[i] < ms[kept]) kept = i;
      char time[64];
      std::snprintf(time, sizeof time, "%s%s %.3f ms", i == 0 ? "" : ", ", labels[i].c_str(),
                    ms[i]);
      note += time;
    }
    if (edge_choices.back()) note += "; " + edges_note;
    note += ": kept " + labels[kept];
  }
  // Then the L2 prefetch beside the attention, for the kept way.
  bool prefetch = false;
  if (t.l2_prefetch != TimedChoice::kOff && bucket <= kPrefetchMaxRows) {
    CELLM_ASSIGN_OR_RETURN(cudaGraph_t graph,
                           capture_graph(bucket, ways[kept].first, current, true));
    Result<GraphExec> exec = instantiate(graph, ways[kept].second);
    cudaGraphDestroy(graph);
    CELLM_RETURN_IF_ERROR(exec.status());
    std::vector<GraphExec> pair;
    pair.push_back(std::move(graphs[kept]));
    pair.push_back(std::move(*exec));
    if (t.l2_prefetch == TimedChoice::kOn) {
      prefetch = true;
      note += "; L2 prefetch";
    } else {
      std::vector<double> ms;
      CELLM_RETURN_IF_ERROR(time_replays(pair, &ms));
      prefetch = ms[1] < ms[0];
      char time[96];
      std::snprintf(time, sizeof time, "; L2 prefetch off %.3f ms, on %.3f ms: kept %s", ms[0],
                    ms[1], prefetch ? "on" : "off");
      note += time;
    }
    graphs[kept] = std::move(pair[prefetch ? 1 : 0]);
  }
  CELLM_ASSIGN_OR_RETURN(const std::string idle, idle_launch_note(graphs[kept]));
  note += "; " + idle;
  // The kept way again for each other staging slot (its copies name that slot).
  std::array<GraphExec, kSlots> execs;
  execs[static_cast<size_t>(current)] = std::move(graphs[kept]);
  for (int slot = 0; slot < kSlots; ++slot) {
    if (slot == current) continue;
    CELLM_ASSIGN_OR_RETURN(cudaGraph_t graph,
                           capture_graph(bucket, ways[kept].first, slot, prefetch));
    Result<GraphExec> exec = instantiate(graph, ways[kept].second);
    cudaGraphDestroy(graph);
    CELLM_RETURN_IF_ERROR(exec.status());
    execs[static_cast<size_t>(slot)] = std::move(*exec);
  }
  graphs_.emplace(bucket, std::move(execs));
  ways_[bucket] = GraphWay{ways[kept].first, ways[kept].second, prefetch};
  graph_notes_.push_back(note);
  return Status::Ok();
}

template <typename T>
Result<cudaGraphExec_t> CudaForward<T>::logits_graph(int32_t bucket, int slot) {
  auto it = logits_graphs_.find(bucket);
  if (it != logits_graphs_.end() && it->second[static_cast<size_t>(slot)].get() != nullptr) {
    return it->second[static_cast<size_t>(slot)].get();
  }
  const auto way = ways_.find(bucket);
  if (way == ways_.end()) {
    return InvalidArgument("bucket " + std::to_string(bucket) + " has no captured decode graph");
  }
  const GraphWay& w = way->second;
  CELLM_ASSIGN_OR_RETURN(cudaGraph_t graph,
                         capture_graph(bucket, w.early_triggers, slot, w.prefetch, false));
  Result<GraphExec> exec = instantiate(graph, w.early_edges);
  cudaGraphDestroy(graph);
  CELLM_RETURN_IF_ERROR(exec.status());
  GraphExec& kept = logits_graphs_[bucket][static_cast<size_t>(slot)];
  kept = std::move(*exec);
  ++logits_graph_captures_;
  return kept.get();
}

template <typename T>
Result<cudaGraph_t> CudaForward<T>::capture_graph(int32_t bucket, bool early_triggers, int slot,
                                                  bool prefetch, bool sample) {
  CELLM_CUDA_RETURN_IF_ERROR(
      cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeThreadLocal),
      "beginning a decode graph capture");
  // A decode step holds one row per sequence (padded rows attend position 0 only).
  set_early_triggers(early_triggers);
  prefetching_ = prefetch;
  forked_ = false;
  Status enqueued = enqueue_step(bucket, bucket, 1, slot, {}, sample);
  if (enqueued.ok()) enqueued = join_prefetch();
  prefetching_ = false;
  set_early_triggers(false);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_.get(), &graph);
  if (!enqueued.ok() || ended != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    CELLM_RETURN_IF_ERROR(enqueued);
    CELLM_CUDA_RETURN_IF_ERROR(ended, "ending a decode graph capture");
  }
  return graph;
}

template <typename T>
Result<GraphExec> CudaForward<T>::instantiate(cudaGraph_t graph, bool early_edges) {
  cudaGraph_t copy = nullptr;
  if (early_edges) {
    CELLM_CUDA_RETURN_IF_ERROR(cudaGraphClone(&copy, graph), "copying a decode graph");
    Result<int> rewritten = launch_after_foreign_start(copy);
    if (!rewritten.ok()) {
      cudaGraphDestroy(copy);
      return rewritten.status();
    }
    last_rewritten_edges_ = *rewritten;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, early_edges ? copy : graph, 0);
  if (copy != nullptr) cudaGraphDestroy(copy);
  CELLM_CUDA_RETURN_IF_ERROR(inst, "instantiating a decode graph");
  return GraphExec(exec);
}

template <typename T>
Result<std::string> CudaForward<T>::idle_launch_note(const GraphExec& graph) {
  constexpr int kRounds = 3;
  CELLM_ASSIGN_OR_RETURN(Event start, Event::create());
  CELLM_ASSIGN_OR_RETURN(Event end, Event::create());
  cudaStream_t s = stream_.get();
  std::vector<float> device_ms(kRounds);
  std::vector<double> host_us(kRounds);
  for (int r = 0; r < kRounds; ++r) {
    CELLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s), "idling before a launch");
    CELLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(start.get(), s), "timing an idle launch");
    const auto t0 = std::chrono::steady_clock::now();
    CELLM_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph.get(), s), "replaying a decode graph");
    const auto t1 = std::chrono::steady_clock::now();
    CELLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(end.get(), s), "timing an idle launch");
    CELLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s), "timing an idle launch");
    CELLM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&device_ms[r], start.get(), end.get()),
                               "reading an idle launch's time");
    host_us[r] = std::chrono::duration<double, std::micro>(t1 - t0).count();
  }
  std::sort(device_ms.begin(), device_ms.end());
  std::sort(host_us.begin(), host_us.end());
  char text[96];
  std::snprintf(text, sizeof text, "idle launch %.3f ms (cudaGraphLaunch %.0f us)",
                device_ms[kRounds / 2], host_us[kRounds / 2]);
  return std::string(text);
}

template <typename T>
Status CudaForward<T>::time_replays(const std::vector<GraphExec>& graphs, std::vector<double>* ms) {
  constexpr int kRounds = 7;
  const size_t n = graphs.size();
  std::vector<Event> marks;
  for (size_t i = 0; i < 2 * n * kRounds; ++i) {
    CELLM_ASSIGN_OR_RETURN(Event e, Event::create());
    marks.push_back(std::move(e));
  }
  cudaStream_t s = stream_.get();
  for (const GraphExec& g : graphs) {
    CELLM_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(g.get(), s), "replaying a decode graph");
  }
  for (size_t r = 0; r < kRounds; ++r) {
    for (size_t g = 0; g < n; ++g) {
      const size_t at = 2 * (r * n + g);
      CELLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(marks[at].get(), s), "timing a decode graph");
      CELLM_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graphs[g].get(), s), "replaying a decode graph");
      CELLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(marks[at + 1].get(), s), "timing a decode graph");
    }
  }
  CELLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s), "timing the decode graphs");
  ms->assign(n, 0.0);
  for (size_t g = 0; g < n; ++g) {
    std::vector<float> times(kRounds);
    for (size_t r = 0; r < kRounds; ++r) {
      const size_t at = 2 * (r * n + g);
      CELLM_CUDA_RETURN_IF_ERROR(
          cudaEventElapsedTime(&times[r], marks[at].get(), marks[at + 1].get()),
          "reading a decode graph's time");
    }
    std::nth_element(times.begin(), times.begin() + kRounds / 2, times.end());
    (*ms)[g] = times[kRounds / 2];
  }
  return Status::Ok();
}

// The members defined here, in both element types.
#define CELLM_FORWARD_MEMBERS(T)                                                              \
  template Status CudaForward<T>::capture(int32_t);                                           \
  template Result<cudaGraph_t> CudaForward<T>::capture_graph(int32_t, bool, int, bool, bool); \
  template Result<cudaGraphExec_t> CudaForward<T>::logits_graph(int32_t, int);                \
  template Result<GraphExec> CudaForward<T>::instantiate(cudaGraph_t, bool);                  \
  template Result<std::string> CudaForward<T>::idle_launch_note(const GraphExec&);            \
  template Status CudaForward<T>::time_replays(const std::vector<GraphExec>&, std::vector<double>*);
CELLM_FORWARD_MEMBERS(float)
CELLM_FORWARD_MEMBERS(__nv_bfloat16)
#undef CELLM_FORWARD_MEMBERS

}  // namespace cellm::cuda
