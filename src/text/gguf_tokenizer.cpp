// Tokenizer::from_gguf: the tokenizer of a GGUF file's metadata, built as the
// tokenizer.json pipeline Hugging Face uses for the same model, then parsed by the
// same code as tokenizer.json (so encode/decode behave identically).
//
// tokenizer.ggml.model "gpt2" (byte-level BPE: Llama 3, Qwen2/3, SmolLM):
//   model      BPE over the normal tokens (type 1) with the file's merges, in order;
//              ignore_merges for llama-bpe (as Llama 3's tokenizer.json sets it)
//   added      control tokens (type 3) as special, user-defined ones (type 4) not
//   normalizer NFC for qwen2, none otherwise
//   pre        by tokenizer.ggml.pre: default/gpt2 the GPT-2 split; llama-bpe the
//              Llama 3 split; qwen2 the Qwen2 split (digits one by one); smollm
//              digits one by one, then the GPT-2 split; then the byte-level map
//   decoder    byte-level
// tokenizer.ggml.model "llama" (SentencePiece BPE: Llama 2, Mistral, TinyLlama):
//   model      BPE with byte fallback (<0xNN> tokens, type 6) and the unknown token;
//              its merges are every split of a normal token into two normal tokens,
//              ranked by the merged token's score (highest first), as Hugging Face's
//              SentencePiece conversion ranks them
//   added      control and unknown tokens as special, user-defined ones not
//   normalizer "▁" prepended (add_space_prefix, default on), spaces to "▁"
//   decoder    "▁" to space, byte fallback, fuse, and the first space stripped
// Both: add_bos / add_eos become the post-processor (llama adds BOS by default);
// bos, eos, eot and eom ids become bos_id() and eos_ids().
#include <algorithm>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "cellm/tokenizer.h"
#include "tokenizer_impl.h"

namespace cellm {
namespace {

using nlohmann::json;

constexpr int32_t kNormal = 1;
constexpr int32_t kUnknown = 2;
constexpr int32_t kControl = 3;
constexpr int32_t kUserDefined = 4;
constexpr int32_t kUnused = 5;
constexpr int32_t kByte = 6;

constexpr const char* kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

json split(const char* regex) {
  return {{"type", "Split"},
          {"pattern", {{"Regex", regex}}},
          {"behavior", "Isolated"},
          {"invert", false}};
}

json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", false},
          {"trim_offsets", false},
          {"use_regex", use_regex}};
}

// The pre-tokenizer and normalizer of a gpt2 vocab's `pre`.
Status gpt2_pipeline(const std::string& pre, json& pre_tokenizer, json& normalizer) {
  normalizer = nullptr;
  if (pre.empty() || pre == "default" || pre == "gpt2") {
    pre_tokenizer = byte_level(true);
  } else if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") {
    pre_tokenizer = {{"type", "Sequence"},
                     {"pretokenizers", json::array({split(kLlama3Split), byte_level(false)})}};
  } else if (pre == "qwen2") {
    normalizer = {{"type", "NFC"}};
    pre_tokenizer = {{"type", "Sequence"},
                     {"pretokenizers", json::array({split(kQwen2Split), byte_level(false)})}};
  } else if (pre == "smollm") {
    // Hugging Face's Digits(individual_digits) is a split isolating each \p{N}.
    pre_tokenizer = {{"type", "Sequence"},
                     {"pretokenizers", json::array({split(R"(\p{N})"), byte_level(true)})}};
  } else {
    return NotSupported("tokenizer.ggml.pre '" + pre +
                        "' is not supported (supported: default, gpt2, llama-bpe, qwen2, smollm)");
  }
  return Status::Ok();
}

json added_token(const std::string& content, Token id, bool special) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

// The longest normal token a SentencePiece vocabulary may hold. SentencePiece
// trains pieces of at most 16 characters by default (max_sentencepiece_length),
// at most 64 bytes of UTF-8; the bound leaves room for any real vocabulary and
// keeps the split search below (quadratic in a piece's length) bounded.
constexpr size_t kMaxSentencePieceBytes = 1024;

