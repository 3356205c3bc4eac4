// StopMatcher: finds OpenAI `stop` strings in a stream of generated text and
// holds back any tail that could still become one, so no part of a stop string
// ever reaches the client.
//
// push(text) appends to what is held and returns the text that is safe to send:
// everything before the earliest complete stop string (then stopped() is true
// and all later text is dropped), or else everything except the longest tail
// that is a proper prefix of some stop string. finish() releases the held tail
// once the generation ended without a stop string. Empty stop strings are
// ignored. Works on bytes: given valid UTF-8 in and valid UTF-8 stop strings,
// every returned piece is valid UTF-8 (a held tail starts where a stop string
// starts, on a character boundary).
//
// Not thread-safe: one matcher per generated stream.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace cellm::serve {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // The text now safe to send (possibly empty). After a stop, always empty.
  std::string push(std::string_view text);
  // The held tail, when the stream ends without a stop (empty after a stop).
  std::string finish();

  bool stopped() const { return stopped_; }
  // The stop string that matched; empty until stopped().
  const std::string& matched() const { return matched_; }
  // Bytes held back now.
  size_t held_bytes() const { return held_.size(); }

 private:
  std::vector<std::string> stops_;  // non-empty
  std::string held_;                // a proper prefix of some stop string, or empty
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace cellm::serve
