// IrBuilder, the UTF-8 spelling of code point classes, grammar validation and
// the GBNF dump.
#include "grammar/grammar_ir.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>

namespace cellm::grammar {

namespace {

// Largest code point encoded in n UTF-8 bytes.
constexpr uint32_t kMaxOfLength[5] = {0, 0x7F, 0x7FF, 0xFFFF, 0x10FFFF};

int utf8_length(uint32_t cp) {
  return cp <= 0x7F ? 1 : cp <= 0x7FF ? 2 : cp <= 0xFFFF ? 3 : 4;
}

// Byte i of the n-byte encoding of cp.
uint8_t utf8_byte(uint32_t cp, int n, int i) {
  std::string s;
  append_utf8(s, cp);
  (void)n;
  return static_cast<uint8_t>(s[i]);
}

// Emits [lo, hi] (same encoded length n) as sequences of byte ranges: split the
// range until every byte position past a common prefix spans a whole range.
void split_same_length(uint32_t lo, uint32_t hi, int n,
                       std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;  // the low i continuation bytes
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        split_same_length(lo, lo | m, n, out);
        split_same_length((lo | m) + 1, hi, n, out);
        return;
      }
      if ((hi & m) != m) {
        split_same_length(lo, (hi & ~m) - 1, n, out);
        split_same_length(hi & ~m, hi, n, out);
        return;
      }
    }
  }
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int i = 0; i < n; ++i) seq.emplace_back(utf8_byte(lo, n, i), utf8_byte(hi, n, i));
  out.push_back(std::move(seq));
}

std::string escape_byte_for_gbnf(uint8_t b) {
  if (b >= 0x21 && b < 0x7F && b != '\\' && b != ']' && b != '-' && b != '^' && b != '"') {
    return std::string(1, static_cast<char>(b));
  }
  char buf[8];
  std::snprintf(buf, sizeof(buf), "\\x%02X", b);
  return buf;
}

}  // namespace

void append_utf8(std::string& out, uint32_t cp) {
  if (cp <= 0x7F) {
    out += static_cast<char>(cp);
  } else if (cp <= 0x7FF) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp <= 0xFFFF) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool decode_utf8(std::string_view text, size_t* pos, uint32_t* cp) {
  size_t i = *pos;
  if (i >= text.size()) return false;
  const auto b0 = static_cast<uint8_t>(text[i]);
  int n = 0;
  uint32_t v = 0;
  if (b0 < 0x80) {
    n = 1, v = b0;
  } else if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2, v = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3, v = b0 & 0x0F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4, v = b0 & 0x07;
  } else {
    return false;
  }
  if (i + n > text.size()) return false;
  for (int k = 1; k < n; ++k) {
    const auto b = static_cast<uint8_t>(text[i + k]);
    if ((b & 0xC0) != 0x80) return false;
    v = (v << 6) | (b & 0x3F);
  }
  if (utf8_length(v) != n || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return false;
  *cp = v;
  *pos = i + n;
  return true;
}

uint32_t IrBuilder::add_rule(std::string_view name) {
  std::string base(name.empty() ? "rule" : name);
  std::string unique = base;
  const int uses = name_uses_[base]++;
  if (uses > 0) unique += "-" + std::to_string(uses);
  ir_.rules.push_back(Rule{std::move(unique), {}});
  return static_cast<uint32_t>(ir_.rules.size() - 1);
}

void IrBuilder::add_alternative(uint32_t rule, Sequence sequence) {
  num_symbols_ += sequence.size() + 1;
  if (num_symbols_ > limits_.max_symbols) {
    fail(OutOfResources("the grammar is too large: more than " +
                        std::to_string(limits_.max_symbols) +
                        " symbols after expanding repetitions"));
    return;
  }
  ir_.rules[rule].alternatives.push_back(std::move(sequence));
}

Symbol IrBuilder::rule_of(std::string_view name, std::vector<Sequence> alternatives) {
  const uint32_t r = add_rule(name);
  for (auto& alt : alternatives) add_alternative(r, std::move(alt));
  return Symbol{true, r};
}

Symbol IrBuilder::bytes(const ByteSet& set) {
  auto [it, inserted] = set_index_.emplace(set, static_cast<uint32_t>(ir_.sets.size()));
  if (inserted) ir_.sets.push_back(set);
  return Symbol{false, it->second};
}

Symbol IrBuilder::byte(uint8_t b) {
  ByteSet s;
  s.set(b);
  return bytes(s);
}

