#include "serve/chat_request.h"

#include <set>

namespace cellm::cli {
namespace {

using Json = nlohmann::ordered_json;

constexpr size_t kMaxMessages = 4096;
constexpr size_t kMaxTools = 128;
constexpr size_t kMaxToolCallsPerMessage = 128;
constexpr size_t kMaxFunctionName = 64;

std::string quoted(const std::string& param) {
  return "'" + param + "'";
}

// OpenAI's function names: 1 to 64 of a-z, A-Z, 0-9, '_' and '-'.
bool valid_function_name(const std::string& name) {
  if (name.empty() || name.size() > kMaxFunctionName) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::optional<ApiError> check_content(const Json& content, const std::string& param) {
  if (content.is_null() || content.is_string()) return std::nullopt;
  if (!content.is_array()) {
    return invalid_field(param, quoted(param) + " must be a string, null or a list of parts");
  }
  for (size_t k = 0; k < content.size(); ++k) {
    const Json& part = content[k];
    const std::string where = param + "[" + std::to_string(k) + "]";
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return invalid_field(where, quoted(where) + " must be an object with a 'type'");
    }
    if (part["type"] != "text") {
      return invalid_field(where, quoted(where) + ": parts of type '" +
                                      part["type"].get<std::string>() +
                                      "' are not supported (only 'text')");
    }
    if (!part.contains("text") || !part["text"].is_string()) {
      return invalid_field(where, quoted(where) + " must have a string 'text'");
    }
  }
  return std::nullopt;
}

std::optional<ApiError> check_tool_calls(const Json& calls, const std::string& param) {
  if (!calls.is_array()) return invalid_field(param, quoted(param) + " must be a list");
  if (calls.size() > kMaxToolCallsPerMessage) {
    return invalid_field(param, quoted(param) + " holds at most " +
                                    std::to_string(kMaxToolCallsPerMessage) + " calls");
  }
  for (size_t k = 0; k < calls.size(); ++k) {
    const Json& c = calls[k];
    const std::string where = param + "[" + std::to_string(k) + "]";
    if (!c.is_object()) return invalid_field(where, quoted(where) + " must be an object");
    for (const auto& [key, value] : c.items()) {
      if (key != "id" && key != "type" && key != "function" && key != "index" && !value.is_null()) {
        return invalid_field(where + "." + key,
                             quoted(where + "." + key) + " is not a tool call field");
      }
    }
    if (c.contains("id") && !c["id"].is_null() && !c["id"].is_string()) {
      return invalid_field(where + ".id", quoted(where + ".id") + " must be a string");
    }
    if (c.contains("type") && !c["type"].is_null() && c["type"] != "function") {
      return invalid_field(where + ".type", quoted(where + ".type") + " must be \"function\"");
    }
    const std::string fn = where + ".function";
    if (!c.contains("function") || !c["function"].is_object()) {
      return invalid_field(fn, quoted(fn) + " must be an object {name, arguments}");
    }
    const Json& f = c["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty()) {
      return invalid_field(fn + ".name", quoted(fn + ".name") + " must be a non-empty string");
    }
    if (!f.contains("arguments") || !(f["arguments"].is_string() || f["arguments"].is_object())) {
      return invalid_field(fn + ".arguments",
                           quoted(fn + ".arguments") + " must be a JSON string or an object");
    }
  }
  return std::nullopt;
}

ApiResult<Json> parse_messages(const Json& body) {
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) {
    return invalid_field("messages", "'messages' must be a non-empty list");
  }
  if (it->size() > kMaxMessages) {
    return invalid_field("messages", "'messages' holds at most " + std::to_string(kMaxMessages));
  }
  Json messages = Json::array();
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& m = (*it)[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return invalid_field(param, quoted(param) + " must be an object");
    Json out = Json::object();
    for (const auto& [key, value] : m.items()) {
      const std::string where = param + "." + key;
      if (value.is_null()) continue;  // transformers drops null keys too
      if (key == "role") {
        if (!value.is_string() || value.get<std::string>().empty()) {
          return invalid_field(where, quoted(where) + " must be a non-empty string");
        }
      } else if (key == "content") {
        if (auto e = check_content(value, where)) return *e;
      } else if (key == "tool_calls") {
        if (auto e = check_tool_calls(value, where)) return *e;
        if (value.empty()) continue;  // as OpenAI's client may send: no calls
      } else if (key == "tool_call_id" || key == "name" || key == "reasoning_content" ||
                 key == "reasoning" || key == "thinking") {
        if (!value.is_string()) return invalid_field(where, quoted(where) + " must be a string");
      } else if (key == "annotations" || key == "refusal") {
        // What the client's own message objects carry back: accepted when they say
        // nothing (no annotations, no refusal), since a template never reads them.
        if ((value.is_array() && value.empty()) || (value.is_string() && value.empty())) continue;
        return invalid_field(where, quoted(where) + " is not supported on this server");
      } else {
        return invalid_field(where, quoted(where) + " is not supported on this server");
      }
      out[key] = value;
    }
    if (!out.contains("role")) {
      return invalid_field(param + ".role",
                           quoted(param + ".role") + " must be a non-empty string");
    }
    if (out.contains("tool_calls") && out["role"] != "assistant") {
      return invalid_field(param + ".tool_calls",
                           quoted(param + ".tool_calls") + " is only for assistant messages");
    }
    messages.push_back(std::move(out));
  }
  return messages;
}

// Fills c.tools / c.functions from `tools`.
std::optional<ApiError> parse_tools(const Json& body, ChatConversation& c) {
  auto it = body.find("tools");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_array()) return invalid_field("tools", "'tools' must be a list of tools");
  if (it->size() > kMaxTools) {
    return invalid_field("tools", "'tools' holds at most " + std::to_string(kMaxTools));
  }
  if (it->empty()) return std::nullopt;  // no tools: as if absent
  std::set<std::string> names;
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& t = (*it)[i];
    const std::string param = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) return invalid_field(param, quoted(param) + " must be an object");
    for (const auto& [key, value] : t.items()) {
      if (key != "type" && key != "function") {
        return invalid_field(param + "." + key,
                             quoted(param + "." + key) + " is not a field of a tool");
      }
    }
    if (!t.contains("type") || t["type"] != "function") {
      return invalid_field(param + ".type",
                           quoted(param + ".type") + " must be \"function\" (the only tool type)");
    }
    const std::string fn = param + ".function";
    if (!t.contains("function") || !t["function"].is_object()) {
      return invalid_field(fn, quoted(fn) + " must be an object {name, description, parameters}");
    }
    const Json& f = t["function"];
    for (const auto& [key, value] : f.items()) {
      if (key != "name" && key != "description" && key != "parameters" && key != "strict") {
        return invalid_field(fn + "." + key, quoted(fn + "." + key) + " is not a function field");
      }
    }
    if (!f.contains("name") || !f["name"].is_string() ||
        !valid_function_name(f["name"].get<std::string>())) {
      return invalid_field(fn + ".name",
                           quoted(fn + ".name") + " must be 1 to 64 letters, digits, '_' or '-'");
    }
    const std::string name = f["name"].get<std::string>();
    if (!names.insert(name).second) {
      return invalid_field(fn + ".name", "two tools are named '" + name + "'");
    }
    if (f.contains("description") && !f["description"].is_null() && !f["description"].is_string()) {
      return invalid_field(fn + ".description", quoted(fn + ".description") + " must be a string");
    }
    if (f.contains("strict") && !f["strict"].is_null() && !f["strict"].is_boolean()) {
      return invalid_field(fn + ".strict", quoted(fn + ".strict") + " must be a boolean");
    }
    Json parameters = Json::object();
    if (f.contains("parameters") && !f["parameters"].is_null()) {
      parameters = f["parameters"];
      if (!parameters.is_object()) {
        return invalid_field(fn + ".parameters",
                             quoted(fn + ".parameters") + " must be a JSON schema object");
      }
      if (parameters.contains("type") && parameters["type"] != "object") {
        return invalid_field(
            fn + ".parameters.type",
            quoted(fn + ".parameters.type") + " must be \"object\" (arguments are a JSON object)");
      }
      if (parameters.contains("properties") && !parameters["properties"].is_object()) {
        return invalid_field(fn + ".parameters.properties",
                             quoted(fn + ".parameters.properties") + " must be an object");
      }
      if (parameters.contains("required") && !parameters["required"].is_array()) {
        return invalid_field(fn + ".parameters.required",
                             quoted(fn + ".parameters.required") + " must be a list of names");
      }
    }
    c.functions.push_back(ToolFunction{name, std::move(parameters)});
  }
  c.tools = *it;
  return std::nullopt;
}

