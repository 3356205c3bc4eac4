#include "cuda/kernels/kv_write.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "device_array.h"
#include "device_test_util.h"
#include "gpu_test.h"

namespace cellm::cuda {
namespace {

using testing::DeviceArray;
using testing::expect_bitwise_equal;
using testing::from_f32;
using testing::random_nonzero;

// A step of n rows over a fused [n, row_stride] buffer: K at k_offset, V at
// v_offset; the rows write distinct scattered cells of a pool of max_cells.
struct Step {
  int64_t n, row_stride, k_offset, v_offset, kv_dim;
  int64_t max_cells = 97;
  int64_t table_rows = 5, table_stride = 61;
};

// Runs one step on the device and checks pools and table against the host
// result: written rows equal their source exactly, everything else keeps its poison.
template <typename T>
void expect_step_writes_exactly(const Step& s, bool with_table, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<T> qkv(static_cast<size_t>(s.n * s.row_stride));
  for (T& x : qkv) x = from_f32<T>(random_nonzero(rng, 0.1f, 4.0f));
  std::vector<int32_t> all_cells(static_cast<size_t>(s.max_cells));
  std::iota(all_cells.begin(), all_cells.end(), 0);
  std::shuffle(all_cells.begin(), all_cells.end(), rng);
  std::vector<int32_t> cells(all_cells.begin(), all_cells.begin() + s.n);
  std::vector<int32_t> row_seq(static_cast<size_t>(s.n)), positions(static_cast<size_t>(s.n));
  for (int64_t r = 0; r < s.n; ++r) {  // distinct (sequence, position) per row
    row_seq[static_cast<size_t>(r)] = static_cast<int32_t>(r % s.table_rows);
    positions[static_cast<size_t>(r)] = static_cast<int32_t>(r / s.table_rows * 3 + r % 2);
  }
  // Poison: pools hold distinct values no row writes, the table holds -7.
  std::vector<T> k_pool(static_cast<size_t>(s.max_cells * s.kv_dim));
  std::vector<T> v_pool(k_pool.size());
  for (size_t i = 0; i < k_pool.size(); ++i) {
    k_pool[i] = from_f32<T>(1000.0f + static_cast<float>(i % 512));
    v_pool[i] = from_f32<T>(-1000.0f - static_cast<float>(i % 512));
  }
  std::vector<int32_t> table(static_cast<size_t>(s.table_rows * s.table_stride), -7);

  DeviceArray<T> d_qkv(qkv), d_k(k_pool), d_v(v_pool);
  DeviceArray<int32_t> d_cells(cells), d_seq(row_seq), d_pos(positions), d_table(table);
  CELLM_ASSERT_CUDA(launch_kv_write<T>(d_qkv.get(), s.n, s.row_stride, s.k_offset, s.v_offset,
                                       s.kv_dim, d_cells.get(), d_seq.get(), d_pos.get(), d_k.get(),
                                       d_v.get(), with_table ? d_table.get() : nullptr,
                                       s.table_stride, nullptr));
  CELLM_ASSERT_CUDA(cudaDeviceSynchronize());

  for (int64_t r = 0; r < s.n; ++r) {
    const int64_t cell = cells[static_cast<size_t>(r)];
    for (int64_t i = 0; i < s.kv_dim; ++i) {
      k_pool[static_cast<size_t>(cell * s.kv_dim + i)] =
          qkv[static_cast<size_t>(r * s.row_stride + s.k_offset + i)];
      v_pool[static_cast<size_t>(cell * s.kv_dim + i)] =
          qkv[static_cast<size_t>(r * s.row_stride + s.v_offset + i)];
    }
    if (with_table) {
      table[static_cast<size_t>(row_seq[static_cast<size_t>(r)] * s.table_stride +
                                positions[static_cast<size_t>(r)])] = static_cast<int32_t>(cell);
    }
  }
  expect_bitwise_equal(d_k.download(), k_pool, "k_pool");
  expect_bitwise_equal(d_v.download(), v_pool, "v_pool");
  EXPECT_EQ(d_table.download(), table);
}

template <typename T>
class KvWriteTest : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, __nv_bfloat16>;
TYPED_TEST_SUITE(KvWriteTest, ElementTypes);

TYPED_TEST(KvWriteTest, WritesEveryRowIntoItsCellAndTheTableAndNothingElse) {
  CELLM_SKIP_WITHOUT_GPU();
  uint32_t seed = 1;
  for (const int64_t n : {1, 37}) {
    // 16-byte path: kv_dim 2 x 64, aligned offsets (Q first, then K, then V).
    const Step aligned{n, 128 + 2 * 128 + 8, 128, 256, 128};
    // Scalar path: kv_dim 3 x 5 and odd offsets.
    const Step odd{n, 7 + 2 * 15 + 3, 7, 7 + 15, 15};
    for (const Step& s : {aligned, odd}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " kv_dim=" + std::to_string(s.kv_dim));
      expect_step_writes_exactly<TypeParam>(s, /*with_table=*/true, seed++);
    }
  }
}

TYPED_TEST(KvWriteTest, LeavesTheTableAloneWhenGivenNone) {
  CELLM_SKIP_WITHOUT_GPU();
  expect_step_writes_exactly<TypeParam>(Step{37, 128 + 2 * 128, 128, 256, 128}, false, 7);
}

TYPED_TEST(KvWriteTest, AnEmptyStepSucceedsAndAMalformedOneIsRefused) {
  CELLM_SKIP_WITHOUT_GPU();
  TypeParam* none = nullptr;
  EXPECT_EQ(launch_kv_write<TypeParam>(none, 0, 32, 0, 16, 16, nullptr, nullptr, nullptr, none,
                                       none, nullptr, 0, nullptr),
            cudaSuccess);
  // V's columns run past the row.
  EXPECT_EQ(launch_kv_write<TypeParam>(none, 1, 32, 0, 24, 16, nullptr, nullptr, nullptr, none,
                                       none, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace cellm::cuda
