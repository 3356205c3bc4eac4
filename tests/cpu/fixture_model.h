// Reads a reference fixture made by tools/make_fixtures.py
// (tests/fixtures/models/<name>/reference.json) for the CPU executor's tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cellm/types.h"

namespace cellm::testing {

struct FixturePrompt {
  std::string text;
  std::vector<Token> ids;
  std::vector<int32_t> top_ids;  // last position, by descending logit
  std::vector<float> top_logits;
  std::vector<float> sampled_logits;  // last position, at Fixture::sampled_ids
  double logsumexp = 0;
  Token argmax = 0;
  // [position][sampled id] when this prompt records every position.
  std::optional<std::vector<std::vector<float>>> all_positions;
  std::vector<Token> greedy;   // the reference's greedy continuation
  std::vector<float> margins;  // top-1 minus top-2 logit at each greedy step
};

struct Fixture {
  std::string dir;
  std::string tokenizer;  // the folder under ../shared/tokenizers
  int64_t vocab_size = 0;
  std::vector<int32_t> sampled_ids;
  std::vector<FixturePrompt> prompts;
};

inline std::string fixture_dir(const std::string& name) {
  return std::string(CELLM_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

inline Fixture load_fixture(const std::string& name) {
  Fixture f;
  f.dir = fixture_dir(name);
  std::ifstream in(f.dir + "/reference.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  f.tokenizer = j.at("tokenizer").get<std::string>();
  f.vocab_size = j.at("vocab_size").get<int64_t>();
  f.sampled_ids = j.at("sampled_ids").get<std::vector<int32_t>>();
  for (const auto& p : j.at("prompts")) {
    FixturePrompt fp;
    fp.text = p.at("text").get<std::string>();
    fp.ids = p.at("ids").get<std::vector<Token>>();
    const auto& last = p.at("last");
    fp.top_ids = last.at("top_ids").get<std::vector<int32_t>>();
    fp.top_logits = last.at("top_logits").get<std::vector<float>>();
    fp.sampled_logits = last.at("sampled_logits").get<std::vector<float>>();
    fp.logsumexp = last.at("logsumexp").get<double>();
    fp.argmax = last.at("argmax").get<Token>();
    if (!p.at("all_positions").is_null()) {
      fp.all_positions =
          p.at("all_positions").at("sampled_logits").get<std::vector<std::vector<float>>>();
    }
    fp.greedy = p.at("greedy").at("new_ids").get<std::vector<Token>>();
    fp.margins = p.at("greedy").at("margins").get<std::vector<float>>();
    f.prompts.push_back(std::move(fp));
  }
  return f;
}

// log(sum(exp(row))) in f64.
inline double logsumexp(const float* row, int64_t n) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, double{row[i]});
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(double{row[i]} - mx);
  return mx + std::log(s);
}

inline const std::vector<std::string>& fixture_names() {
  static const std::vector<std::string> names = {"llama3-tiny", "mistral-tiny", "qwen2-tiny",
                                                 "qwen3-tiny"};
  return names;
}

// A test name of a fixture parameter ("llama3-tiny" -> "llama3_tiny"), for
// INSTANTIATE_TEST_SUITE_P(..., ::testing::ValuesIn(fixture_names()), fixture_test_name).
inline std::string fixture_test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name;
}

}  // namespace cellm::testing
