// TokenVocabulary: validation and the byte trie (token_trie.h).
#include <algorithm>
#include <numeric>

#include "grammar/token_trie.h"

namespace cellm {

namespace {
// Subtrees with at least this many nodes record the bytes below them.
constexpr uint32_t kMinNodesForBelowSet = 8;
}  // namespace

Result<TokenVocabulary> TokenVocabulary::build(std::vector<std::string> token_bytes,
                                               std::vector<Token> eos_ids) {
  if (token_bytes.empty()) return InvalidArgument("the vocabulary is empty");
  if (token_bytes.size() > 0x7FFFFFFFu) return InvalidArgument("the vocabulary is too large");
  auto impl = std::make_shared<Impl>();
  impl->eos_flag.assign(token_bytes.size(), 0);
  for (Token id : eos_ids) {
    if (id < 0 || static_cast<size_t>(id) >= token_bytes.size()) {
      return InvalidArgument("EOS id " + std::to_string(id) + " is outside the vocabulary of " +
                             std::to_string(token_bytes.size()) + " tokens");
    }
    if (!impl->eos_flag[id]) impl->eos_ids.push_back(id);
    impl->eos_flag[id] = 1;
  }
  impl->token_bytes = std::move(token_bytes);
  const auto& bytes = impl->token_bytes;

  // Tokens with bytes, sorted by their bytes (pre-order of the trie).
  std::vector<Token> ids;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (!bytes[i].empty() && !impl->eos_flag[i]) ids.push_back(static_cast<Token>(i));
  }
  std::sort(ids.begin(), ids.end(), [&](Token a, Token b) {
    return bytes[a] < bytes[b] || (bytes[a] == bytes[b] && a < b);
  });
  impl->sorted_tokens = ids;

  auto& nodes = impl->nodes;
  nodes.push_back(Impl::Node{});
  std::vector<uint32_t> path{0};  // path[d] = node of the prefix of length d
  auto close = [&](uint32_t n, uint32_t tok_index) {
    nodes[n].end = static_cast<uint32_t>(nodes.size());
    nodes[n].tok_end = tok_index;
  };
  for (uint32_t t = 0; t < ids.size(); ++t) {
    const std::string& s = bytes[ids[t]];
    const std::string* prev = t > 0 ? &bytes[ids[t - 1]] : nullptr;
    size_t common = 0;
    if (prev != nullptr) {
      const size_t limit = std::min(prev->size(), s.size());
      while (common < limit && (*prev)[common] == s[common]) ++common;
    }
    // The path holds the previous token's prefixes; keep the common part.
    while (path.size() > common + 1) {
      close(path.back(), t);
      path.pop_back();
    }
    for (size_t d = common; d < s.size(); ++d) {
      Impl::Node n;
      n.byte = static_cast<uint8_t>(s[d]);
      n.tok_begin = t;
      n.own_end = t;
      nodes.push_back(n);
      path.push_back(static_cast<uint32_t>(nodes.size() - 1));
    }
    nodes[path.back()].own_end = t + 1;
  }
  while (!path.empty()) {
    close(path.back(), static_cast<uint32_t>(ids.size()));
    path.pop_back();
  }
  // Bytes below each big subtree, children before parents (reverse pre-order).
  std::vector<grammar::ByteSet> below(nodes.size());
  for (size_t n = nodes.size(); n-- > 0;) {
    for (uint32_t c = static_cast<uint32_t>(n) + 1; c < nodes[n].end; c = nodes[c].end) {
      below[n].set(nodes[c].byte);
      below[n] |= below[c];
    }
  }
  for (size_t n = 0; n < nodes.size(); ++n) {
    if (nodes[n].end - n >= kMinNodesForBelowSet) {
      nodes[n].below = static_cast<int32_t>(impl->below_sets.size());
      impl->below_sets.push_back(below[n]);
    }
  }
  return TokenVocabulary(std::move(impl));
}

size_t TokenVocabulary::size() const {
  return impl_->token_bytes.size();
}
size_t TokenVocabulary::mask_words() const {
  return (impl_->token_bytes.size() + 63) / 64;
}
const std::string& TokenVocabulary::bytes(Token id) const {
  CELLM_CHECK(id >= 0 && static_cast<size_t>(id) < impl_->token_bytes.size());
  return impl_->token_bytes[id];
}
bool TokenVocabulary::is_eos(Token id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->eos_flag.size() && impl_->eos_flag[id];
}
const std::vector<Token>& TokenVocabulary::eos_ids() const {
  return impl_->eos_ids;
}

}  // namespace cellm
