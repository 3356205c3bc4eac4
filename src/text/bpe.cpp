#include "bpe.h"

#include <cstdio>
#include <mutex>
#include <queue>

#include <nlohmann/json.hpp>

#include "unicode.h"

namespace cellm {

struct BpeModel::Cache {
  static constexpr size_t kCapacityWords = 1 << 16;
  static constexpr size_t kMaxWordBytes = 256;
  std::mutex mutex;
  std::unordered_map<std::string, std::vector<Token>, StringHash, std::equal_to<>>
      words;  // guarded by mutex
};

Result<BpeModel> BpeModel::parse(const nlohmann::json& model) {
  BpeModel bpe;
  const nlohmann::json& vocab = model.at("vocab");
  if (!vocab.is_object()) return InvalidProgram("model.vocab must be an object");
  bpe.vocab_.reserve(vocab.size());
  Token max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const std::string& token = it.key();
    if (!it.value().is_number_integer()) {
      return InvalidProgram("model.vocab id of '" + token + "' is not an integer");
    }
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= kTokenIdLimit) {
      return InvalidProgram("model.vocab id " + std::to_string(id) + " of '" + token +
                            "' is out of range [0, " + std::to_string(kTokenIdLimit) + ")");
    }
    bpe.vocab_.emplace(token, static_cast<Token>(id));
    max_id = std::max(max_id, static_cast<Token>(id));
  }
  bpe.id_to_token_.resize(static_cast<size_t>(max_id + 1));
  for (const auto& [token, id] : bpe.vocab_) bpe.id_to_token_[static_cast<size_t>(id)] = token;

  const auto string_or_empty = [&](const char* key) {
    return model.contains(key) && model.at(key).is_string() ? model.at(key).get<std::string>()
                                                            : std::string();
  };
  bpe.continuing_subword_prefix_ = string_or_empty("continuing_subword_prefix");
  bpe.end_of_word_suffix_ = string_or_empty("end_of_word_suffix");
  bpe.fuse_unk_ = model.value("fuse_unk", false);
  bpe.byte_fallback_ = model.value("byte_fallback", false);
  bpe.ignore_merges_ = model.value("ignore_merges", false);
  if (model.contains("dropout") && !model.at("dropout").is_null() &&
      model.at("dropout").get<double>() != 0.0) {
    return NotSupported("BPE dropout is not supported");
  }
  if (const std::string unk = string_or_empty("unk_token"); !unk.empty()) {
    const auto it = bpe.vocab_.find(unk);
    if (it == bpe.vocab_.end()) {
      return InvalidProgram("model.unk_token '" + unk + "' is not in the vocabulary");
    }
    bpe.unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    if (const auto it = bpe.vocab_.find(std::string_view(name)); it != bpe.vocab_.end()) {
      bpe.byte_ids_[static_cast<size_t>(b)] = it->second;
    }
  }

  const nlohmann::json& merges = model.at("merges");
  if (!merges.is_array()) return InvalidProgram("model.merges must be an array");
  bpe.merges_.reserve(merges.size());
  const size_t prefix_bytes = bpe.continuing_subword_prefix_.size();
  int32_t rank = 0;
  std::string merged;  // reused buffer for left + right
  for (const nlohmann::json& merge : merges) {
    std::string_view left;
    std::string_view right;
    if (merge.is_string()) {
      const std::string_view line = merge.get_ref<const std::string&>();
      const size_t space = line.find(' ');
      if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos) {
        return InvalidProgram("merge " + std::to_string(rank) + " '" + std::string(line) +
                              "' is not two tokens separated by one space");
      }
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get_ref<const std::string&>();
      right = merge[1].get_ref<const std::string&>();
    } else {
      return InvalidProgram("merge " + std::to_string(rank) + " is neither \"a b\" nor [a, b]");
    }
    const auto left_it = bpe.vocab_.find(left);
    const auto right_it = bpe.vocab_.find(right);
    if (left_it == bpe.vocab_.end() || right_it == bpe.vocab_.end()) {
      return InvalidProgram("merge " + std::to_string(rank) + " uses '" +
                            std::string(left_it == bpe.vocab_.end() ? left : right) +
                            "', which is not in the vocabulary");
    }
    merged.assign(left);
    merged.append(right.starts_with(bpe.continuing_subword_prefix_) ? right.substr(prefix_bytes)
                                                                    : right);
    const auto merged_it = bpe.vocab_.find(merged);
    if (merged_it == bpe.vocab_.end()) {
      return InvalidProgram("merge " + std::to_string(rank) + " makes '" + merged +
                            "', which is not in the vocabulary");
    }
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(left_it->second)) << 32) |
                         static_cast<uint32_t>(right_it->second);
    bpe.merges_.insert_or_assign(key, MergeResult{rank, merged_it->second});
    ++rank;
  }
  bpe.cache_ = std::make_shared<Cache>();
  return bpe;
}

