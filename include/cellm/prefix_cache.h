// PrefixCache: a caller-side LRU of idle snapshot Sessions keyed by their exact
// token history, so a request that shares a prefix with an earlier one starts
// from a clone of it and only forwards the unmatched suffix.
//
// It lives on the application's thread, outside the runner (the runner never
// sees it, so there is no ownership cycle): calls must be serialized by the
// caller and never made from a runner callback, because lookup() and
// PromptCapture::collect() block on clone futures.
//
// lookup(request): match = the common prefix of an entry's key and the request,
// capped at request.size() - 1 so the final token always gets a fresh forward
// under the new sampling policy. Candidates are tried by longest match, then
// most recently used; each once, with clone_async(match): a refusal moves on to
// the next snapshot (never to a shorter boundary of the same one); a hit moves
// its snapshot to the front. Submit request[matched_tokens:] on the returned
// session.
//
// Capture: capture_prompt(source, prompt) -> PromptCapture; generate on
// `source` with capture.wrap(callback): on the first update with tokens the
// wrapper queues source.clone_async(prompt.size()) before forwarding the update,
// so the clone runs at the complete prompt, before the next forward moves the
// session on. After wait(), capture.collect() receives the clone and inserts it.
//
// Keys are tokens only: the caller keeps one cache per model, KV configuration
// and positional semantics. Snapshots count against the executor's session
// capacity like any session (max_entries of them, plus one in-flight clone per
// lookup or capture).
//
// Cost: lookup and insert scan every entry (O(entries x key length)); meant for
// tens of entries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "cellm/runner.h"
#include "cellm/types.h"

namespace cellm {

// A hit: an independent session holding the request's first matched_tokens.
struct PrefixMatch {
  Session session;
  size_t matched_tokens = 0;
};

class PrefixCache;

namespace detail {
struct PromptCaptureState;
}  // namespace detail

// One prompt's pending snapshot. Move-only. Destroying (or moving over) a
// capture that was not collected releases its clone, now or when it arrives;
// wrapped callbacks stay usable and only forward afterwards.
class PromptCapture {
 public:
  PromptCapture() = default;  // inactive
  PromptCapture(PromptCapture&& other) noexcept;
  PromptCapture& operator=(PromptCapture&& other) noexcept;
  PromptCapture(const PromptCapture&) = delete;
  PromptCapture& operator=(const PromptCapture&) = delete;
  ~PromptCapture();

  // True if collect() may insert: an enabled cache, a valid source, a non-empty
  // prompt, and not yet collected or discarded.
  bool active() const;

  // A callback that forwards every update to `on_update` (which may be empty).
  // While the capture is active, the first update with a non-empty token list
  // first queues the prompt's clone. Copies of the returned callback, and the
  // callbacks of several wrap() calls, share the one capture: one clone at most.
  // The callback holds no pointer to the source Session wrapper and does not
  // keep the source session alive; an exception from `on_update` propagates.
  GenerationCallback wrap(GenerationCallback on_update) const;

  // On the caller's thread, after the generation's wait(): blocks on the clone
  // future, then inserts the snapshot. false if nothing was captured, the clone
  // or the insert was refused, or this capture was already collected.
  // REQUIRES: the PrefixCache that made this capture is still alive.
  bool collect();

 private:
  friend class PrefixCache;
  PromptCapture(PrefixCache* cache, std::shared_ptr<detail::PromptCaptureState> state)
      : cache_(cache), state_(std::move(state)) {}
  // Marks the state discarded and releases a clone already received or queued.
  void discard();

  PrefixCache* cache_ = nullptr;
  std::shared_ptr<detail::PromptCaptureState> state_;
};

class PrefixCache {
 public:
  // 0 entries: disabled (inserts release their snapshot, lookups miss).
  explicit PrefixCache(size_t max_entries);
  // Releases (closes, asynchronously) every snapshot it owns; sessions handed
  // out by lookup() are independent and unaffected.
  ~PrefixCache() = default;
  // Captures refer to their cache, so it stays where it was made.
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  size_t max_entries() const { return max_entries_; }
  bool enabled() const { return max_entries_ > 0; }
  size_t size() const { return entries_.size(); }

  // Prepares a snapshot of `source` at the end of `prompt`, which must be the
  // session's whole history once the prompt is in (earlier turns included).
  // Inactive (wrap only forwards) when the cache is disabled, the source is
  // invalid or the prompt is empty.
  PromptCapture capture_prompt(const Session& source, std::vector<Token> prompt);

  // Takes ownership of `snapshot`, an idle session holding exactly `tokens`.
  // true if the cache holds the key afterwards. Refused (false, the snapshot is
  // released) when disabled, when the key is empty, or when the snapshot is
  // invalid or not at position tokens.size(). A key already present keeps its
  // snapshot, moves to the front and releases the new one. Otherwise the new
  // entry goes to the front and the least recently used entries past
  // max_entries are evicted.
  bool insert(std::vector<Token> tokens, Session snapshot);

  // The best reusable prefix of `request` as a new session (see the file
  // comment), or nullopt: a disabled cache, fewer than 2 tokens, no entry
  // sharing a first token, or every candidate's clone refused. Blocks on the
  // clone futures: never call it from a runner callback.
  std::optional<PrefixMatch> lookup(std::span<const Token> request);

  // Releases every snapshot; the counters stay.
  void clear() { entries_.clear(); }

  // Aborts (CELLM_CHECK) unless: at most max_entries entries, keys non-empty
  // and distinct, every snapshot valid and at position key.size().
  void check_invariants() const;

  // Counters for metrics: lookup() calls, hits, and tokens served by hits.
  int64_t lookups() const { return n_lookups_; }
  int64_t hits() const { return n_hits_; }
  int64_t matched_tokens_total() const { return n_matched_tokens_; }

 private:
  struct Entry {
    std::vector<Token> tokens;
    Session snapshot;  // idle, at position tokens.size()
  };

  const size_t max_entries_;
  std::list<Entry> entries_;  // most recently used first
  int64_t n_lookups_ = 0;
  int64_t n_hits_ = 0;
  int64_t n_matched_tokens_ = 0;
};

}  // namespace cellm
