#include "core/radix_cache.h"

#include <algorithm>
#include <cstddef>
#include <functional>
#include <queue>
#include <string>
#include <unordered_set>
#include <utility>

#include "cellm/status.h"

namespace cellm {

RadixCache::RadixCache(CellPool& pool) : pool_(pool) {}

RadixCache::~RadixCache() {
  clear();
}

std::vector<CellId> RadixCache::match(std::span<const Token> key, int64_t max_tokens,
                                      int64_t max_pin) {
  std::vector<CellId> cells;
  const size_t limit = std::min(key.size(), static_cast<size_t>(std::max<int64_t>(0, max_tokens)));
  const uint64_t now = ++clock_;
  int64_t pins = 0;
  const Node* node = &root_;
  size_t i = 0;
  while (i < limit) {
    auto it = node->children.find(key[i]);
    if (it == node->children.end()) break;
    Node* child = it->second.get();
    child->last_use = now;
    size_t j = 0;
    for (; j < child->tokens.size() && i < limit && child->tokens[j] == key[i]; ++i, ++j) {
      const CellId cell = child->cells[j];
      if (pool_.refcount(cell) == 1) {  // only the hold owns it: attaching pins it
        if (pins >= max_pin) return cells;
        ++pins;
      }
      cells.push_back(cell);
    }
    if (j < child->tokens.size()) break;
    node = child;
  }
  return cells;
}

int64_t RadixCache::insert(std::span<const Token> key, std::span<const CellId> cells) {
  CELLM_CHECK_MSG(cells.size() >= key.size(), "insert of " + std::to_string(key.size()) +
                                                  " tokens with " + std::to_string(cells.size()) +
                                                  " cells");
  const uint64_t now = ++clock_;
  Node* node = &root_;
  size_t i = 0;
  while (i < key.size()) {
    auto it = node->children.find(key[i]);
    if (it == node->children.end()) {
      auto leaf = std::make_unique<Node>();
      leaf->parent = node;
      leaf->depth = static_cast<int64_t>(i);
      leaf->last_use = now;
      for (size_t k = i; k < key.size(); ++k) {
        const CellId cell = cells[k];
        if (cell < 0 || cell >= pool_.capacity() ||
            pool_.cell_position(cell) != static_cast<Position>(k) || !pool_.hold(cell)) {
          break;
        }
        leaf->tokens.push_back(key[k]);
        leaf->cells.push_back(cell);
      }
      const auto added = static_cast<int64_t>(leaf->cells.size());
      if (added > 0) node->children.emplace(key[i], std::move(leaf));
      cached_cells_ += added;
      return added;
    }
    Node* child = it->second.get();
    child->last_use = now;
    size_t j = 0;
    while (j < child->tokens.size() && i < key.size() && child->tokens[j] == key[i]) {
      ++i;
      ++j;
    }
    if (j < child->tokens.size()) {
      if (i == key.size()) return 0;  // the key ends inside a cached run
      child = split(child, j);        // the key leaves the run: branch after j
    }
    node = child;
  }
  return 0;
}

RadixCache::Node* RadixCache::split(Node* node, size_t at) {
  CELLM_CHECK(at > 0 && at < node->tokens.size());
  Node* parent = node->parent;
  auto upper = std::make_unique<Node>();
  upper->tokens.assign(node->tokens.begin(), node->tokens.begin() + static_cast<ptrdiff_t>(at));
  upper->cells.assign(node->cells.begin(), node->cells.begin() + static_cast<ptrdiff_t>(at));
  upper->parent = parent;
  upper->depth = node->depth;
  upper->last_use = node->last_use;
  std::unique_ptr<Node>& slot = parent->children.at(node->tokens.front());
  std::unique_ptr<Node> lower = std::move(slot);
  lower->tokens.erase(lower->tokens.begin(), lower->tokens.begin() + static_cast<ptrdiff_t>(at));
  lower->cells.erase(lower->cells.begin(), lower->cells.begin() + static_cast<ptrdiff_t>(at));
  lower->depth += static_cast<int64_t>(at);
  lower->parent = upper.get();
  const Token lower_key = lower->tokens.front();
  upper->children.emplace(lower_key, std::move(lower));
  Node* raw = upper.get();
  slot = std::move(upper);
  return raw;
}

int64_t RadixCache::evict(int64_t need) {
  if (need <= 0) return 0;
  using Item = std::pair<uint64_t, Node*>;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> leaves;
  std::vector<Node*> stack{&root_};
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    if (node != &root_ && node->children.empty()) leaves.emplace(node->last_use, node);
    for (auto& [token, child] : node->children) stack.push_back(child.get());
  }
  int64_t freed = 0;
  while (freed < need && !leaves.empty()) {
    Node* leaf = leaves.top().second;
    leaves.pop();
    const Token key = leaf->tokens.front();
    // Trim the tail while the hold is the cell's last owner; a cell a sequence
    // shares stops the trim (positions below it are shared too, or still useful).
    while (freed < need && !leaf->cells.empty() && pool_.refcount(leaf->cells.back()) == 1) {
      const bool unheld = pool_.unhold(leaf->cells.back());
      CELLM_CHECK(unheld);
      leaf->cells.pop_back();
      leaf->tokens.pop_back();
      ++freed;
    }
    if (leaf->cells.empty()) {
      Node* parent = leaf->parent;
      parent->children.erase(key);  // destroys leaf
      if (parent != &root_ && parent->children.empty()) {
        leaves.emplace(parent->last_use, parent);
      }
    }
  }
  cached_cells_ -= freed;
  evicted_cells_ += freed;
  return freed;
}

