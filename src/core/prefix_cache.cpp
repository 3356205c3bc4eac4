// PrefixCache and PromptCapture (include/cellm/prefix_cache.h).
#include "cellm/prefix_cache.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <mutex>
#include <utility>

#include "cellm/status.h"

namespace cellm {
namespace detail {

// Shared by a PromptCapture and every callback it wrapped. The callbacks run on
// the engine thread, collect() and discard() on the caller's: mu guards the
// mutable fields.
struct PromptCaptureState {
  PromptCaptureState(SessionRef src, std::vector<Token> tokens)
      : source(std::move(src)),
        prompt(std::move(tokens)),
        upto(static_cast<Position>(prompt.size())) {}

  const SessionRef source;          // never the Session wrapper: it may move or die
  const std::vector<Token> prompt;  // the snapshot's key
  const Position upto;              // the prompt's length, where the clone is taken

  std::mutex mu;
  bool queued = false;  // guarded by mu; the clone was queued (at most once)
  bool closed = false;  // guarded by mu; collected or discarded: no clone from now on
  std::future<std::optional<Session>> clone;  // guarded by mu; valid once queued

  // Queues the prompt's clone unless one was queued or the capture is closed.
  void capture_once() {
    std::lock_guard<std::mutex> lock(mu);
    if (queued || closed) return;
    queued = true;
    clone = source.clone_async(upto);
  }
};

}  // namespace detail

namespace {

size_t common_prefix(std::span<const Token> a, std::span<const Token> b, size_t cap) {
  const size_t n = std::min({a.size(), b.size(), cap});
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

constexpr size_t kMaxKeyTokens = static_cast<size_t>(std::numeric_limits<Position>::max());

}  // namespace

// ---------------------------------------------------------------------------
// PromptCapture

PromptCapture::PromptCapture(PromptCapture&& other) noexcept
    : cache_(std::exchange(other.cache_, nullptr)), state_(std::move(other.state_)) {}

PromptCapture& PromptCapture::operator=(PromptCapture&& other) noexcept {
  if (this != &other) {
    discard();
    cache_ = std::exchange(other.cache_, nullptr);
    state_ = std::move(other.state_);
  }
  return *this;
}

PromptCapture::~PromptCapture() {
  discard();
}

void PromptCapture::discard() {
  if (!state_) return;
  // Dropping the future releases the clone: at once if it has arrived, else
  // when the engine answers the queued command.
  std::future<std::optional<Session>> abandoned;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->closed) {
      state_->closed = true;
      abandoned = std::move(state_->clone);
    }
  }
  state_.reset();
  cache_ = nullptr;
}

bool PromptCapture::active() const {
  if (!state_ || cache_ == nullptr) return false;
  std::lock_guard<std::mutex> lock(state_->mu);
  return !state_->closed;
}

GenerationCallback PromptCapture::wrap(GenerationCallback on_update) const {
  return [state = state_, on_update = std::move(on_update)](const GenerationUpdate& update) {
    if (state && !update.tokens.empty()) state->capture_once();
    if (on_update) on_update(update);
  };
}

bool PromptCapture::collect() {
  if (!state_ || cache_ == nullptr) return false;
  std::future<std::optional<Session>> clone;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->closed) return false;
    state_->closed = true;
    if (!state_->queued) return false;
    clone = std::move(state_->clone);
  }
  std::optional<Session> snapshot = clone.get();
  if (!snapshot) return false;
  return cache_->insert(state_->prompt, std::move(*snapshot));
}

// ---------------------------------------------------------------------------
// PrefixCache

PrefixCache::PrefixCache(size_t max_entries) : max_entries_(max_entries) {}

PromptCapture PrefixCache::capture_prompt(const Session& source, std::vector<Token> prompt) {
  if (!enabled() || !source.valid() || prompt.empty() || prompt.size() > kMaxKeyTokens) {
    return PromptCapture();
  }
  return PromptCapture(
      this, std::make_shared<detail::PromptCaptureState>(source.ref(), std::move(prompt)));
}

bool PrefixCache::insert(std::vector<Token> tokens, Session snapshot) {
  // On every refusal `snapshot` is released (its close queued) on return.
  if (!enabled() || tokens.empty() || tokens.size() > kMaxKeyTokens || !snapshot.valid() ||
      snapshot.position() != static_cast<Position>(tokens.size())) {
    return false;
  }
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->tokens == tokens) {
      entries_.splice(entries_.begin(), entries_, it);
      return true;
    }
  }
  entries_.push_front(Entry{std::move(tokens), std::move(snapshot)});
  while (entries_.size() > max_entries_) entries_.pop_back();
  return true;
}

void PrefixCache::check_invariants() const {
  CELLM_CHECK(entries_.size() <= max_entries_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    CELLM_CHECK(!it->tokens.empty());
    CELLM_CHECK(it->snapshot.valid());
    CELLM_CHECK_MSG(it->snapshot.position() == static_cast<Position>(it->tokens.size()),
                    "a snapshot moved away from its key");
    for (auto other = std::next(it); other != entries_.end(); ++other) {
      CELLM_CHECK_MSG(other->tokens != it->tokens, "two entries share a key");
    }
  }
}

std::optional<PrefixMatch> PrefixCache::lookup(std::span<const Token> request) {
  n_lookups_++;
  if (!enabled() || request.size() < 2) return std::nullopt;
  // The final token always gets a fresh forward under the new sampling policy.
  const size_t cap = request.size() - 1;

  struct Candidate {
    std::list<Entry>::iterator entry;
    size_t matched_tokens = 0;
  };
  std::vector<Candidate> candidates;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const size_t matched = common_prefix(it->tokens, request, cap);
    if (matched > 0) candidates.push_back({it, matched});
  }
  // Stable: among equal matches the list order (most recent first) stays.
  std::stable_sort(
      candidates.begin(), candidates.end(),
      [](const Candidate& a, const Candidate& b) { return a.matched_tokens > b.matched_tokens; });

  for (const Candidate& c : candidates) {
    const auto upto = static_cast<Position>(c.matched_tokens);
    std::future<std::optional<Session>> clone = c.entry->snapshot.clone_async(upto);
    std::optional<Session> session = clone.get();
    if (!session) continue;  // refused: the next snapshot, never a shorter boundary
    CELLM_CHECK_MSG(session->position() == upto, "a clone is not at its requested position");
    entries_.splice(entries_.begin(), entries_, c.entry);
    n_hits_++;
    n_matched_tokens_ += static_cast<int64_t>(c.matched_tokens);
    return PrefixMatch{std::move(*session), c.matched_tokens};
  }
  return std::nullopt;
}

}  // namespace cellm
