// NcclGroup: the collectives of a tensor-parallel group whose GPUs all belong to this
// process: one NCCL communicator per GPU, made together (ncclCommInitAll). NCCL is
// loaded at run time (libnccl.so.2 from the library path, or the file the environment
// variable CELLM_NCCL_LIBRARY names), so building cellm and running it on one GPU need
// no NCCL; creating a group without it is NotSupported naming what was tried.
//
// Every rank takes part in each collective, in the same order, on its own stream:
// from its own thread (each GPU's worker), or all ranks from one thread between
// group_start() and group_end(). The calls are stream-ordered and can be captured
// into a CUDA graph (a decode step's graph per GPU holds its all-reduces).
//
// Thread-safety: the ranks' calls may come from different threads at once; a
// group must outlive the work queued through it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "cellm/dtype.h"
#include "cellm/status.h"

namespace cellm::cuda {

struct NcclApi;  // the entry points loaded from the library

class NcclGroup {
 public:
  // A group over `devices` (CUDA device ordinals, one per rank, in rank order, no
  // repeats). InvalidArgument for an empty or repeating list or a device that does
  // not exist; NotSupported when NCCL cannot be loaded; Internal for NCCL's errors.
  static Result<std::unique_ptr<NcclGroup>> create(const std::vector<int>& devices);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int world() const { return static_cast<int>(devices_.size()); }
  const std::vector<int>& devices() const { return devices_; }
  // NCCL's version, "2.28.3".
  const std::string& version() const { return version_; }

  // Rank `rank`'s part of a sum over the ranks, in place: `count` values of `dtype`
  // (F32, F16 or BF16) at `data` on the rank's GPU become the sum of every rank's.
  Status all_reduce_sum(int rank, void* data, size_t count, DType dtype, cudaStream_t stream);
  // Rank `rank`'s part of a gather: every rank's `count` values at `send` land at
  // recv[r * count, (r + 1) * count) for rank r, on every rank. `recv` holds
  // world() * count values and does not overlap `send` except as NCCL allows (send
  // at recv + rank * count).
  Status all_gather(int rank, const void* send, void* recv, size_t count, DType dtype,
                    cudaStream_t stream);

  // Brackets the calls of several ranks made from one thread.
  Status group_start();
  Status group_end();

 private:
  NcclGroup(std::shared_ptr<const NcclApi> api, std::vector<int> devices, std::vector<void*> comms,
            std::string version);
  Status check_rank(int rank, DType dtype, const char* what) const;

  std::shared_ptr<const NcclApi> api_;
  std::vector<int> devices_;
  std::vector<void*> comms_;  // ncclComm_t per rank
  std::string version_;
};

}  // namespace cellm::cuda