// SentencePiece merges: each split of a normal token into two normal tokens,
// ranked by the merged token's score (highest first), then by the ids.
Result<json> sentencepiece_merges(const GgufVocab& v) {
  std::unordered_map<std::string_view, Token> normal;
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    if (v.token_types[id] != kNormal) continue;
    if (v.tokens[id].size() > kMaxSentencePieceBytes) {
      return InvalidProgram("tokenizer.ggml.tokens[" + std::to_string(id) + "] is " +
                            std::to_string(v.tokens[id].size()) +
                            " bytes long; a SentencePiece ('llama') vocabulary's pieces are at "
                            "most " +
                            std::to_string(kMaxSentencePieceBytes));
    }
    normal.emplace(v.tokens[id], static_cast<Token>(id));
  }
  struct Merge {
    float score;
    Token merged, left, right;
  };
  std::vector<Merge> merges;
  for (const auto& [piece, id] : normal) {
    for (size_t cut = 1; cut < piece.size(); ++cut) {
      const auto left = normal.find(piece.substr(0, cut));
      if (left == normal.end()) continue;
      const auto right = normal.find(piece.substr(cut));
      if (right == normal.end()) continue;
      merges.push_back({v.scores[static_cast<size_t>(id)], id, left->second, right->second});
    }
  }
  std::sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.merged != b.merged) return a.merged < b.merged;
    if (a.left != b.left) return a.left < b.left;
    return a.right < b.right;
  });
  json out = json::array();
  for (const Merge& m : merges) {
    out.push_back(json::array(
        {v.tokens[static_cast<size_t>(m.left)], v.tokens[static_cast<size_t>(m.right)]}));
  }
  return out;
}

json template_processing(const GgufVocab& v, bool add_bos, bool add_eos) {
  json single = json::array();
  json specials = json::object();
  const auto special = [&](Token id) {
    const std::string& content = v.tokens[static_cast<size_t>(id)];
    single.push_back({{"SpecialToken", {{"id", content}, {"type_id", 0}}}});
    specials[content] = {
        {"id", content}, {"ids", json::array({id})}, {"tokens", json::array({content})}};
  };
  if (add_bos) special(*v.bos_id);
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  if (add_eos) special(*v.eos_id);
  return {{"type", "TemplateProcessing"}, {"single", single}, {"special_tokens", specials}};
}

Status check_vocab(const GgufVocab& v) {
  if (v.tokens.empty()) return InvalidProgram("tokenizer.ggml.tokens is missing or empty");
  if (!v.token_types.empty() && v.token_types.size() != v.tokens.size()) {
    return InvalidProgram("tokenizer.ggml.token_type has " + std::to_string(v.token_types.size()) +
                          " entries for " + std::to_string(v.tokens.size()) + " tokens");
  }
  if (!v.scores.empty() && v.scores.size() != v.tokens.size()) {
    return InvalidProgram("tokenizer.ggml.scores has " + std::to_string(v.scores.size()) +
                          " entries for " + std::to_string(v.tokens.size()) + " tokens");
  }
  const auto check_id = [&](const std::optional<Token>& id, const char* key) -> Status {
    if (id && (*id < 0 || static_cast<size_t>(*id) >= v.tokens.size())) {
      return InvalidProgram(std::string("tokenizer.ggml.") + key + " " + std::to_string(*id) +
                            " is not a token id (the vocabulary has " +
                            std::to_string(v.tokens.size()) + ")");
    }
    return Status::Ok();
  };
  CELLM_RETURN_IF_ERROR(check_id(v.bos_id, "bos_token_id"));
  CELLM_RETURN_IF_ERROR(check_id(v.eos_id, "eos_token_id"));
  CELLM_RETURN_IF_ERROR(check_id(v.eot_id, "eot_token_id"));
  CELLM_RETURN_IF_ERROR(check_id(v.eom_id, "eom_token_id"));
  CELLM_RETURN_IF_ERROR(check_id(v.unk_id, "unknown_token_id"));
  CELLM_RETURN_IF_ERROR(check_id(v.pad_id, "padding_token_id"));
  return Status::Ok();
}

