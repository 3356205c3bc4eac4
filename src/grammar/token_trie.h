// The vocabulary as a byte trie, for computing token masks: walking it through
// the automaton shares the work of every common prefix.
//
// Nodes are numbered in pre-order; node 0 is the empty prefix. Tokens are listed
// in the same order (sorted by bytes), so the tokens of a subtree are one range
// of `sorted_tokens`: [tok_begin, tok_end), of which [tok_begin, own_end) end at
// the node itself. Nodes with big subtrees also carry the set of bytes below them
// (`below`), which lets a walk accept a whole subtree at once when the automaton
// loops on every one of those bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cellm/grammar.h"
#include "grammar/grammar_ir.h"

namespace cellm {

struct TokenVocabulary::Impl {
  struct Node {
    uint32_t end = 0;        // one past the last node of this subtree
    uint32_t tok_begin = 0;  // the subtree's tokens in sorted_tokens
    uint32_t own_end = 0;
    uint32_t tok_end = 0;
    int32_t below = -1;  // index into below_sets, or -1 (small subtree)
    uint8_t byte = 0;    // the byte from the parent
  };

  std::vector<std::string> token_bytes;  // [id]
  std::vector<Token> eos_ids;
  std::vector<char> eos_flag;  // [id]
  std::vector<Node> nodes;
  std::vector<Token> sorted_tokens;
  std::vector<grammar::ByteSet> below_sets;
};

}  // namespace cellm
