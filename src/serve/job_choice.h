// Job::Choice: one choice of a job, shared by job.cpp and serve_engine.cpp (which starts
// choice 0). Used on the job's thread only.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cellm/runner.h"
#include "cellm/serve.h"
#include "cellm/tokenizer.h"
#include "serve/stop_matcher.h"

namespace cellm::serve {

struct Job::Choice {
  explicit Choice(const Tokenizer& tok, std::vector<std::string> stops)
      : decoder(tok, /*skip_special_tokens=*/true), matcher(std::move(stops)) {}
  Session session;
  GenerationHandle handle;
  IncrementalDecoder decoder;
  StopMatcher matcher;
  bool started = false;
  bool ended = false;        // its terminal update arrived (or it never started)
  bool stop_found = false;   // a stop string ended it; later tokens are dropped
  bool scores_sent = false;  // its first delta (with the prompt's scores) was made
  int64_t n_tokens = 0;
  int64_t t_last_token_us = 0;
};

}  // namespace cellm::serve