std::optional<BpeModel::MergeResult> BpeModel::find_merge(Token left, Token right) const {
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  const auto it = merges_.find(key);
  if (it == merges_.end()) return std::nullopt;
  return it->second;
}

std::vector<Token> BpeModel::merge_word(std::string_view word) const {
  // Symbols of the word as a doubly linked list over a vector; a merged-away
  // symbol has removed set.
  struct Symbol {
    Token id;
    int32_t prev;
    int32_t next;
    bool removed;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  const auto add = [&](Token id) {
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, false});
  };

  std::optional<Token> pending_unk;
  for (size_t i = 0; i < word.size();) {
    const uint32_t char_bytes = unicode::decode_utf8(word, i).size_bytes;
    const bool is_first = i == 0;
    const bool is_last = i + char_bytes == word.size();
    std::string piece;
    if (!is_first) piece += continuing_subword_prefix_;
    piece.append(word.substr(i, char_bytes));
    if (is_last) piece += end_of_word_suffix_;
    i += char_bytes;

    if (const auto it = vocab_.find(piece); it != vocab_.end()) {
      if (pending_unk) add(*std::exchange(pending_unk, std::nullopt));
      add(it->second);
      continue;
    }
    if (byte_fallback_) {
      const bool all_bytes = std::all_of(piece.begin(), piece.end(), [&](char c) {
        return byte_ids_[static_cast<uint8_t>(c)].has_value();
      });
      if (all_bytes) {
        // Hugging Face adds these without flushing a pending unk first.
        for (char c : piece) add(*byte_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk && !fuse_unk_) add(*pending_unk);
      pending_unk = unk_id_;
    }
  }
  if (pending_unk) add(*pending_unk);
  if (symbols.empty()) return {};
  symbols.back().next = -1;

  struct Candidate {
    int32_t rank;
    int32_t pos;
    Token new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (auto m = find_merge(symbols[i].id, symbols[i + 1].id)) {
      queue.push({m->rank, static_cast<int32_t>(i), m->id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& current = symbols[static_cast<size_t>(top.pos)];
    if (current.removed || current.next == -1) continue;
    const int32_t next_pos = current.next;
    Symbol& right = symbols[static_cast<size_t>(next_pos)];
    const std::optional<MergeResult> still = find_merge(current.id, right.id);
    if (!still || still->id != top.new_id) continue;  // a stale entry
    current.id = top.new_id;
    current.next = right.next;
    right.removed = true;
    if (right.next != -1) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    if (current.prev >= 0) {
      const Symbol& previous = symbols[static_cast<size_t>(current.prev)];
      if (auto m = find_merge(previous.id, current.id)) {
        queue.push({m->rank, current.prev, m->id});
      }
    }
    if (current.next != -1) {
      if (auto m = find_merge(current.id, symbols[static_cast<size_t>(current.next)].id)) {
        queue.push({m->rank, top.pos, m->id});
      }
    }
  }
  std::vector<Token> ids;
  for (const Symbol& s : symbols) {
    if (!s.removed) ids.push_back(s.id);
  }
  return ids;
}

void BpeModel::encode_word(std::string_view word, std::vector<Token>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= Cache::kMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    if (const auto it = cache_->words.find(word); it != cache_->words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<Token> ids = merge_word(word);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    if (cache_->words.size() < Cache::kCapacityWords) cache_->words.emplace(word, std::move(ids));
  }
}

std::optional<Token> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(Token id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return nullptr;
  const std::optional<std::string>& token = id_to_token_[static_cast<size_t>(id)];
  return token ? &*token : nullptr;
}

}  // namespace cellm
