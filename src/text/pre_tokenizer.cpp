#include "pre_tokenizer.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "regex.h"
#include "unicode.h"

namespace cellm {
namespace {

// What a split keeps of each delimiter (a match of the pattern).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Result<SplitBehavior> parse_behavior(const std::string& name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return NotSupported("split behavior '" + name + "' is not supported");
}

struct Span {
  size_t begin;
  size_t end;
  bool is_delimiter;
};

// Splits `piece` at `matches` as Hugging Face's NormalizedString::split does,
// appending the non-empty results to `out`.
void split_piece(const PreToken& piece, const std::vector<Match>& matches, bool invert,
                 SplitBehavior behavior, std::vector<PreToken>& out) {
  const std::string& text = piece.text;
  // Cover the whole text with spans, each a match or a gap between matches.
  std::vector<Span> spans;
  size_t previous = 0;
  for (const Match& m : matches) {
    if (previous != m.begin) spans.push_back({previous, m.begin, invert});
    spans.push_back({m.begin, m.end, !invert});
    previous = m.end;
  }
  if (previous != text.size()) spans.push_back({previous, text.size(), invert});

  std::vector<Span> merged;  // is_delimiter now means "remove"
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Span& s : spans) merged.push_back({s.begin, s.end, false});
      break;
    case SplitBehavior::kRemoved:
      merged = spans;
      break;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_delimiter == previous_match && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back({s.begin, s.end, false});
        }
        previous_match = s.is_delimiter;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_delimiter && !previous_match && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back({s.begin, s.end, false});
        }
        previous_match = s.is_delimiter;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_delimiter && !previous_match && !merged.empty()) {
          merged.back().begin = it->begin;
        } else {
          merged.push_back({it->begin, it->end, false});
        }
        previous_match = it->is_delimiter;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    }
  }
  for (const Span& s : merged) {
    if (s.is_delimiter || s.begin == s.end) continue;
    out.push_back({text.substr(s.begin, s.end - s.begin), piece.at_input_start && s.begin == 0});
  }
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}

  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    std::vector<PreToken> out;
    out.reserve(pieces.size() * 4);
    for (const PreToken& piece : pieces) {
      split_piece(piece, pattern_.find_all(piece.text), invert_, behavior_, out);
    }
    pieces = std::move(out);
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Maps every byte to GPT-2's printable alphabet, optionally after a regex split.
class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::shared_ptr<const Regex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}

  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    std::vector<PreToken> split;
    for (PreToken& piece : pieces) {
      if (add_prefix_space_ && (piece.text.empty() || piece.text[0] != ' ')) {
        piece.text = " " + piece.text;
      }
      if (regex_) {
        split_piece(piece, regex_->find_all(piece.text), false, SplitBehavior::kIsolated, split);
      } else if (!piece.text.empty()) {
        split.push_back(std::move(piece));
      }
    }
    for (PreToken& piece : split) {
      std::string mapped;
      mapped.reserve(piece.text.size() * 2);
      for (char c : piece.text) {
        unicode::append_utf8(mapped, unicode::byte_to_char(static_cast<uint8_t>(c)));
      }
      piece.text = std::move(mapped);
    }
    pieces = std::move(split);
  }

 private:
  bool add_prefix_space_;
  std::shared_ptr<const Regex> regex_;  // null when use_regex is false
};

enum class PrependScheme { kAlways, kFirst, kNever };

// SentencePiece's space handling: spaces become `replacement`, which may be
// prepended and may start each piece.
class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}

  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    std::vector<PreToken> out;
    for (PreToken& piece : pieces) {
      std::string replaced;
      for (char c : piece.text) {
        if (c == ' ') {
          replaced.append(replacement_);
        } else {
          replaced.push_back(c);
        }
      }
      const bool starts_with_replacement = replaced.starts_with(replacement_);
      if (!starts_with_replacement &&
          (scheme_ == PrependScheme::kAlways ||
           (scheme_ == PrependScheme::kFirst && piece.at_input_start))) {
        replaced = replacement_ + replaced;
      }
      piece.text = std::move(replaced);
      if (!split_) {
        if (!piece.text.empty()) out.push_back(std::move(piece));
        continue;
      }
      std::vector<Match> matches;
      for (size_t at = piece.text.find(replacement_); at != std::string::npos;
           at = piece.text.find(replacement_, at + replacement_.size())) {
        matches.push_back({at, at + replacement_.size()});
      }
      split_piece(piece, matches, false, SplitBehavior::kMergedWithNext, out);
    }
    pieces = std::move(out);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<const PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    for (const auto& part : parts_) part->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<const PreTokenizer>> parts_;
};

}  // namespace

Result<std::unique_ptr<const PreTokenizer>> parse_pre_tokenizer(const nlohmann::json& j) {
  using Ptr = std::unique_ptr<const PreTokenizer>;
  if (j.is_null()) return Ptr();
  const std::string type = j.at("type").get<std::string>();
  if (type == "Split") {
    CELLM_ASSIGN_OR_RETURN(Pattern pattern, Pattern::parse(j.at("pattern")));
    CELLM_ASSIGN_OR_RETURN(SplitBehavior behavior,
                           parse_behavior(j.at("behavior").get<std::string>()));
    return Ptr(new SplitPreTokenizer(std::move(pattern), behavior, j.value("invert", false)));
  }
  if (type == "ByteLevel") {
    std::shared_ptr<const Regex> regex;
    if (j.value("use_regex", true)) {
      CELLM_ASSIGN_OR_RETURN(Regex compiled, Regex::compile(kGpt2Pattern));
      regex = std::make_shared<const Regex>(std::move(compiled));
    }
    return Ptr(new ByteLevelPreTokenizer(j.value("add_prefix_space", true), std::move(regex)));
  }
  if (type == "Metaspace") {
    PrependScheme scheme = PrependScheme::kAlways;
    if (j.contains("prepend_scheme")) {
      const std::string name = j.at("prepend_scheme").get<std::string>();
      if (name == "always") {
        scheme = PrependScheme::kAlways;
      } else if (name == "first") {
        scheme = PrependScheme::kFirst;
      } else if (name == "never") {
        scheme = PrependScheme::kNever;
      } else {
        return NotSupported("Metaspace prepend_scheme '" + name + "' is not supported");
      }
    } else if (!j.value("add_prefix_space", true)) {
      scheme = PrependScheme::kNever;
    }
    return Ptr(new MetaspacePreTokenizer(j.value("replacement", std::string("\u2581")), scheme,
                                         j.value("split", true)));
  }
  if (type == "Sequence") {
    std::vector<Ptr> parts;
    for (const nlohmann::json& part : j.at("pretokenizers")) {
      CELLM_ASSIGN_OR_RETURN(Ptr p, parse_pre_tokenizer(part));
      if (p) parts.push_back(std::move(p));
    }
    return Ptr(new SequencePreTokenizer(std::move(parts)));
  }
  return NotSupported("pre-tokenizer type '" + type + "' is not supported");
}

}  // namespace cellm
