#include "serve/stop_matcher.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace cellm::serve {
namespace {

// Feeds `pieces` and returns everything the matcher let through, finish() included.
std::string run(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const std::string& p : pieces) out += m.push(p);
  return out + m.finish();
}

TEST(StopMatcherTest, TextWithoutStopStringsPassesThroughUnchanged) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.push("hello "), "hello ");
  EXPECT_EQ(m.push("world"), "world");
  EXPECT_EQ(m.finish(), "");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcherTest, AStopInsideOnePieceCutsBeforeIt) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.push("abcENDdef"), "abc");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "END");
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.finish(), "");
}

TEST(StopMatcherTest, AStopSplitAcrossPiecesNeverLeaks) {
  StopMatcher m({"\n\n"});
  EXPECT_EQ(m.push("line one\n"), "line one");
  EXPECT_EQ(m.held_bytes(), 1u);
  EXPECT_EQ(m.push("\nline two"), "");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcherTest, AHeldPartialMatchIsReleasedWhenItDiverges) {
  StopMatcher m({"LORD God"});
  EXPECT_EQ(m.push("the LORD"), "the ");
  EXPECT_EQ(m.push(" said"), "LORD said");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcherTest, AHeldPartialMatchIsReleasedAtTheEnd) {
  StopMatcher m({"stop here"});
  EXPECT_EQ(m.push("we stop"), "we ");
  EXPECT_EQ(m.finish(), "stop");
}

TEST(StopMatcherTest, TheEarliestOfSeveralStopsWins) {
  StopMatcher m({"cd", "b"});
  EXPECT_EQ(m.push("abcd"), "a");
  EXPECT_EQ(m.matched(), "b");
}

TEST(StopMatcherTest, OneByteAtATimeMatchesLikeOnePiece) {
  const std::string text = "And God said, Let there be light: and there was light.";
  for (const std::string& stop :
       {std::string("light:"), std::string("there was"), std::string("."), std::string("x")}) {
    StopMatcher whole({stop});
    const std::string expected = run(whole, {text});
    StopMatcher bytes({stop});
    std::vector<std::string> pieces;
    for (char c : text) pieces.emplace_back(1, c);
    EXPECT_EQ(run(bytes, pieces), expected) << stop;
    EXPECT_EQ(expected.find(stop), std::string::npos) << stop;
  }
}

TEST(StopMatcherTest, OverlappingPrefixesHoldTheLongestCandidate) {
  StopMatcher m({"aab"});
  EXPECT_EQ(m.push("xaa"), "x");
  EXPECT_EQ(m.push("a"), "a");  // "aaa": only "aa" can still start "aab"
  EXPECT_EQ(m.push("b"), "");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcherTest, EmptyStopStringsAreIgnored) {
  StopMatcher m({"", ""});
  EXPECT_EQ(m.push("abc"), "abc");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcherTest, MultiByteCharactersAreNeverSplit) {
  StopMatcher m({"\xC3\xA9t\xC3\xA9"});  // "été"
  EXPECT_EQ(m.push("caf\xC3\xA9"), "caf");
  EXPECT_EQ(m.push("!"), "\xC3\xA9!");
}

}  // namespace
}  // namespace cellm::serve
