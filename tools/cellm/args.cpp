#include "args.h"

#include <charconv>
#include <cmath>
#include <sstream>

namespace cellm::cli {
namespace {

const FlagSpec* find_spec(const std::vector<FlagSpec>& specs, const std::string& name) {
  for (const FlagSpec& s : specs) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

// True if `arg` is `--name`, `-name` or `--name=...` for a declared flag.
bool is_declared_flag(const std::vector<FlagSpec>& specs, const std::string& arg) {
  if (arg.size() < 2 || arg[0] != '-') return false;
  std::string name = arg.substr(arg[1] == '-' ? 2 : 1);
  name = name.substr(0, name.find('='));
  return find_spec(specs, name) != nullptr;
}

Result<int64_t> parse_int(const std::string& flag, const std::string& text, int64_t min_value,
                          int64_t max_value) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end || text.empty()) {
    return InvalidArgument("--" + flag + " expects an integer, got '" + text + "'");
  }
  if (v < min_value || v > max_value) {
    return InvalidArgument("--" + flag + " must be in [" + std::to_string(min_value) + ", " +
                           std::to_string(max_value) + "], got " + text);
  }
  return v;
}

}  // namespace

Result<Args> Args::parse(int argc, const char* const* argv, int first,
                         const std::vector<FlagSpec>& specs, const std::string& command) {
  Args args;
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.size() < 2 || arg[0] != '-') {
      return InvalidArgument("unexpected argument '" + arg + "' for " + command + " (see " +
                             command + " --help)");
    }
    std::string name = arg.substr(arg[1] == '-' ? 2 : 1);
    std::optional<std::string> inline_value;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      inline_value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const FlagSpec* spec = find_spec(specs, name);
    if (spec == nullptr) {
      return InvalidArgument("unknown option '" + arg + "' for " + command + " (see " + command +
                             " --help)");
    }
    std::string value;
    if (spec->value_name.empty()) {
      if (inline_value) return InvalidArgument("--" + name + " takes no value");
      value = "true";
    } else if (inline_value) {
      value = *inline_value;
    } else {
      // A following declared flag is not taken as the value (`--model --prompt x`
      // is a missing value, not a model called "--prompt"); `--name=--x` passes one.
      if (i + 1 >= argc || is_declared_flag(specs, argv[i + 1])) {
        return InvalidArgument("--" + name + " needs a value <" + spec->value_name + ">");
      }
      value = argv[++i];
    }
    auto& slot = args.values_[name];
    if (!slot.empty() && !spec->repeatable) {
      return InvalidArgument("--" + name + " was given more than once");
    }
    slot.push_back(std::move(value));
  }
  return args;
}

std::optional<std::string> Args::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end() || it->second.empty()) return std::nullopt;
  return it->second.back();
}

std::vector<std::string> Args::get_all(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

Result<int64_t> Args::get_int(const std::string& name, int64_t fallback, int64_t min_value,
                              int64_t max_value) const {
  std::optional<std::string> v = get(name);
  if (!v) return fallback;
  return parse_int(name, *v, min_value, max_value);
}

Result<double> Args::get_float(const std::string& name, double fallback) const {
  std::optional<std::string> v = get(name);
  if (!v) return fallback;
  try {
    size_t used = 0;
    double d = std::stod(*v, &used);
    if (used != v->size() || !std::isfinite(d)) throw std::invalid_argument(*v);
    return d;
  } catch (const std::exception&) {
    return InvalidArgument("--" + name + " expects a number, got '" + *v + "'");
  }
}

Result<std::vector<int64_t>> Args::get_int_list(const std::string& name,
                                                std::vector<int64_t> fallback, int64_t min_value,
                                                int64_t max_value) const {
  std::optional<std::string> v = get(name);
  if (!v) return fallback;
  std::vector<int64_t> out;
  std::stringstream ss(*v);
  std::string item;
  while (std::getline(ss, item, ',')) {
    CELLM_ASSIGN_OR_RETURN(int64_t x, parse_int(name, item, min_value, max_value));
    out.push_back(x);
  }
  if (out.empty()) return InvalidArgument("--" + name + " expects a comma-separated list");
  return out;
}

std::string format_help(const std::string& usage, const std::string& summary,
                        const std::vector<FlagSpec>& specs) {
  std::ostringstream os;
  os << "usage: " << usage << "\n\n" << summary << "\n\noptions:\n";
  for (const FlagSpec& s : specs) {
    std::string left = "  --" + s.name + (s.value_name.empty() ? "" : " " + s.value_name);
    os << left;
    if (left.size() < 30)
      os << std::string(30 - left.size(), ' ');
    else
      os << "\n" << std::string(30, ' ');
    os << s.help << (s.repeatable ? " (repeatable)" : "") << "\n";
  }
  os << "  --help                      show this help\n";
  return os.str();
}

}  // namespace cellm::cli
