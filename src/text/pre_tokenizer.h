// Pre-tokenizers of tokenizer.json: split normalized text into pieces that the
// model encodes one by one (and caches by their text).
//
// Supported: Split (regex or literal, every `behavior`, `invert`), ByteLevel
// (add_prefix_space, use_regex with the GPT-2 pattern), Metaspace (replacement,
// prepend_scheme first/always/never, split) and Sequence. Immutable after
// parsing; safe to share between threads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "cellm/status.h"

namespace cellm {

struct PreToken {
  std::string text;
  bool at_input_start = false;  // begins at byte 0 of the text given to encode()
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their refinement; empty pieces are dropped.
  virtual void pre_tokenize(std::vector<PreToken>& pieces) const = 0;
};

// The pre-tokenizer described by `j`, or nullptr for JSON null.
Result<std::unique_ptr<const PreTokenizer>> parse_pre_tokenizer(const nlohmann::json& j);

}  // namespace cellm
