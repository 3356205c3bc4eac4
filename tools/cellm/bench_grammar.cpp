// `cellm bench`'s constrained decoding: the flags, the vocabulary and the grammar
// (bench_grammar.h).
#include "bench_grammar.h"

#include <fstream>
#include <sstream>

#include "cellm/engine.h"
#include "cellm/tokenizer.h"

namespace cellm::cli {
namespace {

Result<std::string> read_text(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("--" + flag + ": cannot read '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError("--" + flag + ": reading '" + path + "' failed");
  return ss.str();
}

}  // namespace

std::vector<FlagSpec> constraint_flags() {
  return {
      {"json-schema", "FILE",
       "constrain every generation of every row to this JSON Schema (as response_format "
       "json_schema), over the tokenizer's vocabulary; the rows add the tokens really generated "
       "(gen) and the generations that ended complete (done), and S_TG counts those tokens"},
      {"grammar", "FILE", "as --json-schema, with a GBNF grammar (start rule root)"},
      {"regex", "PATTERN", "as --json-schema, with a regular expression the output matches"},
      {"tokenizer", "DIR",
       "the vocabulary of a constraint: a folder with tokenizer.json (default: --model's own; a "
       "preset needs one, e.g. a Llama 3 tokenizer for 1b and 8b)"},
      {"outputs", "FILE",
       "with a constraint: write each TG-phase generation as a JSON line (pp, tg, b, session, "
       "tokens, done, text)"},
  };
}

Result<std::optional<BenchConstraint>> BenchConstraint::from_flags(const Args& args,
                                                                   const std::string& model_dir,
                                                                   int64_t model_vocab) {
  int given = 0;
  for (const char* f : {"json-schema", "grammar", "regex"}) given += args.has(f) ? 1 : 0;
  if (given == 0) {
    for (const char* f : {"tokenizer", "outputs"}) {
      if (args.has(f)) {
        return InvalidArgument(
            std::string("--") + f +
            " belongs to a constraint: give --json-schema, --grammar or --regex");
      }
    }
    return std::optional<BenchConstraint>();
  }
  if (given > 1) return InvalidArgument("give at most one of --json-schema, --grammar, --regex");
  if (args.has("requests")) {
    return InvalidArgument(
        "--json-schema, --grammar and --regex apply to the rows, not to the serving load "
        "(--requests)");
  }

  // The grammar.
  Result<Grammar> grammar = InvalidArgument("no constraint");
  std::string what;
  if (const std::optional<std::string> file = args.get("json-schema")) {
    CELLM_ASSIGN_OR_RETURN(std::string text, read_text(*file, "json-schema"));
    grammar = compile_json_schema(text);
    what = "json-schema " + *file;
  } else if (const std::optional<std::string> gfile = args.get("grammar")) {
    CELLM_ASSIGN_OR_RETURN(std::string text, read_text(*gfile, "grammar"));
    grammar = compile_gbnf(text);
    what = "grammar " + *gfile;
  } else {
    const std::string pattern = args.get("regex").value_or("");
    grammar = compile_regex(pattern);
    what = "regex " + pattern;
  }
  if (!grammar.ok()) {
    return Status(grammar.status().code(), what + ": " + grammar.status().message());
  }

  // The vocabulary: the tokenizer's bytes, padded with never-allowed ids to the model's.
  std::string tokenizer_dir = args.get("tokenizer").value_or(model_dir);
  if (tokenizer_dir.empty()) {
    return InvalidArgument(
        "a preset has no tokenizer: give --tokenizer DIR (a folder with tokenizer.json whose "
        "vocabulary fits the preset's " +
        std::to_string(model_vocab) + " ids) with " + what);
  }
  Result<Tokenizer> tokenizer = load_tokenizer(tokenizer_dir);
  if (!tokenizer.ok()) {
    return Status(tokenizer.status().code(),
                  "--tokenizer " + tokenizer_dir + ": " + tokenizer.status().message());
  }
  if (tokenizer->vocab_size() > static_cast<size_t>(model_vocab)) {
    return InvalidArgument(
        "--tokenizer " + tokenizer_dir + " has " + std::to_string(tokenizer->vocab_size()) +
        " ids, more than the model's vocabulary of " + std::to_string(model_vocab));
  }
  if (tokenizer->eos_ids().empty()) {
    return InvalidArgument("--tokenizer " + tokenizer_dir +
                           " declares no EOS token: a constrained generation could never end");
  }
  std::vector<std::string> bytes(static_cast<size_t>(model_vocab));
  for (size_t id = 0; id < tokenizer->vocab_size(); ++id) {
    bytes[id] = tokenizer->token_bytes(static_cast<Token>(id));
  }
  CELLM_ASSIGN_OR_RETURN(TokenVocabulary vocab,
                         TokenVocabulary::build(std::move(bytes), tokenizer->eos_ids()));

  BenchConstraint c(std::move(vocab), std::move(*grammar));
  c.family_ = std::make_shared<GrammarMatcher>(*c.grammar_, c.vocab_);
  c.what_ = std::move(what);
  c.tokenizer_dir_ = std::move(tokenizer_dir);
  c.outputs_path_ = args.get("outputs").value_or("");
  if (!c.outputs_path_.empty()) {
    std::ofstream out(c.outputs_path_, std::ios::trunc);
    if (!out) return IoError("--outputs: cannot write '" + c.outputs_path_ + "'");
  }
  return std::optional<BenchConstraint>(std::move(c));
}

std::shared_ptr<GrammarLogitsProcessor> BenchConstraint::make_processor() const {
  std::lock_guard<std::mutex> lock(*family_mu_);
  return std::make_shared<GrammarLogitsProcessor>(family_->fork());
}

std::string BenchConstraint::text_of(const std::vector<Token>& tokens) const {
  std::string text;
  for (Token t : tokens) {
    if (t >= 0 && static_cast<size_t>(t) < vocab_.size() && !vocab_.is_eos(t)) {
      text += vocab_.bytes(t);
    }
  }
  return text;
}

}  // namespace cellm::cli
