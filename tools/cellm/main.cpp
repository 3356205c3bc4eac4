// cellm: serve many concurrent generations of a language model from one process.
#include <cstdio>
#include <cstring>
#include <string>

#include "commands.h"

namespace cellm::cli {

bool wants_help(int argc, const char* const* argv) {
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) return true;
  }
  return false;
}

int fail(const std::string& command, const Status& status) {
  std::fprintf(stderr, "%s: error: %s\n", command.c_str(), status.message().c_str());
  return status.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace cellm::cli

namespace {

const char* kUsage =
    "usage: cellm <command> [options]\n"
    "\n"
    "commands:\n"
    "  generate   generate continuations of prompts, all concurrently\n"
    "  tokenize   print the token ids of a text\n"
    "  bench      measure prefill and decode throughput (llama-batched-bench columns)\n"
    "  perplexity measure the model's perplexity over a text (llama-perplexity's method)\n"
    "  serve      serve the model over HTTP with OpenAI's API\n"
    "\n"
    "Run `cellm <command> --help` for a command's options.\n";

}  // namespace

int main(int argc, char** argv) {
  const char* const* args = argv;
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::printf("%s", kUsage);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  if (command == "generate") return cellm::cli::run_generate(argc, args);
  if (command == "tokenize") return cellm::cli::run_tokenize(argc, args);
  if (command == "bench") return cellm::cli::run_bench(argc, args);
  if (command == "perplexity") return cellm::cli::run_perplexity(argc, args);
  if (command == "serve") {
#ifdef CELLM_HAVE_SERVE
    return cellm::cli::run_serve(argc, args);
#else
    std::fprintf(stderr,
                 "cellm serve: error: this build has no HTTP server (cpp-httplib, Debian's "
                 "libcpp-httplib-dev, was not found when it was configured)\n");
    return 1;
#endif
  }
  std::fprintf(
      stderr,
      "cellm: error: unknown command '%s' (commands: generate, tokenize, bench, serve; see "
      "cellm --help)\n",
      command.c_str());
  return 2;
}
