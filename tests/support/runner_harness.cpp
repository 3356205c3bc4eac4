#include "support/runner_harness.h"

#include <gtest/gtest.h>

#include <utility>

#include "cellm/decode_first_scheduler.h"

namespace cellm::testing {

void Updates::operator()(const GenerationUpdate& update) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    calls_++;
    last_thread_ = std::this_thread::get_id();
    bursts_.push_back(update.tokens);
    logprobs_.insert(logprobs_.end(), update.logprobs.begin(), update.logprobs.end());
    if (!update.logprobs.empty() && update.logprobs.size() != update.tokens.size()) {
      logprobs_parallel_ = false;
    }
    if (update.finish_reason) {
      terminal_calls_++;
      finish_ = update.finish_reason;
      error_message_ = update.error_message;
    }
  }
  cv_.notify_all();
}

bool Updates::wait() const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, kTimeout, [this] { return finish_.has_value(); });
}

std::vector<Token> Updates::tokens() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Token> all;
  for (const auto& burst : bursts_) all.insert(all.end(), burst.begin(), burst.end());
  return all;
}

std::vector<std::vector<Token>> Updates::bursts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bursts_;
}

std::vector<TokenLogprobs> Updates::logprobs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return logprobs_;
}

bool Updates::logprobs_parallel() const {
  std::lock_guard<std::mutex> lock(mu_);
  return logprobs_parallel_;
}

std::optional<FinishReason> Updates::finish() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finish_;
}

std::string Updates::error_message() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_message_;
}

int Updates::calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return calls_;
}

int Updates::terminal_calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return terminal_calls_;
}

std::thread::id Updates::last_thread() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_thread_;
}

GenerationCallback into(const std::shared_ptr<Updates>& updates) {
  return [updates](const GenerationUpdate& update) { (*updates)(update); };
}

std::unique_ptr<Scheduler> make_scheduler(size_t max_decode_sequences,
                                          size_t max_prefill_chunk_size) {
  auto scheduler = DecodeFirstScheduler::create(2 * max_prefill_chunk_size + max_decode_sequences,
                                                max_decode_sequences, max_prefill_chunk_size);
  EXPECT_TRUE(scheduler.ok()) << scheduler.status().to_string();
  return std::move(scheduler).value();
}

std::optional<Session> settle(std::future<std::optional<Session>>& future) {
  if (future.wait_for(kTimeout) != std::future_status::ready) {
    ADD_FAILURE() << "a session future did not settle";
    return std::nullopt;
  }
  return future.get();
}

Session open_session(Runner& runner) {
  auto future = runner.open_session_async();
  std::optional<Session> session = settle(future);
  EXPECT_TRUE(session.has_value()) << "open_session_async was refused";
  return session ? std::move(*session) : Session{};
}

bool wait_until_stopping(Runner& runner) {
  const auto deadline = std::chrono::steady_clock::now() + kTimeout;
  while (std::chrono::steady_clock::now() < deadline) {
    auto probe = runner.open_session_async();
    if (probe.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      EXPECT_FALSE(probe.get().has_value());
      return true;
    }
    std::this_thread::yield();
  }
  return false;
}

std::vector<Token> tokens(int n, Token first) {
  std::vector<Token> out;
  for (int i = 0; i < n; ++i) out.push_back(first + i);
  return out;
}

GenConfig config(int32_t max_new_tokens) {
  GenConfig c;
  c.max_new_tokens = max_new_tokens;
  return c;
}

GenerationHandle generate(Session& session, std::vector<Token> delta, const GenConfig& cfg,
                          const std::shared_ptr<Updates>& updates) {
  return session.generate_async(std::move(delta), cfg, into(updates));
}

}  // namespace cellm::testing
