// GrammarMatcher: one generation's state in the automaton, and the token mask of
// each step (a walk of the vocabulary trie, cached per automaton state).
#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "grammar/automaton.h"
#include "grammar/token_trie.h"

namespace cellm {

namespace {

// What a matcher shares with its forks: the automaton and the mask cache, both
// guarded by `mu` (matchers of one family may run on different threads).
struct SharedCache {
  SharedCache(Grammar g, TokenVocabulary v, const GrammarLimits& l)
      : grammar(std::move(g)),
        vocab(std::move(v)),
        limits(l),
        automaton(std::shared_ptr<const Grammar::Impl>(std::shared_ptr<const Grammar::Impl>{},
                                                       &grammar.impl()),
                  l.max_stack_depth, l.max_matcher_bytes / 2),
        empty_mask(vocab.mask_words(), 0) {}

  // The mask of `s` (EOS included), from the cache or trie walks; the empty mask
  // once the automaton is exhausted. REQUIRES: mu held.
  const std::vector<uint64_t>& mask_of(uint32_t s);

  // What a projected state decides on its own: the tokens it accepts without
  // escaping (bits), and the trie subtrees whose paths escape, as (node, bytes
  // before the node), to be walked again from each full state.
  struct Decided {
    std::vector<uint64_t> bits;
    std::vector<std::pair<uint32_t, uint32_t>> undecided;
  };
  const Decided& decided_of(uint32_t projected);

  // Scans trie nodes [first, last) (a forest whose roots' parent is reached in
  // `state` after `depth` bytes), appending accepted token ranges to `ranges`;
  // with `undecided`, escaping subtrees go there instead.
  void walk_range(uint32_t first, uint32_t last, uint32_t state, uint32_t depth,
                  std::vector<std::pair<uint32_t, uint32_t>>* undecided);
  void set_ranges(std::vector<uint64_t>& mask);
  size_t cache_bytes() const;

  std::mutex mu;
  Grammar grammar;
  TokenVocabulary vocab;
  GrammarLimits limits;
  grammar::Automaton automaton;
  std::unordered_map<uint32_t, std::vector<uint64_t>> mask_cache;
  std::unordered_map<uint32_t, Decided> decided_cache;
  size_t undecided_entries = 0;
  std::vector<uint64_t> empty_mask;
  // Walk scratch: open trie ancestors (subtree end, state); token ranges allowed.
  std::vector<std::pair<uint32_t, uint32_t>> frames;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
};

}  // namespace

struct GrammarMatcher::Impl {
  void update_status() {
    if (!status.ok()) return;
    switch (cache->automaton.reason()) {
      case grammar::Automaton::Exhaustion::kNone:
        break;
      case grammar::Automaton::Exhaustion::kMemory:
        status = OutOfResources("the grammar matcher exceeded its memory budget of " +
                                std::to_string(cache->limits.max_matcher_bytes) + " bytes");
        break;
      case grammar::Automaton::Exhaustion::kWork:
        status =
            OutOfResources("the grammar is too ambiguous: one step needed more than " +
                           std::to_string(cache->limits.max_step_work) +
                           " parse-stack visits (alternatives that stay open together multiply)");
        break;
    }
  }

