// The BPE model of tokenizer.json: a vocabulary, ranked merges and the rules for
// characters the vocabulary lacks (byte fallback to <0xNN> tokens, or unk).
//
// A pre-token (one word) is split into characters, then the adjacent pair with
// the lowest merge rank is merged, leftmost first, until no pair merges, exactly
// as Hugging Face's Word::merge_all. With ignore_merges a word that is itself in
// the vocabulary maps to its id directly. Words are cached by their text.
// Thread-safety: encode_word is safe from any thread (the cache has a mutex).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "cellm/status.h"
#include "cellm/types.h"

namespace cellm {

// Token ids of tokenizer.json (the vocabulary and the added tokens) lie below
// this bound, as config.json's vocab_size does (ModelConfig): the id -> token
// table is sized by the largest id, so one huge id would ask for gigabytes.
constexpr int64_t kTokenIdLimit = int64_t{1} << 24;

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringToToken = std::unordered_map<std::string, Token, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // `model` is tokenizer.json's "model" object with type "BPE".
  static Result<BpeModel> parse(const nlohmann::json& model);

  // Appends the ids of `word` to `out`.
  void encode_word(std::string_view word, std::vector<Token>& out) const;

  std::optional<Token> token_to_id(std::string_view token) const;
  // The token of `id`, or nullptr when the vocabulary has no such id.
  const std::string* id_to_token(Token id) const;
  // One past the largest id of the vocabulary.
  size_t id_limit() const { return id_to_token_.size(); }

 private:
  struct MergeResult {
    int32_t rank;
    Token id;
  };
  struct Cache;

  std::vector<Token> merge_word(std::string_view word) const;
  std::optional<MergeResult> find_merge(Token left, Token right) const;

  StringToToken vocab_;
  std::vector<std::optional<std::string>> id_to_token_;  // [id_limit]
  std::unordered_map<uint64_t, MergeResult> merges_;     // (left << 32 | right) -> result
  std::optional<Token> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  std::array<std::optional<Token>, 256> byte_ids_{};  // <0xNN> tokens, when present
  std::shared_ptr<Cache> cache_;
};

}  // namespace cellm
