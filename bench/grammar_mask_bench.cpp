// grammar_mask_bench: the cost of one constrained-decoding step on real
// vocabularies: the token mask (GrammarMatcher::fill_next_token_mask) and
// accepting the drawn token, along random walks through a JSON schema.
//
//   grammar_mask_bench [--shared DIR] [--walks N] [--max-tokens M] [--schema FILE]
//                      [--rows B --steps S [--vocab NAME]]
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
//
// With --rows B, a batched decode instead, as an executor runs it: B sessions, each a
// GrammarLogitsProcessor forked from one family (as `cellm serve` and `cellm bench
// --json-schema` make them); each of S steps calls every row's prepare() (the mask the
// CUDA executor computes while the device runs the step's forward), applies each mask
// to a row of logits as the CPU executor does (apply_logit_adjustments over the whole
// vocabulary), draws a token uniformly among the allowed ones and calls accept() (after
// the step's tokens are known). A session whose output is complete restarts from a new
// fork, so all B rows stay busy. It prints, per step, the mean and p99 of the B rows'
// prepare() together, of the mask application and of accept(), and the steps that met
// a new automaton state. The first step (every row at the start state, the family's
// cache cold) is reported apart.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cellm/grammar.h"
#include "cellm/logits_processor.h"
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

double mean_of(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

// --rows: B processors through S steps of a batched decode (see the header).
int run_batched(const cellm::Grammar& grammar, const cellm::TokenVocabulary& vocab, int rows,
                int steps, const char* name) {
  using Clock = std::chrono::steady_clock;
  const auto us = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
  };
  cellm::GrammarMatcher family(grammar, vocab);
  std::vector<std::unique_ptr<cellm::GrammarLogitsProcessor>> procs;
  for (int r = 0; r < rows; ++r) {
    procs.push_back(std::make_unique<cellm::GrammarLogitsProcessor>(family.fork()));
  }
  std::vector<cellm::LogitAdjustments> adj(static_cast<size_t>(rows));
  std::vector<float> logits(vocab.size());
  std::vector<cellm::Token> allowed;
  std::vector<double> prepare_us, apply_us, accept_us;
  double first_prepare_us = 0;
  int restarts = 0;
  size_t new_states = 0;
  std::vector<uint32_t> seen;
  std::mt19937_64 rng(1);
  for (int step = 0; step < steps; ++step) {
    bool met_new = false;
    for (const auto& p : procs) {
      const uint32_t state = p->matcher().snapshot().state;
      if (std::find(seen.begin(), seen.end(), state) == seen.end()) {
        seen.push_back(state);
        met_new = true;
      }
    }
    new_states += met_new ? 1 : 0;
    const auto a = Clock::now();
    for (int r = 0; r < rows; ++r)
      procs[static_cast<size_t>(r)]->prepare(adj[static_cast<size_t>(r)]);
    const auto b = Clock::now();
    for (int r = 0; r < rows; ++r) {
      std::fill(logits.begin(), logits.end(), 0.0f);
      cellm::apply_logit_adjustments(logits, adj[static_cast<size_t>(r)]);
    }
    const auto c = Clock::now();
    std::vector<cellm::Token> drawn(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      const std::vector<uint64_t>& mask = adj[static_cast<size_t>(r)].allowed;
      allowed.clear();
      for (size_t word = 0; word < mask.size(); ++word) {
        for (uint64_t bits = mask[word]; bits != 0; bits &= bits - 1) {
          allowed.push_back(static_cast<cellm::Token>(word * 64 + __builtin_ctzll(bits)));
        }
      }
      if (allowed.empty()) {
        std::fprintf(stderr, "a row's mask allows nothing\n");
        return 1;
      }
      drawn[static_cast<size_t>(r)] =
          allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    }
    const auto d = Clock::now();
    for (int r = 0; r < rows; ++r)
      procs[static_cast<size_t>(r)]->accept(drawn[static_cast<size_t>(r)]);
    const auto e = Clock::now();
    if (step == 0) {
      first_prepare_us = us(a, b);
    } else {
      prepare_us.push_back(us(a, b));
    }
    apply_us.push_back(us(b, c));
    accept_us.push_back(us(d, e));
    // A session that ended (EOS drawn) is replaced by a new one of the same schema.
    for (auto& p : procs) {
      if (p->matcher().ended() || p->failed()) {
        p = std::make_unique<cellm::GrammarLogitsProcessor>(family.fork());
        ++restarts;
      }
    }
  }
  std::printf("%-8s %5d %6d %10.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %8zu %8d\n", name, rows,
              steps, first_prepare_us / 1e3, mean_of(prepare_us) / 1e3,
              percentile(prepare_us, 0.5) / 1e3, percentile(prepare_us, 0.99) / 1e3,
              mean_of(apply_us) / 1e3, mean_of(accept_us) / 1e3, percentile(accept_us, 0.99) / 1e3,
              new_states, restarts);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string shared = CELLM_SHARED_DIR, schema = kDefaultSchema;
  int walks = 20, max_tokens = 400, rows = 0, steps = 128;
  std::string only_vocab;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--shared") {
      shared = value;
    } else if (key == "--walks") {
      walks = std::stoi(value);
    } else if (key == "--rows") {
      rows = std::stoi(value);
    } else if (key == "--steps") {
      steps = std::stoi(value);
    } else if (key == "--vocab") {
      only_vocab = value;
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
  if (rows > 0) {
    std::printf("%-8s %5s %6s %10s %9s %9s %9s %9s %9s %9s %8s %8s\n", "vocab", "rows", "steps",
                "first_ms", "prep_ms", "prep_p50", "prep_p99", "apply_ms", "accpt_ms", "accpt_p99",
                "new_st", "restarts");
  } else {
    std::printf("%-8s %-7s %7s %6s %9s %9s %9s %9s %7s %9s %9s\n", "vocab", "mode", "tokens",
                "steps", "mask_mean", "mask_p50", "mask_p99", "mask_max", "cached", "accept",
                "load_ms");
  }
  for (const char* name : {"llama3", "qwen3", "llama2"}) {
    if (!only_vocab.empty() && only_vocab != name) continue;
    const auto t0 = Clock::now();
    auto vocab = cellm::grammar_test::load_vocabulary(shared + "/tokenizers/" + name);
    if (!vocab.ok()) {
      std::printf("%-8s skipped: %s\n", name, vocab.status().to_string().c_str());
      continue;
    }
    const double trie_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (rows > 0) {
      if (run_batched(*grammar, *vocab, rows, steps, name) != 0) return 1;
      continue;
    }
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