  std::shared_ptr<SharedCache> cache;
  uint32_t state = 0;
  bool ended = false;
  Status status;
  std::vector<uint64_t> out_mask;
};

void SharedCache::walk_range(uint32_t first, uint32_t last, uint32_t state, uint32_t depth,
                             std::vector<std::pair<uint32_t, uint32_t>>* undecided) {
  // A forward scan of the trie in pre-order (the node array's order), skipping
  // every subtree that is rejected, accepted whole or undecided; `frames` holds
  // the open ancestors as (end of their subtree, their automaton state).
  const TokenVocabulary::Impl& v = vocab.impl();
  frames.clear();
  frames.emplace_back(last, state);
  for (uint32_t c = first; c < last;) {
    while (frames.back().first <= c) frames.pop_back();
    const TokenVocabulary::Impl::Node& node = v.nodes[c];
    const int32_t next = automaton.step(frames.back().second, node.byte);
    if (next == grammar::Automaton::kDead) {
      c = node.end;
      continue;
    }
    const auto ns = static_cast<uint32_t>(next);
    if (undecided != nullptr && automaton.escaped(ns)) {
      undecided->emplace_back(c, depth + static_cast<uint32_t>(frames.size()) - 1);
      c = node.end;
      continue;
    }
    if (node.below >= 0 && v.below_sets[node.below].subset_of(automaton.self_loop(ns))) {
      ranges.emplace_back(node.tok_begin, node.tok_end);  // the whole subtree
      c = node.end;
      continue;
    }
    if (node.own_end > node.tok_begin) ranges.emplace_back(node.tok_begin, node.own_end);
    if (node.end > c + 1) frames.emplace_back(node.end, ns);
    ++c;
  }
}

void SharedCache::set_ranges(std::vector<uint64_t>& mask) {
  const TokenVocabulary::Impl& v = vocab.impl();
  for (auto [b, e] : ranges) {
    for (uint32_t i = b; i < e; ++i) {
      const auto id = static_cast<uint32_t>(v.sorted_tokens[i]);
      mask[id >> 6] |= uint64_t{1} << (id & 63);
    }
  }
  ranges.clear();
}

size_t SharedCache::cache_bytes() const {
  const size_t mask_bytes = vocab.mask_words() * sizeof(uint64_t);
  return (mask_cache.size() + decided_cache.size()) * mask_bytes + undecided_entries * 8;
}

const SharedCache::Decided& SharedCache::decided_of(uint32_t projected) {
  auto it = decided_cache.find(projected);
  if (it != decided_cache.end()) return it->second;
  const TokenVocabulary::Impl& v = vocab.impl();
  Decided d;
  d.bits.assign(vocab.mask_words(), 0);
  ranges.clear();
  walk_range(1, static_cast<uint32_t>(v.nodes.size()), projected, 0, &d.undecided);
  set_ranges(d.bits);
  undecided_entries += d.undecided.size();
  return decided_cache.emplace(projected, std::move(d)).first->second;
}

const std::vector<uint64_t>& SharedCache::mask_of(uint32_t s) {
  auto it = mask_cache.find(s);
  if (it != mask_cache.end()) return it->second;
  if (cache_bytes() + 2 * vocab.mask_words() * sizeof(uint64_t) > limits.max_matcher_bytes / 2) {
    mask_cache.clear();
    decided_cache.clear();
    undecided_entries = 0;
  }
  const TokenVocabulary::Impl& v = vocab.impl();
  std::vector<uint64_t> mask(vocab.mask_words(), 0);
  ranges.clear();
  const uint32_t p = automaton.project(s);
  if (p == s) {
    walk_range(1, static_cast<uint32_t>(v.nodes.size()), s, 0, nullptr);
  } else {
    // Tokens the projection decides, then the escaping subtrees from s itself:
    // step s through the subtree's path (the first bytes of any of its tokens).
    const Decided& d = decided_of(p);
    mask = d.bits;
    for (auto [node, depth] : d.undecided) {
      const std::string& path = v.token_bytes[v.sorted_tokens[v.nodes[node].tok_begin]];
      int32_t state = static_cast<int32_t>(s);
      for (uint32_t i = 0; i < depth && state != grammar::Automaton::kDead; ++i) {
        state = automaton.step(static_cast<uint32_t>(state), static_cast<uint8_t>(path[i]));
      }
      if (state == grammar::Automaton::kDead) continue;
      walk_range(node, v.nodes[node].end, static_cast<uint32_t>(state), depth, nullptr);
    }
  }
  set_ranges(mask);
  if (automaton.accepting(s)) {
    for (Token id : v.eos_ids) mask[id >> 6] |= uint64_t{1} << (id & 63);
  }
  if (automaton.exhausted()) return empty_mask;
  return mask_cache.emplace(s, std::move(mask)).first->second;
}

GrammarMatcher::GrammarMatcher(Grammar grammar, TokenVocabulary vocab, const GrammarLimits& limits)
    : impl_(std::make_unique<Impl>()) {
  impl_->cache = std::make_shared<SharedCache>(std::move(grammar), std::move(vocab), limits);
  impl_->state = impl_->cache->automaton.initial_state();
}
GrammarMatcher::~GrammarMatcher() = default;
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher&&) noexcept = default;

