// `cellm tokenize`: prints {"ids": [...], "decoded": "..."} for a text.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "args.h"
#include "cellm/engine.h"
#include "cellm/tokenizer.h"
#include "commands.h"

namespace cellm::cli {
namespace {

const std::vector<FlagSpec> kFlags = {
    {"model", "DIR",
     "model folder holding tokenizer.json, or a GGUF file (default: the bundled model)"},
    {"text", "TEXT", "the text to encode"},
    {"add-special", "", "apply the post-processor (e.g. Llama's BOS)"},
};

}  // namespace

int run_tokenize(int argc, const char* const* argv) {
  const std::string cmd = "cellm tokenize";
  if (wants_help(argc, argv)) {
    std::printf("%s", format_help("cellm tokenize [--model DIR] --text TEXT [--add-special]",
                                  "Encodes a text with the model's tokenizer.json and prints "
                                  "{\"ids\": [...], \"decoded\": \"...\"}.",
                                  kFlags)
                          .c_str());
    return 0;
  }
  Result<Args> args = Args::parse(argc, argv, 2, kFlags, cmd);
  if (!args.ok()) return fail(cmd, args.status());
  std::optional<std::string> text = args->get("text");
  if (!text) return fail(cmd, InvalidArgument("--text is required"));
  // The tokenizer alone: the folder the engine would load (the bundled model by default).
  ModelSource source;
  source.path = args->get("model").value_or("");
  Result<std::string> dir = resolve_model_folder(source);
  if (!dir.ok()) return fail(cmd, dir.status());
  Result<Tokenizer> tok = load_tokenizer(*dir);
  if (!tok.ok()) return fail(cmd, tok.status());
  const std::vector<Token> ids = tok->encode(*text, args->has("add-special"));
  nlohmann::json j;
  j["ids"] = ids;
  j["decoded"] = tok->decode(ids);
  std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return 0;
}

}  // namespace cellm::cli
