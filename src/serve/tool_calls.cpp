#include "serve/tool_calls.h"

#include <array>
#include <utility>

#include <nlohmann/json.hpp>

namespace cellm::serve {
namespace {

using nlohmann::ordered_json;

// JSON nested deeper than this is not a call (and never reaches the JSON parser).
constexpr size_t kMaxJsonDepth = 128;
// A Mistral function name longer than this is not a name.
constexpr size_t kMaxNameBytes = 256;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralMarker = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kMistralCallId = "[CALL_ID]";
constexpr std::string_view kLlamaPythonTag = "<|python_tag|>";

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.';
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// True when s is a proper prefix of marker (s shorter than marker).
bool is_proper_prefix(std::string_view s, std::string_view marker) {
  return s.size() < marker.size() && marker.substr(0, s.size()) == s;
}

size_t skip_ws(std::string_view s, size_t i) {
  while (i < s.size() && is_ws(s[i])) ++i;
  return i;
}

std::string_view trim(std::string_view s) {
  size_t b = skip_ws(s, 0);
  size_t e = s.size();
  while (e > b && is_ws(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// The length of the longest tail of `text` that may still grow into `marker`: a proper
// prefix of the marker, with the whitespace run before it (dropped if the marker comes).
size_t holdable_suffix(std::string_view text, std::string_view marker) {
  size_t p = 0;
  for (size_t len = std::min(marker.size() - 1, text.size()); len > 0; --len) {
    if (text.substr(text.size() - len) == marker.substr(0, len)) {
      p = len;
      break;
    }
  }
  size_t i = text.size() - p;
  while (i > 0 && is_ws(text[i - 1])) --i;
  return text.size() - i;
}

// Bracket nesting of a JSON text, outside strings, stays within kMaxJsonDepth.
bool depth_ok(std::string_view text) {
  size_t depth = 0;
  bool in_string = false;
  bool escape = false;
  for (char c : text) {
    if (in_string) {
      if (escape) {
        escape = false;
      } else if (c == '\\') {
        escape = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxJsonDepth) return false;
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return true;
}

// Parses a JSON text; a discarded value when it is not valid JSON (or too deep).
ordered_json parse_json(std::string_view text) {
  if (!depth_ok(text)) return ordered_json(ordered_json::value_t::discarded);
  return ordered_json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

std::string dump(const ordered_json& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/false, ordered_json::error_handler_t::replace);
}

// The arguments of a call as compact JSON object text: an object, a string holding one
// (double-encoded), or absent/null (no arguments); anything else is not a call.
std::optional<std::string> arguments_text(const ordered_json* arguments) {
  if (arguments == nullptr || arguments->is_null()) return std::string("{}");
  if (arguments->is_object()) return dump(*arguments);
  if (arguments->is_string()) {
    const ordered_json inner = parse_json(arguments->get_ref<const std::string&>());
    if (inner.is_object()) return dump(inner);
  }
  return std::nullopt;
}

struct NameAndArguments {
  std::string name;
  std::string arguments;
};

// {"name": N, "arguments" | "parameters": {...}} -> the call; nullopt when it is not one.
std::optional<NameAndArguments> call_of(const ordered_json& j) {
  if (!j.is_object()) return std::nullopt;
  const auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) {
    return std::nullopt;
  }
  const ordered_json* arguments = nullptr;
  for (const char* key : {"arguments", "parameters"}) {
    const auto it = j.find(key);
    if (it != j.end()) {
      arguments = &*it;
      break;
    }
  }
  std::optional<std::string> text = arguments_text(arguments);
  if (!text) return std::nullopt;
  return NameAndArguments{name->get<std::string>(), std::move(*text)};
}

std::string_view start_marker(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return kHermesOpen;
    case ToolCallFormat::kMistral:
      return kMistralMarker;
    case ToolCallFormat::kLlama3:
      return kLlamaPythonTag;
  }
  return kHermesOpen;
}

}  // namespace

Result<ToolCallFormat> tool_call_format_named(std::string_view name) {
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "llama3" || name == "llama3_json") return ToolCallFormat::kLlama3;
  if (name == "mistral") return ToolCallFormat::kMistral;
  return InvalidArgument("unknown tool-call parser '" + std::string(name) +
                         "' (known: hermes, llama3, mistral)");
}

std::string_view tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3:
      return "llama3";
    case ToolCallFormat::kMistral:
      return "mistral";
  }
  return "hermes";
}

std::optional<ToolCallFormat> detect_tool_call_format(std::string_view source) {
  const auto has = [&](std::string_view s) { return source.find(s) != std::string_view::npos; };
  if (has(kHermesOpen)) return ToolCallFormat::kHermes;
  if (has(kMistralMarker)) return ToolCallFormat::kMistral;
  if (has(kLlamaPythonTag)) return ToolCallFormat::kLlama3;
  if (has("<|start_header_id|>") && has("\"parameters\"")) return ToolCallFormat::kLlama3;
  return std::nullopt;
}

ToolCallIds ToolCallIds::random() {
  std::random_device device;
  const uint64_t seed = (uint64_t{device()} << 32) ^ device();
  return ToolCallIds(seed);
}

std::string ToolCallIds::next(ToolCallFormat format) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::uniform_int_distribution<size_t> pick(0, kAlphabet.size() - 1);
  const bool mistral = format == ToolCallFormat::kMistral;
  std::string id = mistral ? "" : "call_";
  const int n = mistral ? 9 : 24;
  for (int i = 0; i < n; ++i) id += kAlphabet[pick(rng_)];
  return id;
}

