// Job: one request's choices driven to their end on the caller's thread (serve.h).
#include <algorithm>
#include <chrono>
#include <utility>

#include "cellm/serve.h"
#include "serve/job_choice.h"

namespace cellm::serve {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(50);

const char* finish_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStopToken:
      return "stop";
    case FinishReason::kNewTokenLimit:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kFailed:
      return "error";
  }
  return "error";
}

}  // namespace

Job::Job(ServeEngine& engine, JobSpec spec, Admission::Ticket ticket, int64_t t_arrival_us)
    : engine_(engine),
      spec_(std::move(spec)),
      ticket_(std::move(ticket)),
      t_arrival_us_(t_arrival_us) {
  for (int32_t i = 0; i < spec_.n; ++i) {
    choices_.push_back(std::make_unique<Choice>(engine_.tokenizer(), spec_.stop));
  }
  engine_.enroll(this);
}

Job::~Job() {
  settle();
  engine_.withdraw(this);
  choices_.clear();  // destroys the sessions: their cells go to the prefix cache
}

GenerationCallback Job::callback_for(int32_t index) const {
  return [channel = channel_, index](const GenerationUpdate& update) {
    // Engine thread: a short critical section, no I/O, no waiting.
    const int64_t t = now_us();
    {
      std::lock_guard<std::mutex> lock(channel->mu);
      channel->events.push_back(Event{index, update, t});
    }
    channel->cv.notify_one();
  };
}

GenConfig Job::config_for(int32_t index) const {
  GenConfig config;
  config.max_new_tokens = spec_.max_tokens;
  config.sampling = spec_.sampling;
  config.stop_tokens = spec_.stop_tokens;
  if (spec_.seed) config.seed = *spec_.seed + static_cast<uint64_t>(index);
  if (spec_.processor_for) config.processor = spec_.processor_for(index);
  // Choice 0 feeds the whole prompt; the clones share its scores.
  config.score_prompt = spec_.score_prompt && index == 0;
  return config;
}

void Job::cancel() {
  std::vector<GenerationHandle> handles;
  {
    std::lock_guard<std::mutex> lock(cancel_mu_);
    cancelled_ = true;
    handles = handles_;
  }
  for (const GenerationHandle& h : handles) h.cancel();
}

void Job::settle() {
  cancel();
  std::vector<GenerationHandle> handles;
  {
    std::lock_guard<std::mutex> lock(cancel_mu_);
    handles = handles_;
  }
  for (const GenerationHandle& h : handles) h.wait();
}

void Job::start_clones() {
  clones_started_ = true;
  const auto prompt_len = static_cast<Position>(spec_.prompt.size());
  for (int32_t i = 1; i < spec_.n; ++i) {
    Choice& c = *choices_[static_cast<size_t>(i)];
    {
      std::lock_guard<std::mutex> lock(cancel_mu_);
      if (cancelled_) {
        c.ended = true;
        continue;
      }
    }
    // Clone below the last prompt token, so the clone's first token is sampled
    // fresh with its own seed after one one-token forward.
    std::optional<Session> session;
    std::vector<Token> delta;
    if (prompt_len >= 2) session = choices_[0]->session.clone_async(prompt_len - 1).get();
    if (session) {
      delta.assign(spec_.prompt.end() - 1, spec_.prompt.end());
    } else {
      session = engine_.runner().open_session_async().get();
      delta = spec_.prompt;
    }
    if (!session) {
      // Reported through the normal path: a failed choice.
      c.ended = false;
      GenerationUpdate failed;
      failed.finish_reason = FinishReason::kFailed;
      failed.error_message = "no session available for choice " + std::to_string(i);
      std::lock_guard<std::mutex> lock(channel_->mu);
      channel_->events.push_back(Event{i, std::move(failed), now_us()});
      c.started = true;
      continue;
    }
    c.session = std::move(*session);
    c.started = true;
    GenerationHandle h = c.session.generate_async(std::move(delta), config_for(i), callback_for(i));
    c.handle = h;
    std::lock_guard<std::mutex> lock(cancel_mu_);
    handles_.push_back(h);
    if (cancelled_) h.cancel();
  }
}

