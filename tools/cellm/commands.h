// The `cellm` subcommands. Each takes the whole argv (argv[1] is its name),
// prints its own --help, and returns the process exit code: 0 on success, 1 on
// an error (one clear line on stderr), 2 on a usage error.
#pragma once

#include <string>

#include "cellm/status.h"

namespace cellm::cli {

int run_generate(int argc, const char* const* argv);
int run_tokenize(int argc, const char* const* argv);
int run_bench(int argc, const char* const* argv);
int run_perplexity(int argc, const char* const* argv);
int run_serve(int argc, const char* const* argv);

// True if argv[2..] holds --help or -h.
bool wants_help(int argc, const char* const* argv);
// Prints "<command>: error: <message>" and returns the exit code for `status`.
int fail(const std::string& command, const Status& status);

}  // namespace cellm::cli