// The tokenizer.json equivalent of `v`.
Result<json> tokenizer_json(const GgufVocab& in) {
  CELLM_RETURN_IF_ERROR(check_vocab(in));
  GgufVocab v = in;
  if (v.token_types.empty()) v.token_types.assign(v.tokens.size(), kNormal);
  const bool spm = v.model == "llama";
  if (!spm && v.model != "gpt2") {
    return NotSupported("tokenizer.ggml.model '" + v.model +
                        "' is not supported (supported: gpt2, llama)");
  }
  if (spm && v.scores.empty()) return InvalidProgram("tokenizer.ggml.scores is missing");

  json vocab = json::object();
  json added = json::array();
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const Token id = static_cast<Token>(i);
    switch (v.token_types[i]) {
      case kNormal:
        vocab[v.tokens[i]] = id;
        break;
      case kByte:
      case kUnknown:
        if (spm) vocab[v.tokens[i]] = id;  // SentencePiece keeps these in its vocabulary
        if (v.token_types[i] == kUnknown) added.push_back(added_token(v.tokens[i], id, true));
        break;
      case kControl:
        if (spm) vocab[v.tokens[i]] = id;
        added.push_back(added_token(v.tokens[i], id, true));
        break;
      case kUserDefined:
        if (spm) vocab[v.tokens[i]] = id;
        added.push_back(added_token(v.tokens[i], id, false));
        break;
      case kUnused:
        break;
      default:
        return InvalidProgram("tokenizer.ggml.token_type of token " + std::to_string(i) + " is " +
                              std::to_string(v.token_types[i]) + " (expected 1 to 6)");
    }
  }

  json t = json::object();
  json model = {{"type", "BPE"}, {"dropout", nullptr}, {"vocab", std::move(vocab)}};
  if (spm) {
    std::optional<Token> unk = v.unk_id;
    for (size_t i = 0; i < v.tokens.size() && !unk; ++i) {
      if (v.token_types[i] == kUnknown) unk = static_cast<Token>(i);
    }
    model["unk_token"] = unk ? json(v.tokens[static_cast<size_t>(*unk)]) : json(nullptr);
    model["fuse_unk"] = true;
    model["byte_fallback"] = true;
    CELLM_ASSIGN_OR_RETURN(model["merges"], sentencepiece_merges(v));
    const bool prefix = v.add_space_prefix.value_or(true);
    json normalizers = json::array();
    if (prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", "\u2581"}});
    normalizers.push_back(
        {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}});
    t["normalizer"] = {{"type", "Sequence"}, {"normalizers", normalizers}};
    t["pre_tokenizer"] = nullptr;
    json decoders =
        json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                     {{"type", "ByteFallback"}},
                     {{"type", "Fuse"}}});
    if (prefix)
      decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    t["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  } else {
    model["unk_token"] = nullptr;
    model["fuse_unk"] = false;
    model["byte_fallback"] = false;
    model["ignore_merges"] = v.pre == "llama-bpe" || v.pre == "llama3" || v.pre == "llama-v3";
    model["merges"] = v.merges;
    json pre, normalizer;
    CELLM_RETURN_IF_ERROR(gpt2_pipeline(v.pre, pre, normalizer));
    t["normalizer"] = std::move(normalizer);
    t["pre_tokenizer"] = std::move(pre);
    t["decoder"] = {{"type", "ByteLevel"},
                    {"add_prefix_space", false},
                    {"trim_offsets", false},
                    {"use_regex", false}};
  }
  t["model"] = std::move(model);
  t["added_tokens"] = std::move(added);
  const bool add_bos = v.add_bos.value_or(spm) && v.bos_id;
  const bool add_eos = v.add_eos.value_or(false) && v.eos_id;
  t["post_processor"] = add_bos || add_eos ? template_processing(v, add_bos, add_eos) : json();
  return t;
}

Status build_pipeline(const GgufVocab& vocab, Tokenizer::Impl& impl) {
  CELLM_ASSIGN_OR_RETURN(json j, tokenizer_json(vocab));
  CELLM_ASSIGN_OR_RETURN(impl.model, BpeModel::parse(j.at("model")));
  CELLM_ASSIGN_OR_RETURN(impl.added, AddedVocabulary::parse(j.at("added_tokens")));
  CELLM_ASSIGN_OR_RETURN(impl.normalizer, parse_normalizer(j.at("normalizer")));
  CELLM_ASSIGN_OR_RETURN(impl.pre_tokenizer, parse_pre_tokenizer(j.at("pre_tokenizer")));
  CELLM_ASSIGN_OR_RETURN(impl.post_processor, parse_post_processor(j.at("post_processor")));
  CELLM_ASSIGN_OR_RETURN(impl.decoder, parse_decoder(j.at("decoder")));
  return Status::Ok();
}

}  // namespace

Result<Tokenizer> Tokenizer::from_gguf(const GgufVocab& vocab, std::string_view source) {
  auto impl = std::make_shared<Impl>();
  try {
    if (Status s = build_pipeline(vocab, *impl); !s.ok()) {
      return Status(s.code(), std::string(source) + ": " + s.message());
    }
  } catch (const json::exception& e) {
    return InvalidProgram(std::string(source) + ": tokenizer metadata: " + e.what());
  }
  impl->vocab_size = std::max(impl->model.id_limit(), vocab.tokens.size());
  impl->bos_id = vocab.bos_id;
  for (const std::optional<Token>& id : {vocab.eos_id, vocab.eot_id, vocab.eom_id}) {
    if (id && std::find(impl->eos_ids.begin(), impl->eos_ids.end(), *id) == impl->eos_ids.end()) {
      impl->eos_ids.push_back(*id);
    }
  }
  Tokenizer tokenizer;
  tokenizer.impl_ = std::move(impl);
  return tokenizer;
}

}  // namespace cellm