GrammarMatcher GrammarMatcher::fork() const {
  GrammarMatcher m;
  m.impl_ = std::make_unique<Impl>();
  m.impl_->cache = impl_->cache;
  m.impl_->state = impl_->state;
  m.impl_->ended = impl_->ended;
  m.impl_->status = impl_->status;
  return m;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  Impl& m = *impl_;
  if (m.ended) return false;
  std::lock_guard<std::mutex> lock(m.cache->mu);
  m.cache->automaton.begin_call(m.cache->limits.max_step_work);
  uint32_t s = m.state;
  for (char c : bytes) {
    const int32_t next = m.cache->automaton.step(s, static_cast<uint8_t>(c));
    if (next == grammar::Automaton::kDead) {
      m.update_status();
      return false;
    }
    s = static_cast<uint32_t>(next);
  }
  m.state = s;
  return true;
}

bool GrammarMatcher::accept_token(Token id) {
  Impl& m = *impl_;
  const TokenVocabulary& vocab = m.cache->vocab;
  if (m.ended || id < 0 || static_cast<size_t>(id) >= vocab.size()) return false;
  if (vocab.is_eos(id)) {
    if (!can_end()) return false;
    m.ended = true;
    return true;
  }
  const std::string& bytes = vocab.bytes(id);
  if (bytes.empty()) return false;  // a token no grammar allows
  return accept_bytes(bytes);
}

bool GrammarMatcher::can_end() const {
  if (impl_->ended) return false;
  std::lock_guard<std::mutex> lock(impl_->cache->mu);
  return impl_->cache->automaton.accepting(impl_->state);
}
bool GrammarMatcher::is_complete() const {
  if (impl_->ended) return false;
  std::lock_guard<std::mutex> lock(impl_->cache->mu);
  const grammar::Automaton& a = impl_->cache->automaton;
  return a.accepting(impl_->state) && !a.has_continuation(impl_->state);
}
bool GrammarMatcher::ended() const {
  return impl_->ended;
}

GrammarMatcher::Snapshot GrammarMatcher::snapshot() const {
  return Snapshot{impl_->state, impl_->ended};
}
void GrammarMatcher::rollback(Snapshot snapshot) {
  {
    std::lock_guard<std::mutex> lock(impl_->cache->mu);
    CELLM_CHECK_MSG(snapshot.state < impl_->cache->automaton.num_states(),
                    "rollback to a snapshot of another matcher");
  }
  impl_->state = snapshot.state;
  impl_->ended = snapshot.ended;
}
void GrammarMatcher::reset() {
  impl_->state = impl_->cache->automaton.initial_state();
  impl_->ended = false;
}

void GrammarMatcher::fill_next_token_mask(std::span<uint64_t> mask) {
  Impl& m = *impl_;
  CELLM_CHECK(mask.size() == m.cache->vocab.mask_words());
  std::lock_guard<std::mutex> lock(m.cache->mu);
  m.cache->automaton.begin_call(m.cache->limits.max_step_work);
  const std::vector<uint64_t>& src =
      (m.ended || m.cache->automaton.exhausted()) ? m.cache->empty_mask : m.cache->mask_of(m.state);
  m.update_status();
  std::memcpy(mask.data(), src.data(), mask.size() * sizeof(uint64_t));
}

const std::vector<uint64_t>& GrammarMatcher::next_token_mask() {
  impl_->out_mask.resize(impl_->cache->vocab.mask_words());
  fill_next_token_mask(impl_->out_mask);
  return impl_->out_mask;
}

const Status& GrammarMatcher::status() const {
  // The automaton is shared: a fork may have exhausted it since this matcher's
  // last call.
  std::lock_guard<std::mutex> lock(impl_->cache->mu);
  impl_->update_status();
  return impl_->status;
}

const TokenVocabulary& GrammarMatcher::vocabulary() const {
  return impl_->cache->vocab;
}

}  // namespace cellm
