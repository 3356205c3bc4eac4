// The fused rope + K/V write (src/cuda/kernels/rope_kv_write.h) against its
// definition: launch_rope then launch_kv_write on a copy of the same inputs. qkv,
// both pools and the table must end bit for bit the same, every element of every
// buffer (pool rows and table entries no row writes keep their poison on both
// sides). Shapes cover every pack width of both types (16-byte, 8-byte and single
// elements: head_dim 64/128, 40 and 36/38, odd row strides, a misaligned base),
// GQA and equal head counts, rows 1, 7 and 300, positions up to 100000 (precise
// cosf/sinf's slow path), with and without the table.
#include "cuda/kernels/rope_kv_write.h"
#include "model/rope.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cpu/kernels/rope.h"
#include "cuda/device_memory.h"
#include "cuda/kernels/kv_write.h"
#include "cuda/kernels/rope.h"
#include "device_test_util.h"
#include "gpu_test.h"

namespace cellm::cuda {
namespace {

using testing::DeviceArray;
using testing::expect_bitwise_equal;
using testing::from_f32;
using testing::random_nonzero;

constexpr int64_t kTableRows = 5;
constexpr int64_t kTableStride = 100003;  // > every position

// One layer's step: n_rows rows of [q heads | k heads | v heads | pad] each.
struct Shape {
  int64_t head_dim = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t n_rows = 0;
  int64_t pad = 0;    // columns after v in each row: an odd pad defeats every pack
  int64_t shift = 0;  // elements the qkv base sits past an aligned allocation

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t row_stride() const { return q_dim() + 2 * kv_dim() + pad; }
  int64_t max_cells() const { return n_rows + 37; }
  std::string name() const {
    return "head_dim " + std::to_string(head_dim) + ", heads " + std::to_string(n_heads) + "/" +
           std::to_string(n_kv_heads) + ", rows " + std::to_string(n_rows) + ", pad " +
           std::to_string(pad) + ", shift " + std::to_string(shift);
  }
};

// The inputs of one step, on the host.
template <typename T>
struct StepInputs {
  std::vector<T> qkv;  // shift + n_rows * row_stride
  std::vector<int32_t> positions, cells, row_seq;
  std::vector<float> inv_freq;
  std::vector<T> k_pool, v_pool;  // poison: values no row writes
  std::vector<int32_t> table;     // poison: -7
};

template <typename T>
StepInputs<T> make_inputs(const Shape& s, bool llama3, uint32_t seed) {
  std::mt19937 rng(seed);
  StepInputs<T> in;
  in.qkv.resize(static_cast<size_t>(s.shift + s.n_rows * s.row_stride()));
  for (T& x : in.qkv) x = from_f32<T>(random_nonzero(rng, 0.1f, 4.0f));
  // Distinct positions, large ones (100000 - 313 r) and 0 on the last of several rows.
  for (int64_t r = 0; r < s.n_rows; ++r) {
    in.positions.push_back(static_cast<int32_t>(100000 - 313 * r));
    in.row_seq.push_back(static_cast<int32_t>(r % kTableRows));
  }
  if (s.n_rows > 1) in.positions.back() = 0;
  std::vector<int32_t> all_cells(static_cast<size_t>(s.max_cells()));
  std::iota(all_cells.begin(), all_cells.end(), 0);
  std::shuffle(all_cells.begin(), all_cells.end(), rng);
  in.cells.assign(all_cells.begin(), all_cells.begin() + s.n_rows);
  in.inv_freq = llama3 ? rope_inv_freq(500000.0, s.head_dim,
                                       RopeScaling{.type = RopeScalingType::kLlama3, .factor = 8.0})
                       : rope_inv_freq(10000.0, s.head_dim);
  in.k_pool.resize(static_cast<size_t>(s.max_cells() * s.kv_dim()));
  in.v_pool.resize(in.k_pool.size());
  for (size_t i = 0; i < in.k_pool.size(); ++i) {
    in.k_pool[i] = from_f32<T>(1000.0f + static_cast<float>(i % 512));
    in.v_pool[i] = from_f32<T>(-1000.0f - static_cast<float>(i % 512));
  }
  in.table.assign(static_cast<size_t>(kTableRows * kTableStride), -7);
  return in;
}

// One side's device buffers, filled from the same inputs.
template <typename T>
struct DeviceStep {
  DeviceArray<T> qkv, k_pool, v_pool;
  DeviceArray<int32_t> positions, cells, row_seq, table;
  DeviceArray<float> inv_freq;

  explicit DeviceStep(const StepInputs<T>& in)
      : qkv(in.qkv),
        k_pool(in.k_pool),
        v_pool(in.v_pool),
        positions(in.positions),
        cells(in.cells),
        row_seq(in.row_seq),
        table(in.table),
        inv_freq(in.inv_freq) {}