ToolCallStreamParser::ToolCallStreamParser(ToolCallFormat format, ToolCallIds ids)
    : format_(format), ids_(std::move(ids)) {}

ToolCallChunk ToolCallStreamParser::push(std::string_view text) {
  buf_.append(text);
  run(/*at_end=*/false);
  return std::exchange(out_, ToolCallChunk{});
}

ToolCallChunk ToolCallStreamParser::finish() {
  run(/*at_end=*/true);
  buf_.clear();
  return std::exchange(out_, ToolCallChunk{});
}

void ToolCallStreamParser::run(bool at_end) {
  for (;;) {
    bool progressed = false;
    switch (state_) {
      case State::kContent:
        progressed = step_content(at_end);
        break;
      case State::kCall:
        switch (format_) {
          case ToolCallFormat::kHermes:
            progressed = step_hermes(at_end);
            break;
          case ToolCallFormat::kMistral:
            progressed = step_mistral(at_end);
            break;
          case ToolCallFormat::kLlama3:
            progressed = step_llama(at_end);
            break;
        }
        break;
      case State::kLlamaAfterCall:
        progressed = step_llama_after(at_end);
        break;
    }
    if (!progressed) return;
  }
}

void ToolCallStreamParser::begin_call(std::string marker) {
  marker_ = std::move(marker);
  state_ = State::kCall;
  search_from_ = 0;
  scan_ = JsonScan{};
  phase_ = MistralPhase::kStart;
  json_start_ = 0;
  name_.clear();
  model_id_.clear();
}

void ToolCallStreamParser::reject(size_t n) {
  out_.content += held_ws_;
  out_.content += marker_;
  out_.content.append(buf_, 0, n);
  buf_.erase(0, n);
  held_ws_.clear();
  marker_.clear();
  scan_ = JsonScan{};
  state_ = State::kContent;
  after_call_ = false;
}

void ToolCallStreamParser::emit_call(std::string name, std::string arguments, std::string id) {
  if (id.empty()) id = ids_.next(format_);
  out_.calls.push_back(ToolCallDelta{calls_, std::move(id), std::move(name), std::move(arguments)});
  ++calls_;
}

bool ToolCallStreamParser::step_content(bool at_end) {
  if (buf_.empty()) return false;
  if (after_call_) {
    buf_.erase(0, skip_ws(buf_, 0));
    if (buf_.empty()) return false;
    after_call_ = false;
  }
  if (format_ != ToolCallFormat::kHermes && at_start_) {
    // A bare Llama 3 call object, or a Mistral call array whose [TOOL_CALLS] marker was
    // decoded away as a special token, may only open the reply.
    const size_t i = skip_ws(buf_, 0);
    if (i == buf_.size() && !at_end) return false;
    bool bare = false;
    if (format_ == ToolCallFormat::kLlama3) {
      bare = i < buf_.size() && buf_[i] == '{';
    } else if (i < buf_.size() && buf_[i] == '[') {
      // "[{" opens a call array; "[TOOL_CALLS]" and other text do not.
      const size_t j = skip_ws(buf_, i + 1);
      if (j == buf_.size() && !at_end) return false;
      bare = j < buf_.size() && buf_[j] == '{';
    }
    at_start_ = false;
    if (bare) {
      held_ws_ = buf_.substr(0, i);
      buf_.erase(0, i);
      begin_call("");
      return true;
    }
  }
  const std::string_view marker = start_marker(format_);
  const size_t m = buf_.find(marker);
  if (m != std::string::npos) {
    size_t body_end = m;
    while (body_end > 0 && is_ws(buf_[body_end - 1])) --body_end;
    out_.content.append(buf_, 0, body_end);
    held_ws_ = buf_.substr(body_end, m - body_end);
    buf_.erase(0, m + marker.size());
    at_start_ = false;
    begin_call(std::string(marker));
    return true;
  }
  at_start_ = false;
  const size_t keep = at_end ? 0 : holdable_suffix(buf_, marker);
  out_.content.append(buf_, 0, buf_.size() - keep);
  buf_.erase(0, buf_.size() - keep);
  return false;
}

