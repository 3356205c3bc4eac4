#include "cellm/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tokenizer_impl.h"

namespace cellm {
namespace {

using nlohmann::json;

// The parsed JSON of `path`; NotFound when absent (and `required`), else
// nullopt. Malformed JSON is InvalidProgram naming the file.
Result<std::optional<json>> read_json(const std::filesystem::path& path, bool required) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    if (!required) return std::optional<json>();
    return NotFound(path.string() + ": no such file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError(path.string() + ": cannot open for reading");
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return IoError(path.string() + ": read failed");
  try {
    return std::optional<json>(json::parse(buffer.str()));
  } catch (const json::exception& e) {
    return InvalidProgram(path.string() + ": malformed JSON: " + e.what());
  }
}

Status with_file(const std::filesystem::path& path, const Status& status) {
  return Status(status.code(), path.string() + ": " + status.message());
}

// A token string from tokenizer_config.json: "text", {"content": "text"} or null.
std::optional<std::string> token_string(const json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const json& value = config.at(key);
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value.at("content").is_string()) {
    return value.at("content").get<std::string>();
  }
  return std::nullopt;
}

// An id field: an int, a list of ints, or absent/null.
std::vector<Token> id_list(const json& config, const char* key) {
  std::vector<Token> ids;
  if (!config.contains(key)) return ids;
  const json& value = config.at(key);
  if (value.is_number_integer()) ids.push_back(value.get<Token>());
  if (value.is_array()) {
    for (const json& v : value) {
      if (v.is_number_integer()) ids.push_back(v.get<Token>());
    }
  }
  return ids;
}

Status parse_pipeline(const json& j, Tokenizer::Impl& impl) {
  const json& model = j.at("model");
  const std::string type = model.value("type", model.contains("merges") ? "BPE" : "");
  if (type != "BPE") {
    return NotSupported("model type '" + type + "' is not supported (only BPE)");
  }
  CELLM_ASSIGN_OR_RETURN(impl.model, BpeModel::parse(model));
  CELLM_ASSIGN_OR_RETURN(impl.added,
                         AddedVocabulary::parse(j.value("added_tokens", json::array())));
  CELLM_ASSIGN_OR_RETURN(impl.normalizer, parse_normalizer(j.value("normalizer", json())));
  CELLM_ASSIGN_OR_RETURN(impl.pre_tokenizer, parse_pre_tokenizer(j.value("pre_tokenizer", json())));
  CELLM_ASSIGN_OR_RETURN(impl.post_processor,
                         parse_post_processor(j.value("post_processor", json())));
  CELLM_ASSIGN_OR_RETURN(impl.decoder, parse_decoder(j.value("decoder", json())));
  impl.vocab_size = impl.model.id_limit();
  for (const AddedToken& t : impl.added.tokens()) {
    impl.vocab_size = std::max(impl.vocab_size, static_cast<size_t>(t.id) + 1);
  }
  return Status::Ok();
}

}  // namespace

