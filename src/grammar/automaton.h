// The pushdown automaton of a grammar, determinized lazily.
//
// A stack is a list of positions (grammar_ir.h, PositionTable): the top is the
// dot in the innermost rule, each frame below the position to return to. Stacks
// are hash-consed nodes (position, parent), so equal stacks are one node id. A
// state is the set of stacks whose top waits for a byte (after following rule
// calls and returns, the closure), plus whether the whole input may end here;
// states are interned, so a state is a small integer and equal states share their
// transition table (256 entries, filled on demand) and, above this class, their
// token mask.
//
// A call whose return position ends its alternative is a tail call: it pushes no
// frame, so right recursion (repetition) keeps the stack flat. The grammar was
// validated (grammar_ir.h): no left-recursive cycle through a non-tail call, so
// every closure terminates. Stacks deeper than max_depth frames are dropped (the
// byte that would open them is rejected).
//
// Projection (for sharing masks across contexts): project(s) cuts every stack of
// s below the depth of its shallowest top, replacing what was cut by a hole node.
// Stepping a projected state behaves as stepping s until some stack pops into
// the hole; the resulting state is then marked escaped() and the rest of the
// token depends on the context that was cut. Two states that differ only below
// the cut (a string value of one property or another) share one projection.
//
// Memory: transition tables are dropped when the budget is exceeded (they are
// rebuilt on demand); states and stacks are kept (snapshots refer to them). When
// states and stacks alone hold 3/4 of the budget, exhausted() is set and every
// step is dead (rebuilding tables at the edge of the budget would make every
// step slow).
// Work: building states costs one unit per stack visited. begin_call(budget)
// opens a call's allowance; spending past it sets exhausted() too (reason()
// says which limit was hit).
// Not thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "grammar/grammar_ir.h"

namespace cellm::grammar {

class Automaton {
 public:
  static constexpr int32_t kDead = -1;

  Automaton(std::shared_ptr<const Grammar::Impl> grammar, int max_depth, size_t max_bytes);

  uint32_t initial_state() const { return initial_; }
  // The state after `b`, or kDead.
  int32_t step(uint32_t state, uint8_t b) {
    const int32_t t = states_[state].table;
    if (t >= 0) {
      const int32_t next = tables_[t][b];
      if (next != kUnknown) return next;
    }
    return step_slow(state, b);
  }
  // The input so far is a sentence of the grammar.
  bool accepting(uint32_t state) const { return states_[state].accepting; }
  // Some byte may follow (some stack waits for a byte).
  bool has_continuation(uint32_t state) const { return !states_[state].stacks.empty(); }
  // The bytes b with step(state, b) == state.
  const ByteSet& self_loop(uint32_t state);
  // Some stack popped into a hole (only states reached from a projection).
  bool escaped(uint32_t state) const { return states_[state].escaped; }
  // The projection of `state` (see above); `state` itself when nothing is cut.
  uint32_t project(uint32_t state);

  enum class Exhaustion { kNone, kMemory, kWork };
  bool exhausted() const { return reason_ != Exhaustion::kNone; }
  Exhaustion reason() const { return reason_; }
  // Opens the work allowance of one matcher call.
  void begin_call(uint64_t budget) { visit_limit_ = visits_ + budget; }
  size_t num_states() const { return states_.size(); }
  size_t memory_bytes() const;

 private:
  static constexpr int32_t kUnknown = -2;
  static constexpr uint32_t kBottom = 0;  // the node below every stack

  struct Node {
    uint32_t pos;
    uint32_t parent;
    uint32_t depth;  // frames in this stack
  };
  // A node and its index entry, as counted against the memory budget.
  static constexpr size_t kNodeBytes = sizeof(Node) + 32;
  struct State {
    std::vector<uint32_t> stacks;  // sorted node ids whose top is at a byte class
    bool accepting = false;
    bool escaped = false;
    int32_t projection = -1;  // project()'s result, once computed
    int32_t table = -1;       // index into tables_, or -1
    int32_t loop = -1;        // index into loops_, or -1
  };
  struct VecHash {
    size_t operator()(const std::vector<uint32_t>& v) const;
  };

  int32_t step_slow(uint32_t state, uint8_t b);
  // Node (pos, parent), or kBottom-free failure (returns false) past max depth.
  bool node(uint32_t pos, uint32_t parent, uint32_t* id);
  // Adds the closure of node `id` to scratch_ (stacks at a byte class) and
  // scratch_accepting_.
  void closure(uint32_t id);
  // The hole node standing for everything at or below depth `depth`.
  uint32_t hole(uint32_t depth);
  // Interns scratch_ as a state; kDead when empty, not accepting, not escaped.
  int32_t intern();
  void enforce_budget();

  std::shared_ptr<const Grammar::Impl> grammar_;
  const PositionTable& positions_;
  uint32_t max_depth_;
  size_t max_bytes_;

  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, uint32_t> node_index_;
  std::vector<State> states_;
  std::unordered_map<std::vector<uint32_t>, uint32_t, VecHash> state_index_;
  std::vector<std::array<int32_t, 256>> tables_;
  std::vector<ByteSet> loops_;
  size_t state_bytes_ = 0;
  uint32_t initial_ = 0;
  Exhaustion reason_ = Exhaustion::kNone;
  uint64_t visits_ = 0;       // stack visits so far
  uint64_t visit_limit_ = 0;  // where the open call's allowance ends

  // Closure scratch.
  std::vector<uint32_t> scratch_;
  bool scratch_accepting_ = false;
  bool scratch_escaped_ = false;
  std::unordered_map<uint32_t, uint32_t> holes_;  // depth -> hole node
  std::vector<uint32_t> work_;
  std::vector<uint32_t> visit_mark_;
  uint32_t visit_stamp_ = 0;
};

}  // namespace cellm::grammar
