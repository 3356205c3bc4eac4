#include "cellm/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "jinja_builtins.h"
#include "jinja_eval.h"
#include "jinja_parser.h"

namespace cellm {

struct ChatTemplate::Impl {
  jinja::Body body;
  std::string bos_token;
  std::string eos_token;
  std::optional<std::tm> now;
  jinja::Limits limits;
};

namespace {

using nlohmann::json;

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
  impl->bos_token = std::move(bos_token);
  impl->eos_token = std::move(eos_token);
  impl->now = now;
  ChatTemplate t;
  t.impl_ = std::move(impl);
  return t;
}

Result<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt) const {
  CELLM_CHECK(impl_ != nullptr);
  try {
    jinja::Budget budget(impl_->limits);
    std::vector<jinja::Value> list;
    list.reserve(messages.size());
    for (const ChatMessage& m : messages) {
      list.push_back(
          jinja::Value::dict({{jinja::Value::string("role"), jinja::Value::string(m.role)},
                              {jinja::Value::string("content"), jinja::Value::string(m.content)}}));
    }
    std::vector<std::pair<std::string, jinja::Value>> variables =
        jinja::global_functions(budget, impl_->now);
    variables.emplace_back("messages", jinja::Value::list(std::move(list)));
    variables.emplace_back("add_generation_prompt", jinja::Value::boolean(add_generation_prompt));
    variables.emplace_back("bos_token", jinja::Value::string(impl_->bos_token));
    variables.emplace_back("eos_token", jinja::Value::string(impl_->eos_token));
    // transformers passes these as None when the request has none.
    variables.emplace_back("tools", jinja::Value::none());
    variables.emplace_back("documents", jinja::Value::none());
    return jinja::render_template(impl_->body, variables, budget);
  } catch (const jinja::RaisedError& e) {
    return InvalidArgument("chat template raised an exception: " + e.message());
  } catch (const jinja::TemplateError& e) {
    return InvalidArgument("chat template: " + position_prefix(e) + e.message());
  } catch (const std::bad_alloc&) {
    return OutOfResources("chat template: out of memory");
  }
}

}  // namespace cellm