  RopeKvWriteParams<T> params(const Shape& s, bool with_table) const {
    RopeKvWriteParams<T> p;
    p.qkv = qkv.get() + s.shift;
    p.n_rows = s.n_rows;
    p.row_stride = s.row_stride();
    p.q_offset = 0;
    p.n_heads = s.n_heads;
    p.k_offset = s.q_dim();
    p.v_offset = s.q_dim() + s.kv_dim();
    p.n_kv_heads = s.n_kv_heads;
    p.head_dim = s.head_dim;
    p.positions = positions.get();
    p.inv_freq = inv_freq.get();
    p.cells = cells.get();
    p.k_pool = k_pool.get();
    p.v_pool = v_pool.get();
    p.table = with_table ? table.get() : nullptr;
    p.table_stride = kTableStride;
    p.row_seq = row_seq.get();
    return p;
  }

  // launch_rope then launch_kv_write: the definition of the fused launch.
  cudaError_t run_unfused(const Shape& s, bool with_table) const {
    const RopeKvWriteParams<T> p = params(s, with_table);
    const cudaError_t err =
        launch_rope<T>(p.qkv, p.n_rows, p.row_stride, p.q_offset, p.n_heads, p.k_offset,
                       p.n_kv_heads, p.head_dim, p.positions, p.inv_freq, nullptr);
    if (err != cudaSuccess) return err;
    return launch_kv_write<T>(p.qkv, p.n_rows, p.row_stride, p.k_offset, p.v_offset, s.kv_dim(),
                              p.cells, p.row_seq, p.positions, p.k_pool, p.v_pool, p.table,
                              p.table_stride, nullptr);
  }
};

template <typename T>
void expect_same_buffers(const DeviceStep<T>& fused, const DeviceStep<T>& unfused,
                         const std::string& what) {
  expect_bitwise_equal(fused.qkv.download(), unfused.qkv.download(), what + ": qkv");
  expect_bitwise_equal(fused.k_pool.download(), unfused.k_pool.download(), what + ": k_pool");
  expect_bitwise_equal(fused.v_pool.download(), unfused.v_pool.download(), what + ": v_pool");
  EXPECT_EQ(fused.table.download(), unfused.table.download()) << what << ": table";
}

// Runs the fused and the unfused launches on copies of one step's inputs and
// compares every buffer; also checks that the step did rotate and write (so the
// comparison is not of two no-ops).
template <typename T>
void expect_fused_equals_unfused(const Shape& s, bool with_table, bool llama3, uint32_t seed) {
  const std::string what =
      s.name() + (with_table ? ", table" : ", no table") + (llama3 ? ", llama3" : "");
  const StepInputs<T> in = make_inputs<T>(s, llama3, seed);
  DeviceStep<T> fused(in);
  DeviceStep<T> unfused(in);
  CELLM_ASSERT_CUDA(unfused.run_unfused(s, with_table));
  CELLM_ASSERT_CUDA(launch_rope_kv_write<T>(fused.params(s, with_table), nullptr));
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  expect_same_buffers(fused, unfused, what);

  const std::vector<T> rotated = unfused.qkv.download();
  EXPECT_NE(std::memcmp(rotated.data(), in.qkv.data(), rotated.size() * sizeof(T)), 0) << what;
  const std::vector<T> k_pool = unfused.k_pool.download();
  EXPECT_NE(std::memcmp(k_pool.data(), in.k_pool.data(), k_pool.size() * sizeof(T)), 0) << what;
}

template <typename T>
class RopeKvWriteTest : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, __nv_bfloat16>;
TYPED_TEST_SUITE(RopeKvWriteTest, ElementTypes, testing::TypeNames);

TYPED_TEST(RopeKvWriteTest, EqualsRopeThenKvWriteBitForBitOnEveryShape) {
  CELLM_SKIP_WITHOUT_GPU();
  // {head_dim, n_heads, n_kv_heads}: Llama 3 8B and 1B, equal heads, Qwen's 14/2,
  // a 40-wide head (8-byte bf16 packs), 36 and 38 (2-element f32 packs / none),
  // the widest head and the narrowest.
  const int64_t heads[][3] = {{128, 32, 8}, {64, 32, 8}, {128, 4, 4}, {64, 14, 2}, {40, 14, 2},
                              {36, 4, 2},   {38, 2, 1},  {256, 4, 2}, {2, 3, 1}};
  uint32_t seed = 1;
  for (const auto& h : heads) {
    for (const int64_t n_rows : {1, 7, 300}) {
      const Shape s{h[0], h[1], h[2], n_rows};
      for (const bool with_table : {true, false}) {
        expect_fused_equals_unfused<TypeParam>(s, with_table, seed % 2 == 0, seed);
        ++seed;
      }
    }
  }
}

TYPED_TEST(RopeKvWriteTest, EqualsRopeThenKvWriteWhenPacksDoNotFit) {
  CELLM_SKIP_WITHOUT_GPU();
  // Row strides and bases that allow only narrower packs, or none.
  uint32_t seed = 100;
  for (const int64_t n_rows : {1, 7, 300}) {
    for (const Shape& s : {Shape{128, 32, 8, n_rows, 1, 0}, Shape{128, 4, 4, n_rows, 2, 0},
                           Shape{64, 14, 2, n_rows, 0, 1}, Shape{64, 14, 2, n_rows, 4, 2},
                           Shape{40, 14, 2, n_rows, 0, 3}}) {
      expect_fused_equals_unfused<TypeParam>(s, n_rows != 7, true, seed++);
    }
  }
}

TYPED_TEST(RopeKvWriteTest, AGraphReplayWritesWhatTheUnfusedLaunchesWrite) {
  CELLM_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const Shape s{128, 32, 8, 7};
  const StepInputs<T> in = make_inputs<T>(s, true, 77);
  DeviceStep<T> fused(in);
  DeviceStep<T> unfused(in);
  CELLM_ASSERT_CUDA(unfused.run_unfused(s, true));
  Stream stream = Stream::create().value();
  cudaGraph_t graph = nullptr;
  CELLM_ASSERT_CUDA(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
  CELLM_ASSERT_CUDA(launch_rope_kv_write<T>(fused.params(s, true), stream.get()));
  CELLM_ASSERT_CUDA(cudaStreamEndCapture(stream.get(), &graph));
  cudaGraphExec_t exec_handle = nullptr;
  CELLM_ASSERT_CUDA(cudaGraphInstantiate(&exec_handle, graph, 0));
  GraphExec exec(exec_handle);
  CELLM_ASSERT_CUDA(cudaGraphDestroy(graph));
  CELLM_ASSERT_CUDA(cudaGraphLaunch(exec.get(), stream.get()));  // capture ran nothing
  CELLM_ASSERT_CUDA(cudaStreamSynchronize(stream.get()));
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());
  expect_same_buffers(fused, unfused, "graph replay");
}

TEST(RopeKvWriteLaunchTest, AnEmptyStepSucceedsAndMalformedCallsAreRefused) {
  CELLM_SKIP_WITHOUT_GPU();
  using B = __nv_bfloat16;
  const Shape s{64, 4, 2, 3};
  const StepInputs<B> in = make_inputs<B>(s, false, 5);
  const DeviceStep<B> step(in);
  const RopeKvWriteParams<B> good = step.params(s, true);
  const auto launch = [](const RopeKvWriteParams<B>& p) {
    return launch_rope_kv_write<B>(p, nullptr);
  };

  RopeKvWriteParams<B> empty = good;  // no rows: nothing is read, pointers may be null
  empty.n_rows = 0;
  empty.qkv = empty.k_pool = empty.v_pool = nullptr;
  empty.positions = empty.cells = empty.row_seq = nullptr;
  empty.inv_freq = nullptr;
  empty.table = nullptr;
  EXPECT_EQ(launch(empty), cudaSuccess);

  std::vector<std::pair<std::string, RopeKvWriteParams<B>>> bad;
  const auto with = [&](const std::string& what, auto change) {
    RopeKvWriteParams<B> p = good;
    change(p);
    bad.emplace_back(what, p);
  };
  with("negative rows", [](auto& p) { p.n_rows = -1; });
  with("no kv heads", [](auto& p) { p.n_kv_heads = 0; });
  with("negative q heads", [](auto& p) { p.n_heads = -1; });
  with("head_dim 0", [](auto& p) { p.head_dim = 0; });
  with("odd head_dim", [](auto& p) { p.head_dim = 63; });
  with("head_dim past 256", [](auto& p) { p.head_dim = 258; });
  with("negative offset", [](auto& p) { p.q_offset = -1; });
  with("v past the row", [](auto& p) { p.v_offset = p.row_stride - 64; });
  with("row too short", [](auto& p) { p.row_stride = 7 * 64; });
  with("k overlapping q", [](auto& p) { p.k_offset = 3 * 64; });
  with("v overlapping k", [](auto& p) { p.v_offset = p.k_offset + 64; });
  with("v overlapping q", [](auto& p) { p.v_offset = 0; });
  with("null qkv", [](auto& p) { p.qkv = nullptr; });
  with("null positions", [](auto& p) { p.positions = nullptr; });
  with("null inv_freq", [](auto& p) { p.inv_freq = nullptr; });
  with("null cells", [](auto& p) { p.cells = nullptr; });
  with("null k_pool", [](auto& p) { p.k_pool = nullptr; });
  with("null v_pool", [](auto& p) { p.v_pool = nullptr; });
  with("a table without row_seq", [](auto& p) { p.row_seq = nullptr; });
  with("a table without a stride", [](auto& p) { p.table_stride = 0; });
  for (const auto& [what, p] : bad) EXPECT_EQ(launch(p), cudaErrorInvalidValue) << what;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  // No table: row_seq and table_stride are not read.
  RopeKvWriteParams<B> no_table = good;
  no_table.table = nullptr;
  no_table.row_seq = nullptr;
  no_table.table_stride = 0;
  EXPECT_EQ(launch(no_table), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace cellm::cuda