void RadixCache::unhold_subtree(Node* top) {
  std::vector<Node*> stack{top};
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (CellId cell : node->cells) {
      const bool unheld = pool_.unhold(cell);
      CELLM_CHECK(unheld);
    }
    for (auto& [token, child] : node->children) stack.push_back(child.get());
  }
}

void RadixCache::clear() {
  unhold_subtree(&root_);
  root_.children.clear();
  cached_cells_ = 0;
}

void RadixCache::check_invariants() const {
  CELLM_CHECK(root_.tokens.empty() && root_.cells.empty() && root_.parent == nullptr);
  std::unordered_set<CellId> seen;
  std::vector<const Node*> stack{&root_};
  while (!stack.empty()) {
    const Node* node = stack.back();
    stack.pop_back();
    const int64_t child_depth = node->depth + static_cast<int64_t>(node->tokens.size());
    for (const auto& [token, child] : node->children) {
      CELLM_CHECK(child != nullptr);
      CELLM_CHECK_MSG(!child->tokens.empty(), "an empty node");
      CELLM_CHECK(child->tokens.size() == child->cells.size());
      CELLM_CHECK_MSG(child->tokens.front() == token, "a child under another token's key");
      CELLM_CHECK(child->parent == node);
      CELLM_CHECK_MSG(child->depth == child_depth, "node at depth " + std::to_string(child->depth) +
                                                       " under a run ending at " +
                                                       std::to_string(child_depth));
      for (size_t i = 0; i < child->cells.size(); ++i) {
        const CellId cell = child->cells[i];
        CELLM_CHECK(cell >= 0 && cell < pool_.capacity());
        CELLM_CHECK_MSG(pool_.held(cell), "cached cell " + std::to_string(cell) + " is not held");
        CELLM_CHECK_MSG(pool_.cell_position(cell) == child->depth + static_cast<int64_t>(i),
                        "cached cell " + std::to_string(cell) + " holds another position");
        CELLM_CHECK_MSG(seen.insert(cell).second,
                        "cell " + std::to_string(cell) + " sits in two places");
      }
      stack.push_back(child.get());
    }
  }
  CELLM_CHECK(static_cast<int64_t>(seen.size()) == cached_cells_);
  CELLM_CHECK_MSG(pool_.held_cells() == cached_cells_,
                  "the pool holds " + std::to_string(pool_.held_cells()) + " cells, the cache " +
                      std::to_string(cached_cells_));
}

}  // namespace cellm