Result<Tokenizer> Tokenizer::load(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return NotFound(dir.string() + ": the model folder does not exist (no tokenizer.json)");
  }
  auto impl = std::make_shared<Impl>();

  const std::filesystem::path tokenizer_path = dir / "tokenizer.json";
  CELLM_ASSIGN_OR_RETURN(std::optional<json> tokenizer_json, read_json(tokenizer_path, true));
  try {
    if (Status s = parse_pipeline(*tokenizer_json, *impl); !s.ok()) {
      return with_file(tokenizer_path, s);
    }
  } catch (const json::exception& e) {
    return InvalidProgram(tokenizer_path.string() + ": unexpected structure: " + e.what());
  }
  tokenizer_json.reset();

  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  CELLM_ASSIGN_OR_RETURN(std::optional<json> tokenizer_config, read_json(config_path, true));
  CELLM_ASSIGN_OR_RETURN(std::optional<json> generation_config,
                         read_json(dir / "generation_config.json", false));
  CELLM_ASSIGN_OR_RETURN(std::optional<json> model_config, read_json(dir / "config.json", false));

  const auto resolve = [&](const std::optional<std::string>& name,
                           const char* key) -> Result<std::optional<Token>> {
    if (!name) return std::optional<Token>();
    Tokenizer probe;
    probe.impl_ = impl;
    if (std::optional<Token> id = probe.token_to_id(*name)) return id;
    return InvalidProgram(config_path.string() + ": " + key + " '" + *name +
                          "' is not in the vocabulary");
  };
  std::vector<Token> bos_candidates;
  std::vector<Token> eos_candidates;
  for (const std::optional<json>* config : {&generation_config, &model_config}) {
    if (!*config || !(*config)->is_object()) continue;
    for (Token id : id_list(**config, "bos_token_id")) bos_candidates.push_back(id);
    for (Token id : id_list(**config, "eos_token_id")) eos_candidates.push_back(id);
  }
  if (tokenizer_config->is_object()) {
    CELLM_ASSIGN_OR_RETURN(std::optional<Token> bos,
                           resolve(token_string(*tokenizer_config, "bos_token"), "bos_token"));
    CELLM_ASSIGN_OR_RETURN(std::optional<Token> eos,
                           resolve(token_string(*tokenizer_config, "eos_token"), "eos_token"));
    if (bos) bos_candidates.push_back(*bos);
    if (eos) eos_candidates.push_back(*eos);
  }
  if (!bos_candidates.empty()) impl->bos_id = bos_candidates.front();
  for (Token id : eos_candidates) {
    if (std::find(impl->eos_ids.begin(), impl->eos_ids.end(), id) == impl->eos_ids.end()) {
      impl->eos_ids.push_back(id);
    }
  }
  Tokenizer tokenizer;
  tokenizer.impl_ = std::move(impl);
  return tokenizer;
}

std::vector<Token> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& impl = *impl_;
  std::vector<Token> ids;
  ids.reserve(text.size() / 3 + 4);
  for (const Segment& raw : impl.added.split(text, /*normalized=*/false)) {
    if (raw.id) {
      ids.push_back(*raw.id);
      continue;
    }
    const bool raw_at_start = raw.text.data() == text.data();
    const std::string normalized =
        impl.normalizer ? impl.normalizer->normalize(raw.text) : std::string(raw.text);
    for (const Segment& part : impl.added.split(normalized, /*normalized=*/true)) {
      if (part.id) {
        ids.push_back(*part.id);
        continue;
      }
      std::vector<PreToken> pieces;
      pieces.push_back(
          {std::string(part.text), raw_at_start && part.text.data() == normalized.data()});
      if (impl.pre_tokenizer) impl.pre_tokenizer->pre_tokenize(pieces);
      for (const PreToken& piece : pieces) impl.model.encode_word(piece.text, ids);
    }
  }
  if (add_special_tokens && impl.post_processor) impl.post_processor->process(ids);
  return ids;
}

std::string Tokenizer::Impl::decode(std::span<const Token> ids, bool skip_special_tokens,
                                    DecodeState& state) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (Token id : ids) {
    if (const AddedToken* added_token = added.find(id)) {
      if (!(skip_special_tokens && added_token->special)) tokens.push_back(added_token->content);
    } else if (const std::string* token = model.id_to_token(id)) {
      tokens.push_back(*token);
    }
  }
  return decode_tokens(decoder.get(), std::move(tokens), state);
}

std::string Tokenizer::decode(std::span<const Token> ids, bool skip_special_tokens) const {
  DecodeState state;
  return impl_->decode(ids, skip_special_tokens, state);
}

size_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}
std::optional<Token> Tokenizer::bos_id() const {
  return impl_->bos_id;
}
const std::vector<Token>& Tokenizer::eos_ids() const {
  return impl_->eos_ids;
}

std::optional<Token> Tokenizer::token_to_id(std::string_view token) const {
  if (std::optional<Token> id = impl_->added.find(token)) return id;
  return impl_->model.token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(Token id) const {
  if (const AddedToken* t = impl_->added.find(id)) return t->content;
  if (const std::string* t = impl_->model.id_to_token(id)) return *t;
  return std::nullopt;
}

bool Tokenizer::is_special(Token id) const {
  const AddedToken* t = impl_->added.find(id);
  return t != nullptr && t->special;
}

}  // namespace cellm
