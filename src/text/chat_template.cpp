#include "cellm/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "jinja_builtins.h"
#include "jinja_eval.h"
#include "jinja_json.h"
#include "jinja_parser.h"
#include "regex.h"

namespace cellm {

struct ChatTemplate::Impl {
  std::string source;
  jinja::Body body;
  std::string bos_token;
  std::string eos_token;
  std::optional<std::tm> now;
  jinja::Limits limits;
};

namespace {

using nlohmann::json;
using nlohmann::ordered_json;

Result<std::string> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError(path.string() + ": cannot open for reading");
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return IoError(path.string() + ": read failed");
  return buffer.str();
}

std::string position_prefix(const jinja::TemplateError& e) {
  if (!e.has_position()) return "";
  return "line " + std::to_string(e.line()) + ", column " + std::to_string(e.column()) + ": ";
}

// A token string from tokenizer_config.json: "text" or {"content": "text"}; else "".
std::string token_string(const json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return "";
}

// The "chat_template" field: a string, or the entry named "default" of a list
// of {name, template}.
Result<std::string> template_field(const json& config, const std::string& source) {
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return NotFound(source + ": no chat_template");
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const json& entry : *it) {
      if (entry.is_object() && entry.value("name", json()) == "default") {
        const auto t = entry.find("template");
        if (t == entry.end() || !t->is_string()) {
          return InvalidProgram(source + ": chat_template 'default' has no template string");
        }
        return t->get<std::string>();
      }
    }
    return NotFound(source + ": chat_template has no entry named 'default'");
  }
  return InvalidProgram(source + ": chat_template must be a string or a list of {name, template}");
}

Result<ChatTemplate> parse_named(std::string_view source, std::string bos, std::string eos,
                                 const std::string& origin) {
  Result<ChatTemplate> t = ChatTemplate::parse(source, std::move(bos), std::move(eos));
  if (!t.ok()) return Status(t.status().code(), origin + ": " + t.status().message());
  return t;
}

}  // namespace

Result<ChatTemplate> ChatTemplate::load(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  const std::filesystem::path jinja_path = dir / "chat_template.jinja";
  std::error_code ec;
  json config = json::object();
  const bool has_config = std::filesystem::is_regular_file(config_path, ec);
  if (has_config) {
    CELLM_ASSIGN_OR_RETURN(const std::string text, read_file(config_path));
    try {
      config = json::parse(text);
    } catch (const json::exception& e) {
      return InvalidProgram(config_path.string() + ": malformed JSON: " + e.what());
    }
    if (!config.is_object()) return InvalidProgram(config_path.string() + ": not a JSON object");
  }
  const std::string bos = token_string(config, "bos_token");
  const std::string eos = token_string(config, "eos_token");
  if (std::filesystem::is_regular_file(jinja_path, ec)) {
    CELLM_ASSIGN_OR_RETURN(const std::string source, read_file(jinja_path));
    return parse_named(source, bos, eos, jinja_path.string());
  }
  if (!has_config) {
    return NotFound(model_dir + ": neither tokenizer_config.json nor chat_template.jinja");
  }
  CELLM_ASSIGN_OR_RETURN(const std::string source, template_field(config, config_path.string()));
  return parse_named(source, bos, eos, config_path.string() + " chat_template");
}

Result<ChatTemplate> ChatTemplate::parse(std::string_view source, std::string bos_token,
                                         std::string eos_token, std::optional<std::tm> now) {
  auto impl = std::make_shared<Impl>();
  try {
    impl->body = jinja::parse_template(source, impl->limits);
  } catch (const jinja::TemplateError& e) {
    return InvalidProgram("chat template does not parse: " + position_prefix(e) + e.message());
  }
  impl->source = std::string(source);
  impl->bos_token = std::move(bos_token);
  impl->eos_token = std::move(eos_token);
  impl->now = now;
  ChatTemplate t;
  t.impl_ = std::move(impl);
  return t;
}