ToolCallStreamParser::ScanResult ToolCallStreamParser::scan_json(size_t start, size_t* end) {
  if (!scan_.started) {
    scan_ = JsonScan{};
    scan_.started = true;
    scan_.pos = start;
  }
  for (; scan_.pos < buf_.size(); ++scan_.pos) {
    const char c = buf_[scan_.pos];
    if (scan_.in_string) {
      if (scan_.escape) {
        scan_.escape = false;
      } else if (c == '\\') {
        scan_.escape = true;
      } else if (c == '"') {
        scan_.in_string = false;
      }
      continue;
    }
    if (c == '"') {
      scan_.in_string = true;
    } else if (c == '{' || c == '[') {
      scan_.closers.push_back(c == '{' ? '}' : ']');
      if (scan_.closers.size() > kMaxJsonDepth) {
        *end = scan_.pos + 1;
        return ScanResult::kInvalid;
      }
    } else if (c == '}' || c == ']') {
      if (scan_.closers.empty() || scan_.closers.back() != c) {
        *end = scan_.pos + 1;
        return ScanResult::kInvalid;
      }
      scan_.closers.pop_back();
      if (scan_.closers.empty()) {
        *end = ++scan_.pos;
        return ScanResult::kComplete;
      }
    } else if (scan_.closers.empty()) {
      *end = scan_.pos + 1;  // a value that does not open with a bracket
      return ScanResult::kInvalid;
    }
  }
  return ScanResult::kIncomplete;
}

bool ToolCallStreamParser::step_hermes(bool at_end) {
  const size_t from =
      search_from_ >= kHermesClose.size() - 1 ? search_from_ - (kHermesClose.size() - 1) : 0;
  const size_t e = buf_.find(kHermesClose, from);
  if (e == std::string::npos) {
    search_from_ = buf_.size();
    if (!at_end) return false;
    // The reply ended inside the call: keep it if what came is already a whole call.
    if (std::optional<NameAndArguments> call = call_of(parse_json(trim(buf_)))) {
      emit_call(std::move(call->name), std::move(call->arguments), "");
      buf_.clear();
      held_ws_.clear();
      state_ = State::kContent;
      after_call_ = true;
    } else {
      reject(buf_.size());
    }
    return true;
  }
  if (std::optional<NameAndArguments> call =
          call_of(parse_json(trim(std::string_view(buf_).substr(0, e))))) {
    emit_call(std::move(call->name), std::move(call->arguments), "");
    buf_.erase(0, e + kHermesClose.size());
    held_ws_.clear();
    state_ = State::kContent;
    after_call_ = true;
  } else {
    reject(e + kHermesClose.size());
  }
  return true;
}

bool ToolCallStreamParser::step_llama(bool at_end) {
  const size_t i = scan_.started ? json_start_ : skip_ws(buf_, 0);
  if (i == buf_.size()) {
    if (!at_end) return false;
    reject(buf_.size());
    return true;
  }
  if (!scan_.started && buf_[i] != '{') {
    reject(i);
    return true;
  }
  json_start_ = i;
  size_t end = 0;
  switch (scan_json(i, &end)) {
    case ScanResult::kIncomplete:
      if (!at_end) return false;
      reject(buf_.size());
      return true;
    case ScanResult::kInvalid:
      reject(end);
      return true;
    case ScanResult::kComplete:
      break;
  }
  std::optional<NameAndArguments> call =
      call_of(parse_json(std::string_view(buf_).substr(i, end - i)));
  if (!call) {
    reject(end);
    return true;
  }
  emit_call(std::move(call->name), std::move(call->arguments), "");
  buf_.erase(0, end);
  held_ws_.clear();
  marker_.clear();
  scan_ = JsonScan{};
  state_ = State::kLlamaAfterCall;
  return true;
}

bool ToolCallStreamParser::step_llama_after(bool at_end) {
  const size_t i = skip_ws(buf_, 0);
  if (i == buf_.size()) {
    if (at_end) buf_.clear();  // whitespace after the last call is dropped
    return false;
  }
  if (buf_[i] == ';') {
    buf_.erase(0, i + 1);
    held_ws_.clear();
    begin_call(";");
    return true;
  }
  if (buf_[i] == '{') {
    buf_.erase(0, i);
    held_ws_.clear();
    begin_call("");
    return true;
  }
  state_ = State::kContent;
  after_call_ = true;
  return true;
}

