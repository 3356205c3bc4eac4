// The endpoint handlers of `cellm serve`, one file each; serve.cpp routes to them.
#pragma once

#include <httplib.h>

#include "serve_http.h"

namespace cellm::cli {

// POST /v1/completions (serve_completions.cpp).
void handle_completions(const ServeContext& ctx, const httplib::Request& req,
                        httplib::Response& res);

}  // namespace cellm::cli
