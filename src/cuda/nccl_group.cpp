#include "cuda/nccl_group.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_check.h"

namespace cellm::cuda {

// The NCCL entry points the group calls, declared here (the library is loaded at run
// time; its header is not needed). Signatures and values as NCCL documents them:
// every call returns an ncclResult_t, 0 = ncclSuccess; a communicator is an opaque
// handle; ncclSum = 0; ncclFloat16 = 6, ncclFloat32 = 7, ncclBfloat16 = 9.
using NcclResult = int;
using NcclComm = void*;
constexpr NcclResult kNcclSuccess = 0;
constexpr int kNcclSum = 0;

struct NcclApi {
  void* library = nullptr;
  NcclResult (*get_version)(int*) = nullptr;
  const char* (*error_string)(NcclResult) = nullptr;
  NcclResult (*comm_init_all)(NcclComm*, int, const int*) = nullptr;
  NcclResult (*comm_destroy)(NcclComm) = nullptr;
  NcclResult (*all_reduce)(const void*, void*, size_t, int, int, NcclComm, cudaStream_t) = nullptr;
  NcclResult (*all_gather)(const void*, void*, size_t, int, NcclComm, cudaStream_t) = nullptr;
  NcclResult (*group_start)() = nullptr;
  NcclResult (*group_end)() = nullptr;

  Status check(NcclResult r, const std::string& what) const {
    if (r == kNcclSuccess) return Status::Ok();
    return Internal(what + ": NCCL error " + std::to_string(r) + ": " +
                    (error_string != nullptr ? error_string(r) : "unknown"));
  }
};

namespace {

template <typename F>
bool bind(void* library, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(library, name));
  return f != nullptr;
}

// NCCL's type id of `dtype`, or -1 for one the collectives do not take.
int nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return 6;
    case DType::kF32:
      return 7;
    case DType::kBF16:
      return 9;
    case DType::kF8E4M3:
      return -1;
  }
  return -1;
}

// The library, loaded once for the process (NCCL keeps process-wide state).
Result<std::shared_ptr<const NcclApi>> load_nccl() {
  static std::mutex mutex;
  static std::shared_ptr<const NcclApi> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  if (loaded) return loaded;
  const char* named = std::getenv("CELLM_NCCL_LIBRARY");
  const std::string file = named != nullptr && *named != '\0' ? named : "libnccl.so.2";
  auto api = std::make_shared<NcclApi>();
  api->library = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (api->library == nullptr) {
    const char* why = dlerror();
    return NotSupported("tensor parallel needs NCCL: cannot load " + file + " (" +
                        (why != nullptr ? why : "unknown error") +
                        "); put libnccl.so.2 on the library path or name it in "
                        "CELLM_NCCL_LIBRARY");
  }
  const bool bound = bind(api->library, "ncclGetVersion", api->get_version) &&
                     bind(api->library, "ncclGetErrorString", api->error_string) &&
                     bind(api->library, "ncclCommInitAll", api->comm_init_all) &&
                     bind(api->library, "ncclCommDestroy", api->comm_destroy) &&
                     bind(api->library, "ncclAllReduce", api->all_reduce) &&
                     bind(api->library, "ncclAllGather", api->all_gather) &&
                     bind(api->library, "ncclGroupStart", api->group_start) &&
                     bind(api->library, "ncclGroupEnd", api->group_end);
  if (!bound) {
    dlclose(api->library);
    return NotSupported(file + " lacks an NCCL function tensor parallel calls");
  }
  loaded = std::move(api);
  return loaded;
}

}  // namespace

Result<std::unique_ptr<NcclGroup>> NcclGroup::create(const std::vector<int>& devices) {
  if (devices.empty()) return InvalidArgument("NcclGroup: no devices");
  std::vector<int> sorted = devices;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return InvalidArgument("NcclGroup: a device appears twice in the group");
  }
  CELLM_ASSIGN_OR_RETURN(std::shared_ptr<const NcclApi> api, load_nccl());
  int count = 0;
  CELLM_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count), "NcclGroup: cudaGetDeviceCount");
  for (int d : devices) {
    if (d < 0 || d >= count) {
      return InvalidArgument("NcclGroup: no CUDA device " + std::to_string(d) + " (this host has " +
                             std::to_string(count) + ")");
    }
  }
  int v = 0;
  CELLM_RETURN_IF_ERROR(api->check(api->get_version(&v), "ncclGetVersion"));
  // NCCL_VERSION(X, Y, Z) is X * 10000 + Y * 100 + Z from 2.9 on.
  const std::string version = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) +
                              "." + std::to_string(v % 100);
  std::vector<void*> comms(devices.size(), nullptr);
  CELLM_RETURN_IF_ERROR(
      api->check(api->comm_init_all(comms.data(), static_cast<int>(devices.size()), devices.data()),
                 "ncclCommInitAll over " + std::to_string(devices.size()) + " GPUs"));
  return std::unique_ptr<NcclGroup>(
      new NcclGroup(std::move(api), devices, std::move(comms), version));
}

NcclGroup::NcclGroup(std::shared_ptr<const NcclApi> api, std::vector<int> devices,
                     std::vector<void*> comms, std::string version)
    : api_(std::move(api)),
      devices_(std::move(devices)),
      comms_(std::move(comms)),
      version_(std::move(version)) {}

NcclGroup::~NcclGroup() {
  for (void* c : comms_) {
    if (c != nullptr) (void)api_->comm_destroy(c);  // nothing to do about a failure here
  }
}

Status NcclGroup::check_rank(int rank, DType dtype, const char* what) const {
  if (rank < 0 || rank >= world()) {
    return InvalidArgument(std::string(what) + ": rank " + std::to_string(rank) +
                           " is not in a group of " + std::to_string(world()));
  }
  if (nccl_type(dtype) < 0) {
    return InvalidArgument(std::string(what) + ": " + to_string(dtype) +
                           " values are not summed or gathered");
  }
  return Status::Ok();
}

Status NcclGroup::all_reduce_sum(int rank, void* data, size_t count, DType dtype,
                                 cudaStream_t stream) {
  CELLM_RETURN_IF_ERROR(check_rank(rank, dtype, "all_reduce_sum"));
  return api_->check(api_->all_reduce(data, data, count, nccl_type(dtype), kNcclSum,
                                      comms_[static_cast<size_t>(rank)], stream),
                     "ncclAllReduce");
}

Status NcclGroup::all_gather(int rank, const void* send, void* recv, size_t count, DType dtype,
                             cudaStream_t stream) {
  CELLM_RETURN_IF_ERROR(check_rank(rank, dtype, "all_gather"));
  return api_->check(api_->all_gather(send, recv, count, nccl_type(dtype),
                                      comms_[static_cast<size_t>(rank)], stream),
                     "ncclAllGather");
}

Status NcclGroup::group_start() {
  return api_->check(api_->group_start(), "ncclGroupStart");
}
Status NcclGroup::group_end() {
  return api_->check(api_->group_end(), "ncclGroupEnd");
}

}  // namespace cellm::cuda