bool ToolCallStreamParser::step_mistral(bool at_end) {
  size_t end = 0;
  switch (phase_) {
    case MistralPhase::kStart: {
      const size_t i = skip_ws(buf_, 0);
      if (i == buf_.size()) {
        if (!at_end) return false;
        reject(buf_.size());
        return true;
      }
      json_start_ = i;
      phase_ = buf_[i] == '[' ? MistralPhase::kArray : MistralPhase::kName;
      return true;
    }
    case MistralPhase::kArray: {
      switch (scan_json(json_start_, &end)) {
        case ScanResult::kIncomplete:
          if (!at_end) return false;
          reject(buf_.size());
          return true;
        case ScanResult::kInvalid:
          reject(end);
          return true;
        case ScanResult::kComplete:
          break;
      }
      const ordered_json array =
          parse_json(std::string_view(buf_).substr(json_start_, end - json_start_));
      std::vector<NameAndArguments> calls;
      if (array.is_array()) {
        for (const ordered_json& item : array) {
          std::optional<NameAndArguments> call = call_of(item);
          if (!call) break;
          calls.push_back(std::move(*call));
        }
      }
      if (calls.empty() || calls.size() != array.size()) {
        reject(end);
        return true;
      }
      for (NameAndArguments& call : calls) {
        emit_call(std::move(call.name), std::move(call.arguments), "");
      }
      break;
    }
    case MistralPhase::kName: {
      size_t k = json_start_;
      while (k < buf_.size() && is_name_char(buf_[k]) && k - json_start_ <= kMaxNameBytes) ++k;
      if (k - json_start_ > kMaxNameBytes) {
        reject(k);
        return true;
      }
      if (k == buf_.size()) {
        if (!at_end) return false;
        reject(buf_.size());
        return true;
      }
      const std::string_view rest = std::string_view(buf_).substr(k);
      size_t args_at = 0;
      if (starts_with(rest, kMistralArgs)) {
        args_at = k + kMistralArgs.size();
      } else if (starts_with(rest, kMistralCallId)) {
        const size_t id_start = k + kMistralCallId.size();
        size_t j = id_start;
        while (j < buf_.size() && is_name_char(buf_[j]) && j - id_start <= kMaxNameBytes) ++j;
        const std::string_view after = std::string_view(buf_).substr(j);
        if (j - id_start > kMaxNameBytes) {
          reject(j);
          return true;
        }
        if (!starts_with(after, kMistralArgs)) {
          if (is_proper_prefix(after, kMistralArgs) && !at_end) return false;
          reject(j);
          return true;
        }
        model_id_ = buf_.substr(id_start, j - id_start);
        args_at = j + kMistralArgs.size();
      } else if ((is_proper_prefix(rest, kMistralArgs) || is_proper_prefix(rest, kMistralCallId)) &&
                 !at_end) {
        return false;
      } else {
        reject(k);
        return true;
      }
      if (k == json_start_) {
        reject(k);  // [ARGS] with no name before it
        return true;
      }
      name_ = buf_.substr(json_start_, k - json_start_);
      json_start_ = args_at;
      phase_ = MistralPhase::kArgs;
      return true;
    }
    case MistralPhase::kArgs: {
      if (!scan_.started) {
        const size_t i = skip_ws(buf_, json_start_);
        if (i == buf_.size()) {
          if (!at_end) return false;
          reject(buf_.size());
          return true;
        }
        if (buf_[i] != '{') {
          reject(i);
          return true;
        }
        json_start_ = i;
      }
      switch (scan_json(json_start_, &end)) {
        case ScanResult::kIncomplete:
          if (!at_end) return false;
          reject(buf_.size());
          return true;
        case ScanResult::kInvalid:
          reject(end);
          return true;
        case ScanResult::kComplete:
          break;
      }
      const ordered_json arguments =
          parse_json(std::string_view(buf_).substr(json_start_, end - json_start_));
      if (!arguments.is_object()) {
        reject(end);
        return true;
      }
      emit_call(std::move(name_), dump(arguments), std::move(model_id_));
      break;
    }
  }
  // A call (or an array of them) was released.
  buf_.erase(0, end);
  held_ws_.clear();
  marker_.clear();
  scan_ = JsonScan{};
  state_ = State::kContent;
  after_call_ = true;
  return true;
}

ParsedToolCalls parse_tool_calls(ToolCallFormat format, std::string_view text, ToolCallIds ids) {
  ToolCallStreamParser parser(format, std::move(ids));
  ToolCallChunk a = parser.push(text);
  ToolCallChunk b = parser.finish();
  ParsedToolCalls out;
  out.content = std::move(a.content) + b.content;
  for (ToolCallChunk* chunk : {&a, &b}) {
    for (ToolCallDelta& d : chunk->calls) {
      out.calls.push_back(ToolCall{std::move(d.id), std::move(d.name), std::move(d.arguments)});
    }
  }
  return out;
}

}  // namespace cellm::serve
