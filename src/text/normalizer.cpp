#include "normalizer.h"

#include <algorithm>
#include <vector>

#include <nlohmann/json.hpp>

#include "regex.h"
#include "unicode.h"

namespace cellm {
namespace {

class NfcNormalizer final : public Normalizer {
 public:
  std::string normalize(std::string_view text) const override { return unicode::nfc(text); }
};

class NfdNormalizer final : public Normalizer {
 public:
  std::string normalize(std::string_view text) const override { return unicode::nfd(text); }
};

// Prepends a string to non-empty text.
class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prepend) : prepend_(std::move(prepend)) {}
  std::string normalize(std::string_view text) const override {
    if (text.empty()) return {};
    return prepend_ + std::string(text);
  }

 private:
  std::string prepend_;
};

// Replaces every match of a pattern with a fixed string.
class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string normalize(std::string_view text) const override {
    std::string out;
    size_t copied = 0;
    for (const Match& m : pattern_.find_all(text)) {
      out.append(text.substr(copied, m.begin - copied)).append(content_);
      copied = m.end;
    }
    out.append(text.substr(copied));
    return out;
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// Removes White_Space characters at either end.
class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string normalize(std::string_view text) const override {
    size_t begin = 0;
    size_t end = text.size();
    if (left_) {
      while (begin < end) {
        const unicode::Utf8Unit u = unicode::decode_utf8(text, begin);
        if (!u.valid || !unicode::is_whitespace(u.code_point)) break;
        begin += u.size_bytes;
      }
    }
    if (right_) {
      // Walk forward to find the start of the trailing whitespace run.
      size_t trailing = begin;
      for (size_t i = begin; i < end;) {
        const unicode::Utf8Unit u = unicode::decode_utf8(text, i);
        const bool space = u.valid && unicode::is_whitespace(u.code_point);
        if (!space) trailing = i + u.size_bytes;
        i += u.size_bytes;
      }
      end = trailing;
    }
    return std::string(text.substr(begin, end - begin));
  }

 private:
  bool left_;
  bool right_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<const Normalizer>> parts)
      : parts_(std::move(parts)) {}
  std::string normalize(std::string_view text) const override {
    std::string current(text);
    for (const auto& part : parts_) current = part->normalize(current);
    return current;
  }

 private:
  std::vector<std::unique_ptr<const Normalizer>> parts_;
};

}  // namespace

Result<std::unique_ptr<const Normalizer>> parse_normalizer(const nlohmann::json& j) {
  if (j.is_null()) return std::unique_ptr<const Normalizer>();
  const std::string type = j.at("type").get<std::string>();
  if (type == "NFC") return std::unique_ptr<const Normalizer>(new NfcNormalizer());
  if (type == "NFD") return std::unique_ptr<const Normalizer>(new NfdNormalizer());
  if (type == "Prepend") {
    return std::unique_ptr<const Normalizer>(
        new PrependNormalizer(j.at("prepend").get<std::string>()));
  }
  if (type == "Replace") {
    CELLM_ASSIGN_OR_RETURN(Pattern pattern, Pattern::parse(j.at("pattern")));
    return std::unique_ptr<const Normalizer>(
        new ReplaceNormalizer(std::move(pattern), j.at("content").get<std::string>()));
  }
  if (type == "Strip") {
    return std::unique_ptr<const Normalizer>(
        new StripNormalizer(j.value("strip_left", true), j.value("strip_right", true)));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<const Normalizer>> parts;
    for (const nlohmann::json& part : j.at("normalizers")) {
      CELLM_ASSIGN_OR_RETURN(std::unique_ptr<const Normalizer> p, parse_normalizer(part));
      if (p) parts.push_back(std::move(p));
    }
    return std::unique_ptr<const Normalizer>(new SequenceNormalizer(std::move(parts)));
  }
  return NotSupported("normalizer type '" + type + "' is not supported");
}

}  // namespace cellm