Sequence IrBuilder::literal(std::string_view text) {
  Sequence seq;
  seq.reserve(text.size());
  for (char c : text) seq.push_back(byte(static_cast<uint8_t>(c)));
  return seq;
}

Symbol IrBuilder::literal_choice(std::vector<std::string> words, std::string_view name) {
  std::sort(words.begin(), words.end());
  words.erase(std::unique(words.begin(), words.end()), words.end());
  // Each job fills one trie rule: the words [lo, hi), which share their first
  // `depth` bytes. Sorted words put one that ends at `depth` first and group the
  // rest by their next byte. (A work list, not recursion: a chain of nested
  // words would otherwise be as deep as the list is long.)
  struct Job {
    size_t lo, hi, depth;
    uint32_t rule;
  };
  const uint32_t root = add_rule(name);
  std::vector<Job> jobs = {{0, words.size(), 0, root}};
  while (!jobs.empty() && !failed()) {
    const Job job = jobs.back();
    jobs.pop_back();
    size_t i = job.lo;
    if (words[i].size() == job.depth) add_alternative(job.rule, {}), ++i;
    while (i < job.hi) {
      const char next = words[i][job.depth];
      size_t j = i + 1;
      while (j < job.hi && words[j][job.depth] == next) ++j;
      // The group's common bytes, up to where one of them ends or they part.
      size_t end = job.depth + 1;
      for (;; ++end) {
        bool shared = true;
        for (size_t k = i; k < j && shared; ++k) {
          shared = words[k].size() > end && words[k][end] == words[i][end];
        }
        if (!shared) break;
      }
      Sequence seq = literal(std::string_view(words[i]).substr(job.depth, end - job.depth));
      if (j - i > 1 || words[i].size() > end) {
        const uint32_t sub = add_rule(name);
        seq.push_back(Symbol{true, sub});
        jobs.push_back(Job{i, j, end, sub});
      }
      add_alternative(job.rule, std::move(seq));
      i = j;
    }
  }
  return Symbol{true, root};
}

Symbol IrBuilder::codepoints(std::vector<CodepointRange> ranges, std::string_view name) {
  // Normalize: clamp, drop surrogates, sort, merge.
  std::vector<CodepointRange> parts;
  for (auto [lo, hi] : ranges) {
    hi = std::min<uint32_t>(hi, 0x10FFFF);
    if (lo > hi) continue;
    if (lo < 0xD800 && hi >= 0xD800) {
      parts.emplace_back(lo, 0xD7FF);
      if (hi > 0xDFFF) parts.emplace_back(0xE000, hi);
    } else if (lo >= 0xD800 && lo <= 0xDFFF) {
      if (hi > 0xDFFF) parts.emplace_back(0xE000, hi);
    } else {
      parts.emplace_back(lo, hi);
    }
  }
  std::sort(parts.begin(), parts.end());
  std::vector<CodepointRange> merged;
  for (auto r : parts) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  if (merged.empty()) {
    fail(InvalidArgument("a character class matches no character"));
    return byte(0);
  }
  // Byte-range sequences per encoded length; one-byte ranges join one class.
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
  ByteSet ascii;
  for (auto [lo, hi] : merged) {
    for (int n = 1; n <= 4; ++n) {
      const uint32_t len_lo = n == 1 ? 0 : kMaxOfLength[n - 1] + 1;
      const uint32_t a = std::max(lo, len_lo), b = std::min(hi, kMaxOfLength[n]);
      if (a > b) continue;
      if (n == 1) {
        ascii.set_range(static_cast<uint8_t>(a), static_cast<uint8_t>(b));
      } else {
        split_same_length(a, b, n, seqs);
      }
    }
  }
  std::vector<Sequence> alts;
  if (!ascii.empty()) alts.push_back({bytes(ascii)});
  for (const auto& seq : seqs) {
    Sequence s;
    for (auto [lo, hi] : seq) {
      ByteSet set;
      set.set_range(lo, hi);
      s.push_back(bytes(set));
    }
    alts.push_back(std::move(s));
  }
  if (alts.size() == 1 && alts[0].size() == 1) return alts[0][0];
  return rule_of(name, std::move(alts));
}

Symbol IrBuilder::optional(const Sequence& body, std::string_view name) {
  return rule_of(name, {body, {}});
}

