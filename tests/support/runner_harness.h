// Helpers shared by the runner tests: an update recorder, a Runner over a
// FakeExecutor and a DecodeFirstScheduler, and small builders.
//
// Thread-safety: Updates may be fed from the engine thread while a test thread
// reads it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cellm/runner.h"
#include "cellm/scheduler.h"
#include "support/fake_executor.h"

namespace cellm::testing {

inline constexpr auto kTimeout = std::chrono::seconds(5);

// Records every update of one generation.
class Updates {
 public:
  void operator()(const GenerationUpdate& update);
  // Waits for the terminal update; false after kTimeout.
  bool wait() const;
  std::vector<Token> tokens() const;
  std::vector<std::vector<Token>> bursts() const;  // tokens of each update
  std::vector<TokenLogprobs> logprobs() const;     // every update's, in order
  // True if every update's logprobs were empty or parallel to its tokens.
  bool logprobs_parallel() const;
  std::optional<FinishReason> finish() const;
  std::string error_message() const;
  int calls() const;
  int terminal_calls() const;
  std::thread::id last_thread() const;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::vector<std::vector<Token>> bursts_;
  std::vector<TokenLogprobs> logprobs_;
  bool logprobs_parallel_ = true;
  std::optional<FinishReason> finish_;
  std::string error_message_;
  int calls_ = 0;
  int terminal_calls_ = 0;
  std::thread::id last_thread_;
};

// A callback feeding `updates`.
GenerationCallback into(const std::shared_ptr<Updates>& updates);

// DecodeFirstScheduler sized (2 * chunk + max_decode, max_decode, chunk).
std::unique_ptr<Scheduler> make_scheduler(size_t max_decode_sequences = 4,
                                          size_t max_prefill_chunk_size = 8);

struct Fixture {
  explicit Fixture(FakeExecutor& executor, size_t max_decode_sequences = 4,
                   size_t max_prefill_chunk_size = 8)
      : runner(executor, make_scheduler(max_decode_sequences, max_prefill_chunk_size)) {}
  Runner runner;
};

// Opens a session, failing the test (and returning an invalid one) on refusal
// or timeout.
Session open_session(Runner& runner);

// Waits for a future that must settle; nullopt (and a test failure) on timeout.
std::optional<Session> settle(std::future<std::optional<Session>>& future);

// True once the runner refuses new work (opens settle at once as nullopt).
// Spins until the stop is requested; false after kTimeout.
bool wait_until_stopping(Runner& runner);

std::vector<Token> tokens(int n, Token first = 100);
GenConfig config(int32_t max_new_tokens);

// Generates with a fresh Updates recorder.
GenerationHandle generate(Session& session, std::vector<Token> delta, const GenConfig& cfg,
                          const std::shared_ptr<Updates>& updates);

// The token the FakeExecutor produces after position p of session sid.
inline Token t(SessionId sid, Position p) {
  return FakeExecutor::token_at(sid, p);
}

// How many of the executor's recorded calls start with `prefix`.
inline size_t count_calls(const FakeExecutor& executor, const std::string& prefix) {
  size_t n = 0;
  for (const std::string& call : executor.calls()) n += call.rfind(prefix, 0) == 0 ? 1 : 0;
  return n;
}

}  // namespace cellm::testing
