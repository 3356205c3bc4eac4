#include "cellm/status.h"

#include <gtest/gtest.h>

#include <memory>

namespace cellm {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("odd number " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x) {
  CELLM_ASSIGN_OR_RETURN(int h, Half(x));
  CELLM_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status Check(int x) {
  CELLM_RETURN_IF_ERROR(Half(x).status());
  return Status::Ok();
}

TEST(StatusTest, DefaultIsOkAndErrorsCarryCodeAndMessage) {
  EXPECT_TRUE(Status().ok());
  Status s = OutOfResources("pool of 16 cells is full");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOutOfResources);
  EXPECT_EQ(s.to_string(), "OutOfResources: pool of 16 cells is full");
}

TEST(StatusTest, MacrosPropagateTheFirstError) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "odd number 3");
  EXPECT_TRUE(Check(2).ok());
  EXPECT_EQ(Check(3).code(), StatusCode::kInvalidArgument);
}

TEST(StatusTest, ResultHoldsMoveOnlyValues) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(7);
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 7);
}

TEST(StatusDeathTest, ValueOfAnErrorAbortsWithItsMessage) {
  EXPECT_DEATH((void)Half(3).value(), "odd number 3");
}

TEST(StatusDeathTest, CheckFailureNamesFileAndLine) {
  EXPECT_DEATH(CELLM_CHECK_MSG(1 + 1 == 3, "arithmetic"), "status_test.cpp:[0-9]+.*arithmetic");
}

}  // namespace
}  // namespace cellm