std::optional<ChoiceDelta> Job::process(Event& event) {
  Choice& c = *choices_[static_cast<size_t>(event.index)];
  if (c.ended) return std::nullopt;
  ChoiceDelta d;
  d.index = event.index;
  ServeMetrics& metrics = engine_.metrics();
  const GenerationUpdate& u = event.update;
  if (!u.prompt_logprobs.empty()) prompt_logprobs_ = u.prompt_logprobs;
  const bool first_scored = spec_.score_prompt && !c.scores_sent;
  if (first_scored) {
    d.prompt_logprobs = prompt_logprobs_;
    c.scores_sent = true;
  }
  for (size_t k = 0; k < u.tokens.size() && !c.stop_found; ++k) {
    if (c.n_tokens == 0) {
      metrics.observe_ttft(static_cast<double>(event.t_us - t_arrival_us_) / 1e6);
    } else {
      metrics.observe_itl(k == 0 ? static_cast<double>(event.t_us - c.t_last_token_us) / 1e6 : 0.0);
    }
    c.t_last_token_us = event.t_us;
    c.n_tokens++;
    const Token t = u.tokens[k];
    d.tokens.push_back(t);
    if (k < u.logprobs.size()) d.logprobs.push_back(u.logprobs[k]);
    // A stop token (EOS, or a request's stop_token_ids) ends the text, adding none.
    const bool is_stop_token =
        std::find(spec_.stop_tokens.begin(), spec_.stop_tokens.end(), t) != spec_.stop_tokens.end();
    if (!is_stop_token) d.text += c.matcher.push(c.decoder.feed(t));
    if (c.matcher.stopped()) {
      c.stop_found = true;
      c.handle.cancel();
      d.finish_reason = "stop";
    }
  }
  if (u.finish_reason) {
    c.ended = true;
    if (!c.stop_found) {
      d.text += c.matcher.push(c.decoder.flush());
      if (c.matcher.stopped()) {
        d.finish_reason = "stop";
      } else {
        d.text += c.matcher.finish();
        d.finish_reason = finish_name(*u.finish_reason);
        if (*u.finish_reason == FinishReason::kFailed) d.error_message = u.error_message;
      }
    }
    metrics.count_finish(c.stop_found ? "stop" : *d.finish_reason);
    // A stop string already sent its finish; the terminal update adds nothing.
    if (c.stop_found && d.tokens.empty() && d.text.empty() && !d.finish_reason) {
      return std::nullopt;
    }
  }
  if (d.text.empty() && d.tokens.empty() && !d.finish_reason && !first_scored) return std::nullopt;
  return d;
}

void Job::release_ended_sessions() {
  if (!clones_started_) return;  // choice 0's session is the clones' source
  for (const auto& c : choices_) {
    if (c->ended && c->session.valid()) c->session = Session();
  }
}

JobSummary Job::run(JobSink& sink) {
  JobSummary summary;
  summary.prompt_tokens = static_cast<int64_t>(spec_.prompt.size());
  summary.prompt_tokens_cached = prompt_tokens_cached_;
  auto all_ended = [&] {
    for (const auto& c : choices_) {
      if (!c->ended) return false;
    }
    return true;
  };
  auto client_gone = [&] {
    if (!summary.client_gone) {
      summary.client_gone = true;
      cancel();
    }
  };
  if (spec_.n == 1) clones_started_ = true;
  auto t_next_poll = std::chrono::steady_clock::now() + kPollInterval;
  while (!all_ended()) {
    std::deque<Event> events;
    {
      std::unique_lock<std::mutex> lock(channel_->mu);
      channel_->cv.wait_until(lock, t_next_poll, [&] { return !channel_->events.empty(); });
      events.swap(channel_->events);
    }
    for (Event& e : events) {
      const bool first_of_choice0 = e.index == 0 && !e.update.tokens.empty();
      std::optional<ChoiceDelta> d = process(e);
      if (d && !summary.client_gone && !sink.deliver(*d)) client_gone();
      // The prompt is in the cache once choice 0 has its first token (or has
      // ended): the other choices start from it.
      if (!clones_started_ && (first_of_choice0 || choices_[0]->ended)) start_clones();
      release_ended_sessions();
    }
    if (std::chrono::steady_clock::now() >= t_next_poll) {
      if (!summary.client_gone && !sink.alive()) client_gone();
      t_next_poll = std::chrono::steady_clock::now() + kPollInterval;
    }
    if (summary.client_gone && !clones_started_) {
      clones_started_ = true;
      for (size_t i = 1; i < choices_.size(); ++i) choices_[i]->ended = true;
      release_ended_sessions();
    }
  }
  for (const auto& c : choices_) summary.completion_tokens += c->n_tokens;
  engine_.metrics().add_tokens(0, summary.completion_tokens);
  return summary;
}

}  // namespace cellm::serve
