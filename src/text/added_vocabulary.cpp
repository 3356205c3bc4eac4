#include "added_vocabulary.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "bpe.h"
#include "unicode.h"

namespace cellm {

Result<AddedVocabulary> AddedVocabulary::parse(const nlohmann::json& added_tokens) {
  AddedVocabulary v;
  if (added_tokens.is_null()) return v;
  if (!added_tokens.is_array()) return InvalidProgram("added_tokens must be an array");
  v.tokens_.reserve(added_tokens.size());
  for (const nlohmann::json& t : added_tokens) {
    AddedToken token;
    token.content = t.at("content").get<std::string>();
    const int64_t id = t.at("id").get<int64_t>();
    if (id < 0 || id >= kTokenIdLimit) {
      return InvalidProgram("added token '" + token.content + "' has id " + std::to_string(id) +
                            ", out of range [0, " + std::to_string(kTokenIdLimit) + ")");
    }
    if (token.content.empty()) return InvalidProgram("an added token has empty content");
    token.id = static_cast<Token>(id);
    token.special = t.value("special", false);
    token.single_word = t.value("single_word", false);
    token.lstrip = t.value("lstrip", false);
    token.rstrip = t.value("rstrip", false);
    token.normalized = t.value("normalized", !token.special);
    v.tokens_.push_back(std::move(token));
  }
  for (size_t i = 0; i < v.tokens_.size(); ++i) {
    const AddedToken& token = v.tokens_[i];
    v.by_id_[token.id] = i;
    Matcher& m = token.normalized ? v.normalized_ : v.raw_;
    m.by_content[token.content] = i;
    m.first_bytes[static_cast<uint8_t>(token.content[0])] = true;
    m.lengths_bytes.push_back(token.content.size());
  }
  for (Matcher* m : {&v.raw_, &v.normalized_}) {
    std::sort(m->lengths_bytes.begin(), m->lengths_bytes.end(), std::greater<>());
    m->lengths_bytes.erase(std::unique(m->lengths_bytes.begin(), m->lengths_bytes.end()),
                           m->lengths_bytes.end());
  }
  CELLM_ASSIGN_OR_RETURN(Regex word_char, Regex::compile(R"([\p{Alphabetic}\p{N}_])"));
  v.word_char_ = std::move(word_char);
  return v;
}

std::optional<AddedVocabulary::Found> AddedVocabulary::find_next(const Matcher& m,
                                                                 std::string_view text,
                                                                 size_t from) const {
  if (m.by_content.empty()) return std::nullopt;
  for (size_t begin = from; begin < text.size(); ++begin) {
    if (!m.first_bytes[static_cast<uint8_t>(text[begin])]) continue;
    for (size_t length : m.lengths_bytes) {
      if (length > text.size() - begin) continue;
      const auto it = m.by_content.find(text.substr(begin, length));
      if (it != m.by_content.end()) return Found{begin, begin + length, it->second};
    }
  }
  return std::nullopt;
}

bool AddedVocabulary::is_word_char_at(std::string_view text, size_t begin) const {
  if (begin >= text.size()) return false;
  const unicode::Utf8Unit u = unicode::decode_utf8(text, begin);
  return u.valid && !word_char_->find_all(text.substr(begin, u.size_bytes)).empty();
}

bool AddedVocabulary::is_word_char_before(std::string_view text, size_t end) const {
  if (end == 0) return false;
  size_t begin = end - 1;
  while (begin > 0 && (static_cast<uint8_t>(text[begin]) & 0xC0) == 0x80 && end - begin < 4) {
    --begin;
  }
  return is_word_char_at(text.substr(0, end), begin);
}

std::vector<Segment> AddedVocabulary::split(std::string_view text, bool normalized) const {
  const Matcher& m = normalized ? normalized_ : raw_;
  std::vector<Segment> segments;
  size_t start_offset = 0;  // end of the last emitted segment
  size_t search_from = 0;
  while (std::optional<Found> found = find_next(m, text, search_from)) {
    search_from = found->end;
    const AddedToken& token = tokens_[found->index];
    size_t begin = found->begin;
    size_t end = found->end;
    if (begin < start_offset) continue;  // overlaps an earlier rstrip
    if (token.single_word && (is_word_char_before(text, begin) || is_word_char_at(text, end))) {
      continue;
    }
    if (token.lstrip) {
      size_t new_begin = begin;
      while (new_begin > start_offset) {
        size_t prev = new_begin - 1;
        while (prev > start_offset && (static_cast<uint8_t>(text[prev]) & 0xC0) == 0x80) --prev;
        const unicode::Utf8Unit u = unicode::decode_utf8(text, prev);
        if (!u.valid || prev + u.size_bytes != new_begin || !unicode::is_whitespace(u.code_point)) {
          break;
        }
        new_begin = prev;
      }
      begin = new_begin;
    }
    if (token.rstrip) {
      while (end < text.size()) {
        const unicode::Utf8Unit u = unicode::decode_utf8(text, end);
        if (!u.valid || !unicode::is_whitespace(u.code_point)) break;
        end += u.size_bytes;
      }
    }
    if (start_offset < begin)
      segments.push_back({text.substr(start_offset, begin - start_offset), {}});
    segments.push_back({text.substr(begin, end - begin), token.id});
    start_offset = end;
  }
  if (start_offset < text.size()) segments.push_back({text.substr(start_offset), {}});
  return segments;
}

const AddedToken* AddedVocabulary::find(Token id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<Token> AddedVocabulary::find(std::string_view content) const {
  for (const Matcher* m : {&raw_, &normalized_}) {
    if (const auto it = m->by_content.find(content); it != m->by_content.end()) {
      return tokens_[it->second].id;
    }
  }
  return std::nullopt;
}

}  // namespace cellm