namespace {

using jinja::Value;

// Runs `build` (which makes the template's variables) and renders, turning the
// interpreter's exceptions into a Status.
template <typename Build>
Result<std::string> render_with(const ChatTemplate::Impl& impl, Build&& build) {
  try {
    jinja::Budget budget(impl.limits);
    std::vector<std::pair<std::string, Value>> variables =
        jinja::global_functions(budget, impl.now);
    variables.emplace_back("bos_token", Value::string(impl.bos_token));
    variables.emplace_back("eos_token", Value::string(impl.eos_token));
    // transformers passes these as None when the request has none.
    variables.emplace_back("tools", Value::none());
    variables.emplace_back("documents", Value::none());
    CELLM_RETURN_IF_ERROR(build(variables));
    return jinja::render_template(impl.body, variables, budget);
  } catch (const jinja::RaisedError& e) {
    return InvalidArgument("chat template raised an exception: " + e.message());
  } catch (const jinja::TemplateError& e) {
    return InvalidArgument("chat template: " + position_prefix(e) + e.message());
  } catch (const std::bad_alloc&) {
    return OutOfResources("chat template: out of memory");
  }
}

void set_variable(std::vector<std::pair<std::string, Value>>& variables, const std::string& name,
                  Value value) {
  for (auto& [n, v] : variables) {
    if (n == name) {
      v = std::move(value);
      return;
    }
  }
  variables.emplace_back(name, std::move(value));
}

// The names under which transformers passes a message's reasoning; the first is the one
// templates read.
constexpr const char* kReasoningFields[] = {"reasoning_content", "thinking", "reasoning"};

// One message as transformers hands it to the template: null-valued keys dropped, and
// reasoning copied as {"thinking": r, **message, "reasoning_content": r}.
Result<Value> message_value(const ordered_json& message, size_t index) {
  if (!message.is_object()) {
    return InvalidArgument("chat messages must be objects; messages[" + std::to_string(index) +
                           "] is " + std::string(message.type_name()));
  }
  const ordered_json* reasoning = nullptr;
  for (const char* field : kReasoningFields) {
    const auto it = message.find(field);
    if (it != message.end() && !it->is_null()) {
      reasoning = &*it;
      break;
    }
  }
  std::vector<std::pair<Value, Value>> items;
  items.reserve(message.size() + 2);
  if (reasoning != nullptr)
    items.emplace_back(Value::string("thinking"), jinja::from_json(*reasoning));
  bool has_reasoning_content = false;
  for (const auto& [key, value] : message.items()) {
    if (value.is_null()) continue;
    if (reasoning != nullptr && key == "thinking") {
      items.front().second = jinja::from_json(value);
      continue;
    }
    if (reasoning != nullptr && key == "reasoning_content") {
      has_reasoning_content = true;
      items.emplace_back(Value::string(key), jinja::from_json(*reasoning));
      continue;
    }
    items.emplace_back(Value::string(key), jinja::from_json(value));
  }
  if (reasoning != nullptr && !has_reasoning_content) {
    items.emplace_back(Value::string("reasoning_content"), jinja::from_json(*reasoning));
  }
  return Value::dict_of_distinct_keys(std::move(items));
}

}  // namespace

Result<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt) const {
  CELLM_CHECK(impl_ != nullptr);
  return render_with(*impl_, [&](std::vector<std::pair<std::string, Value>>& variables) -> Status {
    std::vector<Value> list;
    list.reserve(messages.size());
    for (const ChatMessage& m : messages) {
      list.push_back(Value::dict({{Value::string("role"), Value::string(m.role)},
                                  {Value::string("content"), Value::string(m.content)}}));
    }
    variables.emplace_back("messages", Value::list(std::move(list)));
    variables.emplace_back("add_generation_prompt", Value::boolean(add_generation_prompt));
    return Status::Ok();
  });
}