Symbol IrBuilder::repeat(const Sequence& body, int min, int max, std::string_view name) {
  if (min < 0 || (max >= 0 && max < min)) {
    fail(InvalidArgument("a repetition {" + std::to_string(min) + "," + std::to_string(max) +
                         "} has its bounds out of order"));
    return rule_of(name, {{}});
  }
  if (min > limits_.max_repetition || max > limits_.max_repetition) {
    fail(OutOfResources("a repetition bound exceeds " + std::to_string(limits_.max_repetition)));
    return rule_of(name, {{}});
  }
  const uint32_t r = add_rule(name);
  Sequence seq;
  for (int i = 0; i < min && !failed(); ++i) seq.insert(seq.end(), body.begin(), body.end());
  if (max < 0) {
    // tail ::= body tail | ε: the recursive call is in tail position, so the
    // matcher's stack does not grow with the count.
    const uint32_t tail = add_rule(std::string(name) + "-rest");
    Sequence loop = body;
    loop.push_back(Symbol{true, tail});
    add_alternative(tail, std::move(loop));
    add_alternative(tail, {});
    seq.push_back(Symbol{true, tail});
  } else if (max > min) {
    // opt_k ::= body opt_{k-1} | ε, nested (max - min) deep.
    Symbol next{};
    bool have_next = false;
    for (int k = 0; k < max - min && !failed(); ++k) {
      Sequence alt = body;
      if (have_next) alt.push_back(next);
      next = rule_of(std::string(name) + "-opt", {alt, {}});
      have_next = true;
    }
    if (have_next) seq.push_back(next);
  }
  add_alternative(r, std::move(seq));
  return Symbol{true, r};
}

void IrBuilder::fail(Status status) {
  if (error_.ok()) error_ = std::move(status);
}

Result<GrammarIr> IrBuilder::finish(uint32_t root) {
  if (failed()) return error_;
  ir_.root = root;
  CELLM_RETURN_IF_ERROR(validate_grammar(ir_));
  return std::move(ir_);
}

Status validate_grammar(const GrammarIr& ir) {
  const size_t n = ir.rules.size();
  if (ir.root >= n) return InvalidArgument("the grammar has no root rule");
  for (const Rule& rule : ir.rules) {
    for (const Sequence& alt : rule.alternatives) {
      for (const Symbol& s : alt) {
        if ((s.is_rule && s.index >= n) || (!s.is_rule && s.index >= ir.sets.size())) {
          return Internal("rule " + rule.name + " refers to a symbol out of range");
        }
      }
    }
  }
  // Rules reachable from the root.
  std::vector<char> reachable(n, 0);
  std::vector<uint32_t> work{ir.root};
  reachable[ir.root] = 1;
  while (!work.empty()) {
    const uint32_t r = work.back();
    work.pop_back();
    for (const Sequence& alt : ir.rules[r].alternatives) {
      for (const Symbol& s : alt) {
        if (s.is_rule && !reachable[s.index]) reachable[s.index] = 1, work.push_back(s.index);
      }
    }
  }
  // Nullable and productive rules, by fixpoint.
  std::vector<char> nullable(n, 0), productive(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      for (const Sequence& alt : ir.rules[r].alternatives) {
        bool all_nullable = true, all_productive = true;
        for (const Symbol& s : alt) {
          all_nullable = all_nullable && s.is_rule && nullable[s.index];
          all_productive = all_productive && (!s.is_rule || productive[s.index]);
        }
        if (all_nullable && !nullable[r]) nullable[r] = 1, changed = true;
        if (all_productive && !productive[r]) productive[r] = 1, changed = true;
      }
    }
  }
  for (size_t r = 0; r < n; ++r) {
    if (!reachable[r]) continue;
    if (ir.rules[r].alternatives.empty()) {
      return InvalidArgument("rule " + ir.rules[r].name + " has no alternative");
    }
    if (!productive[r]) {
      return InvalidArgument("rule " + ir.rules[r].name +
                             " can never finish: every alternative recurses forever");
    }
  }
  // Left calls: rule r reaches rule s before consuming a byte. A cycle of such
  // calls is fine when every call in it is a tail call (the matcher reuses the
  // caller's frame and meets the same stack again); any other cycle would grow
  // the stack forever.
  struct Edge {
    uint32_t to;
    bool tail;
  };
  std::vector<std::vector<Edge>> edges(n);
  for (size_t r = 0; r < n; ++r) {
    if (!reachable[r]) continue;
    for (const Sequence& alt : ir.rules[r].alternatives) {
      for (size_t i = 0; i < alt.size(); ++i) {
        if (!alt[i].is_rule) break;
        edges[r].push_back(Edge{alt[i].index, i + 1 == alt.size()});
        if (!nullable[alt[i].index]) break;
      }
    }
  }
  // Tarjan's strongly connected components, iteratively.
  std::vector<int> index(n, -1), low(n, 0), comp(n, -1);
  std::vector<char> on_stack(n, 0);
  std::vector<uint32_t> stack;
  int counter = 0, num_comps = 0;
  for (uint32_t start = 0; start < n; ++start) {
    if (!reachable[start] || index[start] >= 0) continue;
    std::vector<std::pair<uint32_t, size_t>> call{{start, 0}};
    index[start] = low[start] = counter++;
    stack.push_back(start), on_stack[start] = 1;
    while (!call.empty()) {
      auto& [v, next] = call.back();
      if (next < edges[v].size()) {
        const uint32_t w = edges[v][next++].to;
        if (index[w] < 0) {
          index[w] = low[w] = counter++;
          stack.push_back(w), on_stack[w] = 1;
          call.emplace_back(w, 0);
        } else if (on_stack[w]) {
          low[v] = std::min(low[v], index[w]);
        }
        continue;
      }
      if (low[v] == index[v]) {
        uint32_t w;
        do {
          w = stack.back();
          stack.pop_back(), on_stack[w] = 0;
          comp[w] = num_comps;
        } while (w != v);
        ++num_comps;
      }
      const uint32_t done = v;
      call.pop_back();
      if (!call.empty()) low[call.back().first] = std::min(low[call.back().first], low[done]);
    }
  }
  for (size_t r = 0; r < n; ++r) {
    for (const Edge& e : edges[r]) {
      if (!e.tail && comp[e.to] == comp[r]) {
        return InvalidArgument("rule " + ir.rules[r].name +
                               " is left-recursive (it reaches itself through " +
                               ir.rules[e.to].name + " before matching a character)");
      }
    }
  }
  return Status::Ok();
}