std::optional<ApiError> parse_tool_choice(const Json& body, ChatConversation& c) {
  const bool has_tools = !c.functions.empty();
  c.tool_choice = has_tools ? ToolChoice::kAuto : ToolChoice::kNone;
  auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) {
    const std::string s = it->get<std::string>();
    if (s == "none") {
      c.tool_choice = ToolChoice::kNone;
      return std::nullopt;
    }
    if (s != "auto" && s != "required") {
      return invalid_field("tool_choice",
                           "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                           "{\"type\": \"function\", \"function\": {\"name\": ...}}, got \"" +
                               s + "\"");
    }
    if (!has_tools) {
      return invalid_field("tool_choice", "'tool_choice' \"" + s + "\" needs 'tools'");
    }
    c.tool_choice = s == "auto" ? ToolChoice::kAuto : ToolChoice::kRequired;
    return std::nullopt;
  }
  if (!it->is_object() || !it->contains("type") || (*it)["type"] != "function" ||
      !it->contains("function") || !(*it)["function"].is_object() ||
      !(*it)["function"].contains("name") || !(*it)["function"]["name"].is_string()) {
    return invalid_field("tool_choice",
                         "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                         "{\"type\": \"function\", \"function\": {\"name\": ...}}");
  }
  const std::string name = (*it)["function"]["name"].get<std::string>();
  bool declared = false;
  for (const ToolFunction& f : c.functions) declared = declared || f.name == name;
  if (!declared) {
    return invalid_field("tool_choice", "'tool_choice' names the function '" + name +
                                            "', which 'tools' does not declare");
  }
  c.tool_choice = ToolChoice::kNamed;
  c.named_function = name;
  return std::nullopt;
}

}  // namespace

ApiResult<ChatConversation> parse_chat_conversation(const std::string& body_text) {
  const Json body = Json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    return ApiError{400, "the request body must be a JSON object", "invalid_request_error", "", ""};
  }
  ChatConversation c;
  ApiResult<Json> messages = parse_messages(body);
  if (auto* e = std::get_if<ApiError>(&messages)) return *e;
  c.messages = std::move(std::get<Json>(messages));
  if (auto e = parse_tools(body, c)) return *e;
  if (auto e = parse_tool_choice(body, c)) return *e;
  if (auto it = body.find("parallel_tool_calls"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      return invalid_field("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    }
    c.parallel_tool_calls = it->get<bool>();
  }
  if (auto it = body.find("chat_template_kwargs"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) {
      return invalid_field("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    }
    for (const char* reserved : {"messages", "tools", "documents", "add_generation_prompt"}) {
      if (it->contains(reserved)) {
        return invalid_field("chat_template_kwargs",
                             std::string("'chat_template_kwargs' may not set '") + reserved +
                                 "' (it is a field of the request)");
      }
    }
    c.kwargs = *it;
  }
  return c;
}

}  // namespace cellm::cli
