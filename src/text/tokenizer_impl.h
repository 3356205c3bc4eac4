// Tokenizer::Impl: the parsed pipeline behind the public Tokenizer handle,
// shared by Tokenizer (tokenizer.cpp) and IncrementalDecoder
// (incremental_decoder.cpp). Immutable after load; safe from any thread.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "added_vocabulary.h"
#include "bpe.h"
#include "cellm/tokenizer.h"
#include "normalizer.h"
#include "post_processor.h"
#include "pre_tokenizer.h"
#include "tokenizer_decoder.h"

namespace cellm {

struct Tokenizer::Impl {
  BpeModel model;
  AddedVocabulary added;
  std::unique_ptr<const Normalizer> normalizer;
  std::unique_ptr<const PreTokenizer> pre_tokenizer;
  std::unique_ptr<const PostProcessor> post_processor;
  std::unique_ptr<const TokenDecoder> decoder;
  size_t vocab_size = 0;
  std::optional<Token> bos_id;
  std::vector<Token> eos_ids;

  // Decodes `ids` as a continuation of what `state` has seen, advancing it.
  std::string decode(std::span<const Token> ids, bool skip_special_tokens,
                     DecodeState& state) const;
};

}  // namespace cellm
