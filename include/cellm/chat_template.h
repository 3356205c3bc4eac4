// ChatTemplate: renders chat messages into a prompt with the model's own chat
// template, the Jinja `chat_template` of tokenizer_config.json (or the
// chat_template.jinja file beside it), the way Hugging Face transformers does:
// jinja2 with trim_blocks and lstrip_blocks, loop controls, raise_exception and
// strftime_now. src/text/jinja_*.{h,cpp} hold the interpreter; the supported
// Jinja subset is listed in jinja_parser.h.
//
// Rendering is bounded: at most 1 MiB of output, 100k loop iterations in all,
// macro calls 100 deep, and nesting 100 deep; a template that exceeds a limit
// gets an InvalidArgument error instead of running away.
//
// render() takes either plain {role, content} messages or the OpenAI-shaped JSON of a
// chat request (tool calls, tool results, content parts, reasoning_content, tools and
// chat_template_kwargs), which reaches the template as the dicts transformers passes.
//
// A ChatTemplate is an immutable, cheaply copyable handle (shared state);
// render() is safe to call from any thread.
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "cellm/status.h"

namespace cellm {

struct ChatMessage {
  std::string role;
  std::string content;
};

class ChatTemplate {
 public:
  // Reads model_dir/tokenizer_config.json's "chat_template" (a string, or a list of
  // {name, template} objects: use the one named "default"); bos_token / eos_token strings
  // (plain or {"content": ...}) become template variables. NotFound if the model has no
  // chat template; InvalidProgram (naming the file and the line/column) if it does not parse.
  // model_dir/chat_template.jinja, when present, is the template instead.
  static Result<ChatTemplate> load(const std::string& model_dir);
  // Parses a template string directly (for tests and for models that ship chat_template.jinja).
  // `now`, when given, is the time strftime_now() formats (for deterministic tests);
  // otherwise it formats the local time at render.
  static Result<ChatTemplate> parse(std::string_view source, std::string bos_token,
                                    std::string eos_token,
                                    std::optional<std::tm> now = std::nullopt);
  // Renders messages; add_generation_prompt as in transformers. Template errors
  // (raise_exception(...), an undefined function, a type error) -> InvalidArgument with the
  // message.
  Result<std::string> render(const std::vector<ChatMessage>& messages,
                             bool add_generation_prompt) const;

  // Renders an OpenAI-shaped chat request as transformers' apply_chat_template(tokenize=False)
  // renders the same data: each message reaches the template as the dict the client sent
  // (content a string, a list of parts or absent; tool_calls with their JSON-string or
  // object arguments untouched; tool_call_id, name, reasoning_content, any other key), after
  // transformers' normalization: keys whose value is null are dropped, and a message with
  // reasoning_content (or `thinking` / `reasoning`) carries it under both `reasoning_content`
  // and `thinking`.
  //   messages: a JSON array of objects (else InvalidArgument).
  //   tools: null (the template sees None) or the array of OpenAI tool objects.
  //   kwargs: null or an object (chat_template_kwargs): each key becomes a top-level template
  //     variable (e.g. enable_thinking), overriding bos_token/eos_token and the built-in
  //     functions as in transformers; `messages`, `tools`, `documents` and
  //     `add_generation_prompt` are refused (InvalidArgument), as Python refuses them.
  // Key order is the order of the ordered_json objects (parse the request body with
  // nlohmann::ordered_json so that `tools | tojson` keeps the client's order, as Python does).
  // Template errors as for render() above.
  Result<std::string> render(const nlohmann::ordered_json& messages,
                             const nlohmann::ordered_json& tools,
                             const nlohmann::ordered_json& kwargs,
                             bool add_generation_prompt) const;
  // The template source, e.g. to choose a tool-call or reasoning parser from its markers.
  const std::string& source() const;
  // Whether the template reads list-of-parts content (it loops over a message's content
  // or tests whether it is a string). Templates that do not (Qwen3, Llama 3) fail or print
  // a Python list on parts; a server then joins the text parts first (join_text_parts), as
  // vLLM does for such templates.
  bool reads_content_parts() const;
  // Replaces each message's list-of-parts content with its text parts joined by "\n".
  // A part that is not {"type": "text", "text": string} is InvalidArgument naming the
  // message and its type; other content (a string, null, absent) is left as it is.
  static Status join_text_parts(nlohmann::ordered_json& messages);
  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace cellm
