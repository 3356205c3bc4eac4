// The added tokens of tokenizer.json ("added_tokens"): strings matched in the
// input before the model runs, leftmost-longest, as whole tokens.
//
// Tokens with normalized=false are matched in the raw input, those with
// normalized=true in each normalized stretch between the former. single_word,
// lstrip and rstrip follow Hugging Face's AddedVocabulary::find_matches.
// Immutable after parsing; safe to share between threads.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "cellm/status.h"
#include "cellm/types.h"
#include "regex.h"

namespace cellm {

struct AddedToken {
  std::string content;
  Token id = 0;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

// A stretch of input: an added token, or text for the normalizer and model.
struct Segment {
  std::string_view text;
  std::optional<Token> id;  // set for an added token
};

// Move-only: the matchers point into tokens_.
class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  AddedVocabulary(AddedVocabulary&&) = default;
  AddedVocabulary& operator=(AddedVocabulary&&) = default;
  AddedVocabulary(const AddedVocabulary&) = delete;
  AddedVocabulary& operator=(const AddedVocabulary&) = delete;

  static Result<AddedVocabulary> parse(const nlohmann::json& added_tokens);

  // Splits `text` at the added tokens whose `normalized` flag equals
  // `normalized`; segments point into `text`; empty text segments are dropped.
  std::vector<Segment> split(std::string_view text, bool normalized) const;

  const AddedToken* find(Token id) const;
  std::optional<Token> find(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // Leftmost-longest matcher over one group of tokens.
  struct Matcher {
    std::unordered_map<std::string_view, size_t> by_content;  // -> index in tokens_
    std::vector<size_t> lengths_bytes;                        // distinct, descending
    std::array<bool, 256> first_bytes{};
  };
  struct Found {
    size_t begin;
    size_t end;
    size_t index;
  };
  std::optional<Found> find_next(const Matcher& m, std::string_view text, size_t from) const;
  bool is_word_char_before(std::string_view text, size_t end) const;
  bool is_word_char_at(std::string_view text, size_t begin) const;

  std::vector<AddedToken> tokens_;
  std::unordered_map<Token, size_t> by_id_;
  Matcher raw_;
  Matcher normalized_;
  std::optional<Regex> word_char_;  // [\p{Alphabetic}\p{N}_]
};

}  // namespace cellm
