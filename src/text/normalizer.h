// Normalizers of tokenizer.json: the text rewrite that runs on each stretch of
// input between added tokens, before pre-tokenization.
//
// Supported: NFC, NFD, Prepend, Replace, Strip and Sequence of them. Immutable
// after parsing; safe to share between threads.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "cellm/status.h"

namespace cellm {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string_view text) const = 0;
};

// The normalizer described by `j` (a tokenizer.json "normalizer"), or nullptr
// for JSON null. Unknown types are NotSupported.
Result<std::unique_ptr<const Normalizer>> parse_normalizer(const nlohmann::json& j);

}  // namespace cellm
