// `cellm perplexity` end to end on the bundled model: the running estimates and
// the final line, the number of tokens scored (the second half of each chunk), a
// perplexity that is the model's (KJV text scores far better than the same
// tokens shuffled), and clear errors for bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "run_cellm.h"

namespace cellm {
namespace {

namespace fs = std::filesystem;
using testing::CellmRun;
using testing::run_cellm;

// The KJV snippets of the reference fixture, joined: about 130 tokens of kjv-small.
std::string kjv_text() {
  const nlohmann::json r =
      testing::parse_json_file(testing::source_dir() + "/tests/fixtures/kjv_reference.json");
  std::string text = r.at("all_positions").at("text").get<std::string>();
  for (const auto& s : r.at("snippets")) text += "\n" + s.at("text").get<std::string>();
  return text;
}

struct Perplexity {
  double ppl = 0;
  long scored = 0;
  int estimates = 0;
};

Perplexity measure(const fs::path& file, const std::string& ctx) {
  const CellmRun r =
      run_cellm({"perplexity", "--file", file.string(), "--ctx-size", ctx, "--threads", "2"});
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.describe();
  Perplexity p;
  // "Final estimate: PPL = X +/- E (N tokens scored, ...)" (parsed by hand: std::regex
  // trips GCC's maybe-uninitialized warning under ASan).
  const size_t at = r.out.find("Final estimate: PPL = ");
  EXPECT_NE(at, std::string::npos) << r.describe();
  if (at != std::string::npos) {
    double err = 0;
    EXPECT_EQ(std::sscanf(r.out.c_str() + at, "Final estimate: PPL = %lf +/- %lf (%ld tokens",
                          &p.ppl, &err, &p.scored),
              3)
        << r.describe();
  }
  // The running estimates "[1]x,[2]y,...": one '[' each, all on the line before.
  p.estimates = static_cast<int>(std::count(
      r.out.begin(), r.out.begin() + static_cast<std::ptrdiff_t>(std::min(at, r.out.size())), '['));
  return p;
}

TEST(CellmPerplexityTest, ScoresTheSecondHalfOfEachChunk) {
  testing::TempDir tmp;
  const fs::path file = tmp.path() / "kjv.txt";
  std::ofstream(file) << kjv_text();
  const Perplexity p = measure(file, "32");
  // Each chunk of 32 scores the tokens at 17..31: 15 of them.
  EXPECT_GE(p.estimates, 3);
  EXPECT_EQ(p.scored, 15L * p.estimates);
  // kjv-small was trained on this text: a low perplexity, far from its 4096-token
  // vocabulary's uniform one.
  EXPECT_GT(p.ppl, 1.0);
  EXPECT_LT(p.ppl, 40.0);

  // The same words shuffled score much worse.
  std::istringstream words_in(kjv_text());
  std::vector<std::string> words{std::istream_iterator<std::string>(words_in), {}};
  std::shuffle(words.begin(), words.end(), std::mt19937(7));
  std::string shuffled;
  for (const std::string& w : words) shuffled += w + " ";
  const fs::path shuffled_file = tmp.path() / "shuffled.txt";
  std::ofstream(shuffled_file) << shuffled;
  const Perplexity q = measure(shuffled_file, "32");
  EXPECT_GT(q.ppl, 3 * p.ppl);
}

TEST(CellmPerplexityTest, BadInputGetsAClearError) {
  testing::TempDir tmp;
  const fs::path file = tmp.path() / "short.txt";
  std::ofstream(file) << "In the beginning";
  const CellmRun missing = run_cellm({"perplexity"});
  EXPECT_EQ(missing.exit_code, 2) << missing.describe();
  EXPECT_NE(missing.err.find("--file is required"), std::string::npos) << missing.describe();
  const CellmRun no_file = run_cellm({"perplexity", "--file", (tmp.path() / "nope").string()});
  EXPECT_NE(no_file.err.find("cannot open"), std::string::npos) << no_file.describe();
  const CellmRun too_short = run_cellm({"perplexity", "--file", file.string(), "--ctx-size", "64"});
  EXPECT_NE(too_short.err.find("fewer than one chunk"), std::string::npos) << too_short.describe();
  const CellmRun too_long =
      run_cellm({"perplexity", "--file", file.string(), "--ctx-size", "100000"});
  EXPECT_NE(too_long.err.find("past the model's context"), std::string::npos)
      << too_long.describe();
}

}  // namespace
}  // namespace cellm
