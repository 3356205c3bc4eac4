#include "core/step_plan.h"

#include <gtest/gtest.h>

namespace cellm {
namespace {

constexpr StepMethod D = StepMethod::kDecode;
constexpr StepMethod P = StepMethod::kPrefill;

// Every plan must be in order and cover [0, total) without gaps.
void ExpectCovers(const std::vector<StepSlice>& plan, int total) {
  int next = 0;
  for (const StepSlice& s : plan) {
    EXPECT_EQ(s.offset, next);
    EXPECT_GT(s.length, 0);
    if (s.method == D) {
      EXPECT_EQ(s.length, 1);
    }
    next = s.offset + s.length;
  }
  EXPECT_EQ(next, total);
}

std::vector<StepSlice> Plan(int total, int width, int bound) {
  auto plan = plan_slices(total, width, bound);
  ExpectCovers(plan, total);
  return plan;
}

TEST(StepPlanTest, OneTokenRunsDecode) {
  EXPECT_EQ(Plan(1, 8, 2), (std::vector<StepSlice>{{0, 1, D}}));
}

TEST(StepPlanTest, TwoTokensRunPrefill) {
  EXPECT_EQ(Plan(2, 8, 2), (std::vector<StepSlice>{{0, 2, P}}));
}

TEST(StepPlanTest, UpToTheWidestStepIsOneForward) {
  EXPECT_EQ(Plan(8, 8, 2), (std::vector<StepSlice>{{0, 8, P}}));
}

TEST(StepPlanTest, WiderBatchesSliceAndALoneTailTokenRunsDecode) {
  EXPECT_EQ(Plan(9, 8, 2), (std::vector<StepSlice>{{0, 8, P}, {8, 1, D}}));
  EXPECT_EQ(Plan(10, 8, 2), (std::vector<StepSlice>{{0, 8, P}, {8, 2, P}}));
  EXPECT_EQ(Plan(16, 8, 2), (std::vector<StepSlice>{{0, 8, P}, {8, 8, P}}));
}

TEST(StepPlanTest, ShortSlicesBelowThePrefillBoundRunAsDecodes) {
  EXPECT_EQ(Plan(4, 8, 5), (std::vector<StepSlice>{{0, 1, D}, {1, 1, D}, {2, 1, D}, {3, 1, D}}));
  EXPECT_EQ(Plan(5, 8, 5), (std::vector<StepSlice>{{0, 5, P}}));
  EXPECT_EQ(Plan(11, 8, 5), (std::vector<StepSlice>{{0, 8, P}, {8, 1, D}, {9, 1, D}, {10, 1, D}}));
}

TEST(StepPlanTest, EmptyBatchPlansNothing) {
  EXPECT_TRUE(Plan(0, 8, 2).empty());
}

TEST(StepPlanTest, WidthOneRunsEveryTokenAsDecode) {
  EXPECT_EQ(Plan(3, 1, 2), (std::vector<StepSlice>{{0, 1, D}, {1, 1, D}, {2, 1, D}}));
}

TEST(StepPlanDeathTest, NonPositiveWidthIsABug) {
  EXPECT_DEATH(plan_slices(4, 0, 2), "positive step width");
}

}  // namespace
}  // namespace cellm
