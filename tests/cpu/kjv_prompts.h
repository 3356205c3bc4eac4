// The bundled model (models/kjv-small, context 256) and prompts of real text for tests
// of pools shared by need: windows over the token ids recorded in
// tests/fixtures/kjv_reference.json (its snippets and greedy prompts and continuations,
// in file order).
#pragma once

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cellm/model_weights.h"
#include "cellm/status.h"
#include "cellm/types.h"

namespace cellm::testing {

inline std::string kjv_small_dir() {
  return std::string(CELLM_SOURCE_DIR) + "/models/kjv-small";
}

inline std::shared_ptr<const ModelWeights> load_kjv_small() {
  Result<ModelWeights> w = ModelWeights::load(kjv_small_dir());
  CELLM_CHECK_MSG(w.ok(), w.status().to_string());
  return std::make_shared<const ModelWeights>(std::move(*w));
}

// `count` prompts of `length` tokens each, starting `stride` tokens apart in the
// reference's ids. REQUIRES: the ids hold (count - 1) * stride + length tokens.
inline std::vector<std::vector<Token>> kjv_prompts(size_t count, size_t length, size_t stride) {
  std::ifstream in(std::string(CELLM_SOURCE_DIR) + "/tests/fixtures/kjv_reference.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  std::vector<Token> ids;
  const auto append = [&ids](const nlohmann::json& v) {
    const auto more = v.get<std::vector<Token>>();
    ids.insert(ids.end(), more.begin(), more.end());
  };
  for (const nlohmann::json& s : j.at("snippets")) append(s.at("ids"));
  for (const nlohmann::json& g : j.at("greedy")) {
    append(g.at("prompt_ids"));
    append(g.at("new_ids"));
  }
  CELLM_CHECK_MSG((count - 1) * stride + length <= ids.size(),
                  "kjv_prompts: the reference holds " + std::to_string(ids.size()) + " ids");
  std::vector<std::vector<Token>> prompts;
  for (size_t i = 0; i < count; ++i) {
    const auto from = ids.begin() + static_cast<std::ptrdiff_t>(i * stride);
    prompts.emplace_back(from, from + static_cast<std::ptrdiff_t>(length));
  }
  return prompts;
}

}  // namespace cellm::testing
