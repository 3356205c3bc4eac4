// StepAheadPolicy (host-only: runs without a GPU): when the CUDA executor queues a
// decode step ahead, and how dropped and used steps move the threshold.
#include "cuda/step_ahead_policy.h"

#include <gtest/gtest.h>

namespace cellm::cuda {
namespace {

TEST(StepAheadPolicyTest, QueuesFromTheSecondBatchOfARunAtFirst) {
  const StepAheadPolicy p(true);
  EXPECT_FALSE(p.should_queue(1));
  EXPECT_TRUE(p.should_queue(2));
  EXPECT_TRUE(p.should_queue(100));
}

TEST(StepAheadPolicyTest, EachDroppedStepDoublesTheThresholdUpToItsCap) {
  StepAheadPolicy p(true);
  int32_t want = StepAheadPolicy::kMinThreshold;
  for (int i = 0; i < 10; ++i) {
    p.dropped();
    want = std::min(StepAheadPolicy::kMaxThreshold, want * 2);
    EXPECT_EQ(p.threshold(), want) << "after " << i + 1 << " drops";
    EXPECT_FALSE(p.should_queue(want - 1));
    EXPECT_TRUE(p.should_queue(want));
  }
  EXPECT_EQ(p.threshold(), StepAheadPolicy::kMaxThreshold);
}

TEST(StepAheadPolicyTest, UsedStepsInARowHalveItDownToTheFloor) {
  StepAheadPolicy p(true);
  p.dropped();
  p.dropped();
  p.dropped();
  ASSERT_EQ(p.threshold(), 16);
  for (int i = 0; i < StepAheadPolicy::kUsedToRelax - 1; ++i) p.used();
  EXPECT_EQ(p.threshold(), 16);
  p.used();
  EXPECT_EQ(p.threshold(), 8);
  // A drop in between restarts the count.
  for (int i = 0; i < StepAheadPolicy::kUsedToRelax - 1; ++i) p.used();
  p.dropped();
  EXPECT_EQ(p.threshold(), 16);
  for (int i = 0; i < StepAheadPolicy::kUsedToRelax - 1; ++i) p.used();
  EXPECT_EQ(p.threshold(), 16);
  for (int i = 0; i < 10 * StepAheadPolicy::kUsedToRelax; ++i) p.used();
  EXPECT_EQ(p.threshold(), StepAheadPolicy::kMinThreshold);
}

TEST(StepAheadPolicyTest, WithoutAdaptationTheThresholdStays) {
  StepAheadPolicy p(false);
  for (int i = 0; i < 5; ++i) p.dropped();
  EXPECT_EQ(p.threshold(), StepAheadPolicy::kMinThreshold);
  for (int i = 0; i < 20; ++i) p.used();
  EXPECT_EQ(p.threshold(), StepAheadPolicy::kMinThreshold);
  EXPECT_TRUE(p.should_queue(2));
}

}  // namespace
}  // namespace cellm::cuda
