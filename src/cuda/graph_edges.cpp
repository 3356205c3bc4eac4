#include "cuda/graph_edges.h"

#include <cstddef>
#include <unordered_map>
#include <vector>

#include "cuda/cuda_check.h"

namespace cellm::cuda {
namespace {

// What a captured graph's edges say about a node: a node launched with programmatic
// launch enters the graph behind programmatic edges; one launched without it, behind
// ordinary ones. (A kernel node does not keep the launch attribute itself.)
struct Incoming {
  int edges = 0;
  int programmatic = 0;
};

Result<bool> is_kernel(cudaGraphNode_t node) {
  cudaGraphNodeType type{};
  CELLM_CUDA_RETURN_IF_ERROR(cudaGraphNodeGetType(node, &type), "reading a graph node's type");
  return type == cudaGraphNodeTypeKernel;
}

}  // namespace

Result<int> launch_after_foreign_start(cudaGraph_t graph) {
  size_t n = 0;
  CELLM_CUDA_RETURN_IF_ERROR(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n),
                             "counting a graph's edges");
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  if (n > 0) {
    CELLM_CUDA_RETURN_IF_ERROR(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n),
                               "reading a graph's edges");
  }
  std::unordered_map<cudaGraphNode_t, Incoming> incoming;
  for (size_t i = 0; i < n; ++i) {
    Incoming& in = incoming[to[i]];
    ++in.edges;
    if (data[i].type == cudaGraphDependencyTypeProgrammatic) ++in.programmatic;
  }
  int rewritten = 0;
  for (size_t i = 0; i < n; ++i) {
    // The downstream kernel was launched programmatically, so it waits for its
    // predecessors' results (griddepcontrol.wait) whenever it starts.
    if (data[i].type != cudaGraphDependencyTypeProgrammatic) continue;
    if (data[i].from_port == cudaGraphKernelNodePortLaunchCompletion) continue;
    // The upstream kernel was launched without it, behind some other node: a foreign
    // kernel that never triggers. (A root is left alone: nothing tells whose it is.)
    const Incoming& up = incoming[from[i]];
    if (up.edges == 0 || up.programmatic != 0) continue;
    CELLM_ASSIGN_OR_RETURN(const bool from_kernel, is_kernel(from[i]));
    CELLM_ASSIGN_OR_RETURN(const bool to_kernel, is_kernel(to[i]));
    if (!from_kernel || !to_kernel) continue;
    cudaGraphEdgeData early{};
    early.from_port = cudaGraphKernelNodePortLaunchCompletion;
    early.type = cudaGraphDependencyTypeProgrammatic;
    CELLM_CUDA_RETURN_IF_ERROR(cudaGraphRemoveDependencies(graph, &from[i], &to[i], &data[i], 1),
                               "removing a graph edge");
    CELLM_CUDA_RETURN_IF_ERROR(cudaGraphAddDependencies(graph, &from[i], &to[i], &early, 1),
                               "adding a launch-completion edge");
    ++rewritten;
  }
  return rewritten;
}

}  // namespace cellm::cuda
