// grammar_walk: random walks through a grammar over a real vocabulary, for the
// pytest suite (test_schema_walks.py) to validate with Python's jsonschema / re.
//
//   grammar_walk --tokenizer DIR --kind schema|json_object|regex|choice|gbnf
//                [--spec FILE] [--seed S] [--walks N] [--max-tokens M]
//
// --spec: the schema, pattern or GBNF text; for choice, a JSON array of strings.
// Each walk starts at the grammar's start and, every step, draws uniformly among
// the tokens the mask allows (EOS included where the match may end), accepting
// the drawn token, until EOS or M tokens. Prints one JSON line per walk:
// {"seed": s, "complete": bool, "tokens": n, "hex": "<bytes in hex>"}.
// Exits 1 with a message on stderr when a spec fails to compile or the matcher
// rejects a token its own mask allowed.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cellm/grammar.h"
#include "grammar/vocab_loader.h"

namespace {

cellm::Result<cellm::Grammar> compile(const std::string& kind, const std::string& spec) {
  if (kind == "schema") return cellm::compile_json_schema(spec);
  if (kind == "json_object") return cellm::compile_json_object();
  if (kind == "regex") return cellm::compile_regex(spec);
  if (kind == "gbnf") return cellm::compile_gbnf(spec);
  if (kind == "choice") {
    const auto list = nlohmann::json::parse(spec, nullptr, false);
    if (!list.is_array()) return cellm::InvalidArgument("choice spec must be a JSON array");
    std::vector<std::string> choices;
    for (const auto& c : list) choices.push_back(c.get<std::string>());
    return cellm::compile_choice(choices);
  }
  return cellm::InvalidArgument("unknown kind " + kind);
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer, kind, spec_file;
  uint64_t seed = 0;
  int walks = 1, max_tokens = 512;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--tokenizer") {
      tokenizer = value;
    } else if (key == "--kind") {
      kind = value;
    } else if (key == "--spec") {
      spec_file = value;
    } else if (key == "--seed") {
      seed = std::stoull(value);
    } else if (key == "--walks") {
      walks = std::stoi(value);
    } else if (key == "--max-tokens") {
      max_tokens = std::stoi(value);
    } else {
      std::cerr << "unknown argument " << key << "\n";
      return 2;
    }
  }
  std::string spec;
  if (!spec_file.empty()) {
    std::ifstream in(spec_file);
    std::stringstream ss;
    ss << in.rdbuf();
    spec = ss.str();
  }
  auto vocab = cellm::grammar_test::load_vocabulary(tokenizer);
  if (!vocab.ok()) {
    std::cerr << vocab.status().to_string() << "\n";
    return 1;
  }
  auto grammar = compile(kind, spec);
  if (!grammar.ok()) {
    std::cerr << grammar.status().to_string() << "\n";
    return 1;
  }
  cellm::GrammarMatcher matcher(*grammar, *vocab);
  for (int w = 0; w < walks; ++w) {
    const uint64_t walk_seed = seed + static_cast<uint64_t>(w);
    std::mt19937_64 rng(walk_seed);
    matcher.reset();
    std::string out;
    int n = 0;
    for (; n < max_tokens && !matcher.ended(); ++n) {
      const std::vector<uint64_t>& mask = matcher.next_token_mask();
      size_t total = 0;
      for (uint64_t word : mask) total += static_cast<size_t>(__builtin_popcountll(word));
      if (total == 0) {
        std::cerr << "walk " << walk_seed << ": empty mask after " << n
                  << " tokens: " << matcher.status().to_string() << "\n";
        return 1;
      }
      // The k-th allowed token, k uniform.
      size_t k = std::uniform_int_distribution<size_t>(0, total - 1)(rng);
      size_t word = 0;
      for (;; ++word) {
        const auto c = static_cast<size_t>(__builtin_popcountll(mask[word]));
        if (k < c) break;
        k -= c;
      }
      uint64_t bits = mask[word];
      for (; k > 0; --k) bits &= bits - 1;
      const auto t = static_cast<cellm::Token>(word * 64 + __builtin_ctzll(bits));
      if (!matcher.accept_token(t)) {
        std::cerr << "walk " << walk_seed << ": the matcher rejected token " << t
                  << " that its mask allowed\n";
        return 1;
      }
      if (!vocab->is_eos(t)) out += vocab->bytes(t);
    }
    std::string hex;
    static const char* digits = "0123456789abcdef";
    for (unsigned char c : out) hex += digits[c >> 4], hex += digits[c & 15];
    std::printf("{\"seed\": %llu, \"complete\": %s, \"tokens\": %d, \"hex\": \"%s\"}\n",
                static_cast<unsigned long long>(walk_seed), matcher.ended() ? "true" : "false", n,
                hex.c_str());
  }
  return 0;
}
