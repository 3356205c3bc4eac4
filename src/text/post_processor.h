// Post-processors of tokenizer.json: what encode(..., add_special_tokens=true)
// adds around a single sequence (Llama's BOS).
//
// Supported: TemplateProcessing (the "single" template), ByteLevel (ids
// unchanged; it only adjusts offsets, which cellm does not track) and Sequence.
// Immutable after parsing; safe to share between threads.
#pragma once

#include <memory>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "cellm/status.h"
#include "cellm/types.h"

namespace cellm {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Rewrites the ids of one encoded sequence, adding special tokens.
  virtual void process(std::vector<Token>& ids) const = 0;
};

// The post-processor described by `j`, or nullptr for JSON null.
Result<std::unique_ptr<const PostProcessor>> parse_post_processor(const nlohmann::json& j);

}  // namespace cellm