Result<std::string> ChatTemplate::render(const ordered_json& messages, const ordered_json& tools,
                                         const ordered_json& kwargs,
                                         bool add_generation_prompt) const {
  CELLM_CHECK(impl_ != nullptr);
  if (!messages.is_array()) {
    return InvalidArgument("chat messages must be a list, not " +
                           std::string(messages.type_name()));
  }
  if (!tools.is_null() && !tools.is_array()) {
    return InvalidArgument("chat template tools must be null or a list, not " +
                           std::string(tools.type_name()));
  }
  if (!kwargs.is_null() && !kwargs.is_object()) {
    return InvalidArgument("chat_template_kwargs must be an object, not " +
                           std::string(kwargs.type_name()));
  }
  if (kwargs.is_object()) {
    for (const char* reserved : {"messages", "tools", "documents", "add_generation_prompt"}) {
      if (kwargs.contains(reserved)) {
        return InvalidArgument(std::string("chat_template_kwargs may not set '") + reserved +
                               "' (it is given by the request itself)");
      }
    }
  }
  return render_with(*impl_, [&](std::vector<std::pair<std::string, Value>>& variables) -> Status {
    std::vector<Value> list;
    list.reserve(messages.size());
    for (size_t i = 0; i < messages.size(); ++i) {
      CELLM_ASSIGN_OR_RETURN(Value m, message_value(messages[i], i));
      list.push_back(std::move(m));
    }
    set_variable(variables, "messages", Value::list(std::move(list)));
    set_variable(variables, "tools", jinja::from_json(tools));
    set_variable(variables, "add_generation_prompt", Value::boolean(add_generation_prompt));
    if (kwargs.is_object()) {
      for (const auto& [key, value] : kwargs.items()) {
        set_variable(variables, key, jinja::from_json(value));
      }
    }
    return Status::Ok();
  });
}

const std::string& ChatTemplate::source() const {
  CELLM_CHECK(impl_ != nullptr);
  return impl_->source;
}

bool ChatTemplate::reads_content_parts() const {
  CELLM_CHECK(impl_ != nullptr);
  // `for part in message.content`, `... in message['content']`, `content is string`,
  // `content is not string`, `content[0]`.
  // PCRE2 through the text layer's Regex (libstdc++'s std::regex trips GCC's
  // maybe-uninitialized warning under the sanitizers).
  static const Result<Regex> kPartsAware = Regex::compile(
      R"(for\s+\w+\s+in\s+[\w.]*(\.content|\[\s*['"]content['"]\s*\])|)"
      R"((\.content|\[\s*['"]content['"]\s*\])\s*(is\s+(not\s+)?string|\[\s*0\s*\]))");
  CELLM_CHECK(kPartsAware.ok());
  return !kPartsAware->find_all(impl_->source).empty();
}

Status ChatTemplate::join_text_parts(ordered_json& messages) {
  if (!messages.is_array()) return InvalidArgument("chat messages must be a list");
  for (size_t i = 0; i < messages.size(); ++i) {
    ordered_json& m = messages[i];
    if (!m.is_object()) continue;  // render() names it
    const auto content = m.find("content");
    if (content == m.end() || !content->is_array()) continue;
    std::string text;
    for (size_t p = 0; p < content->size(); ++p) {
      const ordered_json& part = (*content)[p];
      const std::string where =
          "messages[" + std::to_string(i) + "].content[" + std::to_string(p) + "]";
      if (!part.is_object()) return InvalidArgument(where + " is not an object");
      const auto type = part.find("type");
      if (type == part.end() || !type->is_string()) {
        return InvalidArgument(where + " has no type");
      }
      if (*type != "text") {
        return InvalidArgument(where + " is of type '" + type->get<std::string>() +
                               "'; only text parts are supported");
      }
      const auto t = part.find("text");
      if (t == part.end() || !t->is_string()) {
        return InvalidArgument(where + " has no text string");
      }
      if (p > 0) text += '\n';
      text += t->get<std::string>();
    }
    *content = std::move(text);
  }
  return Status::Ok();
}

}  // namespace cellm
