#include "cuda/graph_edges.h"

#include <cstddef>
#include <vector>

#include "cuda/cuda_check.h"

namespace cellm::cuda {
namespace {

// Whether `node` is a kernel node, and whether it was launched with programmatic launch.
Status kernel_kind(cudaGraphNode_t node, bool* is_kernel, bool* programmatic) {
  cudaGraphNodeType type{};
  CELLM_CUDA_RETURN_IF_ERROR(cudaGraphNodeGetType(node, &type), "reading a graph node's type");
  *is_kernel = type == cudaGraphNodeTypeKernel;
  *programmatic = false;
  if (!*is_kernel) return Status::Ok();
  cudaLaunchAttributeValue value{};
  CELLM_CUDA_RETURN_IF_ERROR(cudaGraphKernelNodeGetAttribute(
                                 node, cudaLaunchAttributeProgrammaticStreamSerialization, &value),
                             "reading a kernel node's launch attributes");
  *programmatic = value.programmaticStreamSerializationAllowed != 0;
  return Status::Ok();
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
  int rewritten = 0;
  for (size_t i = 0; i < n; ++i) {
    bool from_kernel = false, from_programmatic = false, to_kernel = false, to_programmatic = false;
    CELLM_RETURN_IF_ERROR(kernel_kind(from[i], &from_kernel, &from_programmatic));
    CELLM_RETURN_IF_ERROR(kernel_kind(to[i], &to_kernel, &to_programmatic));
    if (!from_kernel || from_programmatic || !to_kernel || !to_programmatic) continue;
    cudaGraphEdgeData early{};
    early.from_port = cudaGraphKernelNodePortLaunchCompletion;
    early.type = cudaGraphDependencyTypeProgrammatic;
    if (data[i].from_port == early.from_port && data[i].type == early.type) continue;
    CELLM_CUDA_RETURN_IF_ERROR(cudaGraphRemoveDependencies(graph, &from[i], &to[i], &data[i], 1),
                               "removing a graph edge");
    CELLM_CUDA_RETURN_IF_ERROR(cudaGraphAddDependencies(graph, &from[i], &to[i], &early, 1),
                               "adding a launch-completion edge");
    ++rewritten;
  }
  return rewritten;
}

}  // namespace cellm::cuda
