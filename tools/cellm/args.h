// A small command-line parser for the `cellm` subcommands: flags are declared
// once (name, whether they take a value, help), parsed into a map, and read
// back with typed getters that name the flag in every error.
//
// Accepted forms: `--name value`, `--name=value`, `-name value` (llama.cpp's
// `-npp 128,512` style) and bare `--flag` for booleans. Repeatable flags keep
// every value in order. A value that is itself a declared flag counts as
// missing (pass such a value as `--name=value`).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cellm/status.h"

namespace cellm::cli {

struct FlagSpec {
  std::string name;        // without dashes, e.g. "max-new-tokens"
  std::string value_name;  // empty for a boolean flag
  std::string help;
  bool repeatable = false;
};

class Args {
 public:
  // Parses argv[first, argc) against `specs`. Errors name the flag.
  static Result<Args> parse(int argc, const char* const* argv, int first,
                            const std::vector<FlagSpec>& specs, const std::string& command);

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::optional<std::string> get(const std::string& name) const;
  std::vector<std::string> get_all(const std::string& name) const;

  Result<int64_t> get_int(const std::string& name, int64_t fallback, int64_t min_value,
                          int64_t max_value) const;
  Result<double> get_float(const std::string& name, double fallback) const;
  // "1,4,16" -> {1, 4, 16}; every element within [min_value, max_value].
  Result<std::vector<int64_t>> get_int_list(const std::string& name, std::vector<int64_t> fallback,
                                            int64_t min_value, int64_t max_value) const;

 private:
  std::map<std::string, std::vector<std::string>> values_;
};

// The help text: usage line, then one line per flag.
std::string format_help(const std::string& usage, const std::string& summary,
                        const std::vector<FlagSpec>& specs);

}  // namespace cellm::cli
