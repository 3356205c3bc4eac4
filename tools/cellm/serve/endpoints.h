// The endpoint handlers of `cellm serve`, one file each; command.cpp routes to them.
#pragma once

#include <httplib.h>

#include <memory>
#include <string>

#include "cellm/chat_output.h"
#include "cellm/chat_template.h"
#include "cellm/status.h"

#include "serve/http.h"

namespace cellm::cli {

// POST /v1/completions (completions.cpp).
void handle_completions(const ServeContext& ctx, const httplib::Request& req,
                        httplib::Response& res);

// The chat endpoint's state: the model's chat template, or why it has none.
struct ChatEndpoint;
// The model's chat template as the engine loaded it, or why it has none (kept as the error
// each chat request then answers with 400). Tool calls are parsed in `tool_call_parser`'s
// format (--tool-call-parser), else in the one the template's source shows.
std::shared_ptr<const ChatEndpoint> make_chat_endpoint(
    const ChatTemplate* chat_template, const Status& status,
    std::optional<serve::ToolCallFormat> tool_call_parser = std::nullopt);
const Status& chat_template_status(const ChatEndpoint& endpoint);

// A chat body's `messages` (with `tools` and `chat_template_kwargs`) rendered with the
// endpoint's template and encoded; 400s name the field (no template, a malformed
// message or tool, a refused or empty rendering). The body is the request's text,
// parsed here with its key order kept.
ApiResult<std::vector<Token>> chat_prompt(const ServeContext& ctx, const ChatEndpoint& endpoint,
                                          const std::string& body_text, bool add_generation_prompt);

// POST /v1/chat/completions (chat.cpp).
void handle_chat(const ServeContext& ctx, const ChatEndpoint& endpoint, const httplib::Request& req,
                 httplib::Response& res);

// POST /tokenize and POST /detokenize (tokenize.cpp): vLLM's bodies. /tokenize takes
// `prompt` (text, add_special_tokens default true) or `messages` (rendered with the chat
// template, add_generation_prompt default true); /detokenize takes `tokens`.
void handle_tokenize(const ServeContext& ctx, const ChatEndpoint& endpoint,
                     const httplib::Request& req, httplib::Response& res);
void handle_detokenize(const ServeContext& ctx, const httplib::Request& req,
                       httplib::Response& res);

}  // namespace cellm::cli
