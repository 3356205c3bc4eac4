#include "post_processor.h"

#include <map>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

namespace cellm {
namespace {

using Ptr = std::unique_ptr<const PostProcessor>;

// The "single" template: special-token ids and the sequence, in order.
class TemplateProcessor final : public PostProcessor {
 public:
  // Each piece is either the ids of a special token or the sequence (monostate).
  using Piece = std::variant<std::monostate, std::vector<Token>>;
  explicit TemplateProcessor(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  void process(std::vector<Token>& ids) const override {
    std::vector<Token> out;
    out.reserve(ids.size() + pieces_.size());
    for (const Piece& piece : pieces_) {
      if (const auto* special = std::get_if<std::vector<Token>>(&piece)) {
        out.insert(out.end(), special->begin(), special->end());
      } else {
        out.insert(out.end(), ids.begin(), ids.end());
      }
    }
    ids = std::move(out);
  }

 private:
  std::vector<Piece> pieces_;
};

class IdentityProcessor final : public PostProcessor {
 public:
  void process(std::vector<Token>&) const override {}
};

class SequenceProcessor final : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<Ptr> parts) : parts_(std::move(parts)) {}
  void process(std::vector<Token>& ids) const override {
    for (const auto& part : parts_) part->process(ids);
  }

 private:
  std::vector<Ptr> parts_;
};

Result<Ptr> parse_template(const nlohmann::json& j) {
  std::map<std::string, std::vector<Token>> specials;
  if (j.contains("special_tokens")) {
    for (const auto& [name, value] : j.at("special_tokens").items()) {
      specials[name] = value.at("ids").get<std::vector<Token>>();
    }
  }
  const nlohmann::json& single = j.at("single");
  if (!single.is_array()) {
    return NotSupported("TemplateProcessing 'single' must be a list of pieces");
  }
  std::vector<TemplateProcessor::Piece> pieces;
  for (const nlohmann::json& piece : single) {
    if (piece.contains("Sequence")) {
      pieces.emplace_back(std::monostate{});
      continue;
    }
    if (piece.contains("SpecialToken")) {
      const std::string id = piece.at("SpecialToken").at("id").get<std::string>();
      const auto it = specials.find(id);
      if (it == specials.end()) {
        return InvalidProgram("TemplateProcessing uses special token '" + id +
                              "', which special_tokens does not define");
      }
      pieces.emplace_back(it->second);
      continue;
    }
    return InvalidProgram("TemplateProcessing piece " + piece.dump() + " is not understood");
  }
  return Ptr(new TemplateProcessor(std::move(pieces)));
}

}  // namespace

Result<Ptr> parse_post_processor(const nlohmann::json& j) {
  if (j.is_null()) return Ptr();
  const std::string type = j.at("type").get<std::string>();
  if (type == "TemplateProcessing") return parse_template(j);
  if (type == "ByteLevel") return Ptr(new IdentityProcessor());
  if (type == "Sequence") {
    std::vector<Ptr> parts;
    for (const nlohmann::json& part : j.at("processors")) {
      CELLM_ASSIGN_OR_RETURN(Ptr p, parse_post_processor(part));
      if (p) parts.push_back(std::move(p));
    }
    return Ptr(new SequenceProcessor(std::move(parts)));
  }
  return NotSupported("post-processor type '" + type + "' is not supported");
}

}  // namespace cellm