std::string to_gbnf(const GrammarIr& ir) {
  std::string out;
  auto set_text = [&](const ByteSet& set) {
    std::string s = "[";
    for (int b = 0; b < 256;) {
      if (!set.test(static_cast<uint8_t>(b))) {
        ++b;
        continue;
      }
      int e = b;
      while (e + 1 < 256 && set.test(static_cast<uint8_t>(e + 1))) ++e;
      s += escape_byte_for_gbnf(static_cast<uint8_t>(b));
      if (e > b) s += "-" + escape_byte_for_gbnf(static_cast<uint8_t>(e));
      b = e + 1;
    }
    return s + "]";
  };
  for (size_t r = 0; r < ir.rules.size(); ++r) {
    out += (r == ir.root ? "root" : ir.rules[r].name) + " ::=";
    const auto& alts = ir.rules[r].alternatives;
    for (size_t a = 0; a < alts.size(); ++a) {
      if (a > 0) out += " |";
      if (alts[a].empty()) out += " \"\"";
      for (const Symbol& s : alts[a]) {
        out += " ";
        if (s.is_rule) {
          out += s.index == ir.root ? "root" : ir.rules[s.index].name;
        } else {
          out += set_text(ir.sets[s.index]);
        }
      }
    }
    out += "\n";
  }
  return out;
}

}  // namespace cellm::grammar

namespace cellm::grammar {

PositionTable PositionTable::build(const GrammarIr& ir) {
  PositionTable t;
  t.rule_starts.resize(ir.rules.size());
  for (size_t r = 0; r < ir.rules.size(); ++r) {
    for (const Sequence& alt : ir.rules[r].alternatives) {
      t.rule_starts[r].push_back(static_cast<uint32_t>(t.symbol.size()));
      for (const Symbol& s : alt) {
        t.symbol.push_back(s.is_rule ? -static_cast<int32_t>(s.index) - 2
                                     : static_cast<int32_t>(s.index));
      }
      t.symbol.push_back(kEnd);
    }
  }
  return t;
}

Grammar make_grammar(GrammarIr ir) {
  auto impl = std::make_shared<Grammar::Impl>();
  impl->positions = PositionTable::build(ir);
  impl->ir = std::move(ir);
  return Grammar(std::move(impl));
}

}  // namespace cellm::grammar

namespace cellm {

size_t Grammar::num_rules() const {
  return impl_->ir.rules.size();
}
std::string Grammar::to_gbnf() const {
  return grammar::to_gbnf(impl_->ir);
}

}  // namespace cellm
