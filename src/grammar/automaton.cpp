#include "grammar/automaton.h"

#include <algorithm>

namespace cellm::grammar {

namespace {
// Marks an accepting state in its interning key (no node has this id).
constexpr uint32_t kAcceptKey = 0xFFFFFFFFu;
constexpr uint32_t kEscapeKey = 0xFFFFFFFEu;
// The position of hole nodes: past every real position.
constexpr uint32_t kHolePos = 0xFFFFFFFFu;
}  // namespace

size_t Automaton::VecHash::operator()(const std::vector<uint32_t>& v) const {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ v.size();
  for (uint32_t x : v) {
    h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xFF51AFD7ED558CCDull;
  }
  return static_cast<size_t>(h ^ (h >> 33));
}

Automaton::Automaton(std::shared_ptr<const Grammar::Impl> grammar, int max_depth, size_t max_bytes)
    : grammar_(std::move(grammar)),
      positions_(grammar_->positions),
      max_depth_(static_cast<uint32_t>(std::max(1, max_depth))),
      max_bytes_(max_bytes),
      visit_limit_(UINT64_MAX) {
  nodes_.push_back(Node{0, kBottom, 0});  // kBottom
  scratch_.clear();
  scratch_accepting_ = false;
  scratch_escaped_ = false;
  ++visit_stamp_;
  for (uint32_t start : positions_.rule_starts[grammar_->ir.root]) {
    uint32_t id;
    if (node(start, kBottom, &id)) closure(id);
  }
  const int32_t s = intern();
  if (s == kDead) {
    // Only possible when the depth limit cuts every stack: a state that accepts
    // nothing keeps the matcher well-defined.
    states_.push_back(State{});
    initial_ = static_cast<uint32_t>(states_.size() - 1);
  } else {
    initial_ = static_cast<uint32_t>(s);
  }
}

bool Automaton::node(uint32_t pos, uint32_t parent, uint32_t* id) {
  const uint64_t key = (uint64_t{pos} << 32) | parent;
  auto it = node_index_.find(key);
  if (it != node_index_.end()) {
    *id = it->second;
    return true;
  }
  const uint32_t depth = nodes_[parent].depth + 1;
  if (depth > max_depth_) return false;
  if ((nodes_.size() + 1) * kNodeBytes + state_bytes_ > max_bytes_) {
    reason_ = Exhaustion::kMemory;  // checked here too: one closure can make many nodes
    return false;
  }
  *id = static_cast<uint32_t>(nodes_.size());
  nodes_.push_back(Node{pos, parent, depth});
  node_index_.emplace(key, *id);
  return true;
}

void Automaton::closure(uint32_t id) {
  work_.clear();
  work_.push_back(id);
  while (!work_.empty()) {
    if (exhausted() || ++visits_ > visit_limit_) {
      if (!exhausted()) reason_ = Exhaustion::kWork;
      work_.clear();  // the caller sees exhausted() and drops scratch_
      return;
    }
    const uint32_t n = work_.back();
    work_.pop_back();
    if (visit_mark_.size() < nodes_.size()) visit_mark_.resize(nodes_.size() * 2, 0);
    if (visit_mark_[n] == visit_stamp_) continue;
    visit_mark_[n] = visit_stamp_;
    const Node nd = nodes_[n];
    const int32_t sym = positions_.symbol[nd.pos];
    if (sym >= 0) {
      scratch_.push_back(n);
    } else if (sym == PositionTable::kEnd) {
      if (nd.parent == kBottom) {
        scratch_accepting_ = true;
      } else if (nodes_[nd.parent].pos == kHolePos) {
        scratch_escaped_ = true;
      } else {
        work_.push_back(nd.parent);  // the parent node sits at the return position
      }
    } else {
      const uint32_t ret = nd.pos + 1;
      uint32_t frame = nd.parent;  // tail call: return straight to our caller
      if (positions_.symbol[ret] != PositionTable::kEnd && !node(ret, nd.parent, &frame)) {
        continue;  // too deep
      }
      for (uint32_t start : positions_.rule_starts[PositionTable::rule_of(sym)]) {
        uint32_t child;
        // A new frame has depth(frame) + 1; a tail call reuses the caller's depth.
        if (node(start, frame, &child)) work_.push_back(child);
      }
    }
  }
}

int32_t Automaton::intern() {
  std::sort(scratch_.begin(), scratch_.end());
  scratch_.erase(std::unique(scratch_.begin(), scratch_.end()), scratch_.end());
  if (scratch_.empty() && !scratch_accepting_ && !scratch_escaped_) return kDead;
  std::vector<uint32_t> key = scratch_;
  if (scratch_accepting_) key.push_back(kAcceptKey);
  if (scratch_escaped_) key.push_back(kEscapeKey);
  auto it = state_index_.find(key);
  if (it != state_index_.end()) return static_cast<int32_t>(it->second);
  const auto id = static_cast<uint32_t>(states_.size());
  State st;
  st.stacks = scratch_;
  st.accepting = scratch_accepting_;
  st.escaped = scratch_escaped_;
  state_bytes_ += 2 * (key.size() * sizeof(uint32_t)) + sizeof(State) + 64;
  states_.push_back(std::move(st));
  state_index_.emplace(std::move(key), id);
  return static_cast<int32_t>(id);
}

int32_t Automaton::step_slow(uint32_t state, uint8_t b) {
  if (exhausted()) return kDead;
  scratch_.clear();
  scratch_accepting_ = false;
  scratch_escaped_ = false;
  ++visit_stamp_;
  // Copy: closure() may grow states_ only through intern(), but nodes_ grows here.
  const std::vector<uint32_t>& stacks = states_[state].stacks;
  visits_ += stacks.size();
  for (size_t i = 0; i < stacks.size() && !exhausted(); ++i) {
    const Node nd = nodes_[stacks[i]];
    const int32_t sym = positions_.symbol[nd.pos];
    if (!grammar_->ir.sets[static_cast<uint32_t>(sym)].test(b)) continue;
    uint32_t next;
    if (node(nd.pos + 1, nd.parent, &next)) closure(next);
  }
  if (exhausted()) return kDead;
  const int32_t result = intern();
  if (states_[state].table < 0) {
    states_[state].table = static_cast<int32_t>(tables_.size());
    tables_.emplace_back();
    tables_.back().fill(kUnknown);
  }
  tables_[states_[state].table][b] = result;
  enforce_budget();
  return result;
}

uint32_t Automaton::hole(uint32_t depth) {
  auto it = holes_.find(depth);
  if (it != holes_.end()) return it->second;
  const auto id = static_cast<uint32_t>(nodes_.size());
  nodes_.push_back(Node{kHolePos, kBottom, depth});
  holes_.emplace(depth, id);
  return id;
}

uint32_t Automaton::project(uint32_t state) {
  if (states_[state].projection >= 0) return static_cast<uint32_t>(states_[state].projection);
  uint32_t min_depth = UINT32_MAX;
  for (uint32_t n : states_[state].stacks) min_depth = std::min(min_depth, nodes_[n].depth);
  uint32_t result = state;
  if (!states_[state].stacks.empty() && min_depth > 1 && !exhausted()) {
    const uint32_t cut = min_depth - 1;  // nodes at or below this depth are cut
    const uint32_t h = hole(cut);
    std::vector<uint32_t> projected, chain;
    for (uint32_t top : states_[state].stacks) {
      chain.clear();
      for (uint32_t n = top; nodes_[n].depth > cut; n = nodes_[n].parent) chain.push_back(n);
      uint32_t cur = h;
      for (size_t i = chain.size(); i-- > 0;) {
        uint32_t id;
        // Same depth as the original: only the memory budget can refuse it.
        if (!node(nodes_[chain[i]].pos, cur, &id)) return state;
        cur = id;
      }
      projected.push_back(cur);
    }
    scratch_ = std::move(projected);
    scratch_accepting_ = false;
    scratch_escaped_ = false;
    const int32_t p = intern();
    CELLM_CHECK(p != kDead);
    result = static_cast<uint32_t>(p);
    enforce_budget();
  }
  states_[state].projection = static_cast<int32_t>(result);
  return result;
}

const ByteSet& Automaton::self_loop(uint32_t state) {
  if (states_[state].loop < 0) {
    ByteSet loop;
    for (int b = 0; b < 256; ++b) {
      if (step(state, static_cast<uint8_t>(b)) == static_cast<int32_t>(state)) {
        loop.set(static_cast<uint8_t>(b));
      }
    }
    states_[state].loop = static_cast<int32_t>(loops_.size());
    loops_.push_back(loop);
  }
  return loops_[states_[state].loop];
}

size_t Automaton::memory_bytes() const {
  return nodes_.size() * kNodeBytes + state_bytes_ + tables_.size() * sizeof(tables_[0]) +
         loops_.size() * sizeof(ByteSet) + visit_mark_.size() * sizeof(uint32_t);
}

void Automaton::enforce_budget() {
  if (memory_bytes() <= max_bytes_) return;
  // Derived data first: tables and self-loop sets are rebuilt on demand.
  for (State& s : states_) s.table = -1, s.loop = -1;
  tables_.clear();
  tables_.shrink_to_fit();
  loops_.clear();
  loops_.shrink_to_fit();
  if (memory_bytes() > max_bytes_ / 4 * 3) reason_ = Exhaustion::kMemory;
}

}  // namespace cellm::grammar
