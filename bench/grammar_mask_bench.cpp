// grammar_mask_bench: the cost of one constrained-decoding step on real
// vocabularies: the token mask (GrammarMatcher::fill_next_token_mask) and
// accepting the drawn token, along random walks through a JSON schema.
//
//   grammar_mask_bench [--shared DIR] [--walks N] [--max-tokens M] [--schema FILE]
//
// For each tokenizer in DIR/tokenizers (llama3, qwen3, llama2) it builds the
// vocabulary trie once, then runs N seeded walks (uniform draws among allowed
// tokens), twice: each walk with a fresh matcher (cold caches: "fresh"), and each
// walk on a fork of one matcher (caches shared across walks, as sessions with one
// schema share them: "forked"), and prints per-step times:
// mean, p50, p99 and max of the mask, the share of steps whose mask came from the
// cache, the mean of accept_token, and the time to read tokenizer.json and
// build the trie (load_ms). The default schema is a typical
// tool-call-like object (nested object, array, enum, optional fields).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cellm/grammar.h"
#include "grammar/vocab_loader.h"

namespace {

const char* kDefaultSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string"},
    "arguments": {
      "type": "object",
      "properties": {
        "city": {"type": "string"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
        "hourly": {"type": "boolean"}
      },
      "required": ["city", "unit"],
      "additionalProperties": false
    },
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
    "score": {"type": ["number", "null"]}
  },
  "required": ["name", "arguments"],
  "additionalProperties": false
})";

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  std::string shared = CELLM_SHARED_DIR, schema = kDefaultSchema;
  int walks = 20, max_tokens = 400;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--shared") {
      shared = value;
    } else if (key == "--walks") {
      walks = std::stoi(value);
    } else if (key == "--max-tokens") {
      max_tokens = std::stoi(value);
    } else if (key == "--schema") {
      std::ifstream in(value);
      std::stringstream ss;
      ss << in.rdbuf();
      schema = ss.str();
    } else {
      std::fprintf(stderr, "unknown argument %s\n", key.c_str());
      return 2;
    }
  }
  using Clock = std::chrono::steady_clock;
  auto grammar = cellm::compile_json_schema(schema);
  if (!grammar.ok()) {
    std::fprintf(stderr, "%s\n", grammar.status().to_string().c_str());
    return 1;
  }
  std::printf("%-8s %-7s %7s %6s %9s %9s %9s %9s %7s %9s %9s\n", "vocab", "mode", "tokens", "steps",
              "mask_mean", "mask_p50", "mask_p99", "mask_max", "cached", "accept", "load_ms");
  for (const char* name : {"llama3", "qwen3", "llama2"}) {
    const auto t0 = Clock::now();
    auto vocab = cellm::grammar_test::load_vocabulary(shared + "/tokenizers/" + name);
    if (!vocab.ok()) {
      std::printf("%-8s skipped: %s\n", name, vocab.status().to_string().c_str());
      continue;
    }
    const double trie_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    for (const bool forked : {false, true}) {
      cellm::GrammarMatcher family(*grammar, *vocab);
      std::vector<double> mask_us, accept_us;
      size_t cached = 0;
      std::vector<uint64_t> mask(vocab->mask_words());
      std::vector<cellm::Token> allowed;
      std::vector<uint32_t> seen_states;  // states whose mask a walk has asked for
      for (int w = 0; w < walks; ++w) {
        cellm::GrammarMatcher matcher =
            forked ? family.fork() : cellm::GrammarMatcher(*grammar, *vocab);
        std::mt19937_64 rng(static_cast<uint64_t>(w));
        if (!forked) seen_states.clear();
        for (int n = 0; n < max_tokens && !matcher.ended(); ++n) {
          const uint32_t state = matcher.snapshot().state;
          if (std::find(seen_states.begin(), seen_states.end(), state) != seen_states.end()) {
            ++cached;
          } else {
            seen_states.push_back(state);
          }
          const auto a = Clock::now();
          matcher.fill_next_token_mask(mask);
          const auto b = Clock::now();
          mask_us.push_back(std::chrono::duration<double, std::micro>(b - a).count());
          allowed.clear();
          for (size_t word = 0; word < mask.size(); ++word) {
            for (uint64_t bits = mask[word]; bits != 0; bits &= bits - 1) {
              allowed.push_back(static_cast<cellm::Token>(word * 64 + __builtin_ctzll(bits)));
            }
          }
          if (allowed.empty()) break;
          const cellm::Token t =
              allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
          const auto c = Clock::now();
          const bool ok = matcher.accept_token(t);
          accept_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - c).count());
          if (!ok) {
            std::fprintf(stderr, "the matcher rejected a token its mask allowed\n");
            return 1;
          }
        }
      }
      double mean = 0, accept_mean = 0;
      for (double x : mask_us) mean += x;
      for (double x : accept_us) accept_mean += x;
      mean /= std::max<size_t>(1, mask_us.size());
      accept_mean /= std::max<size_t>(1, accept_us.size());
      std::printf("%-8s %-7s %7zu %6zu %7.1fus %7.1fus %7.1fus %7.1fus %6.0f%% %7.2fus %9.0f\n",
                  name, forked ? "forked" : "fresh", vocab->size(), mask_us.size(), mean,
                  percentile(mask_us, 0.5), percentile(mask_us, 0.99), percentile(mask_us, 1.0),
                  100.0 * static_cast<double>(cached) / static_cast<double>(mask_us.size()),
                  accept_mean, trie_ms);
    }
  }
  return 0;
}
