// Tokenizer: a faithful C++ implementation of Hugging Face tokenizer.json for
// BPE models, byte-level (Llama 3, Qwen, GPT-2) and SentencePiece-style with
// byte fallback (Llama 2, Mistral), plus the bos/eos ids a model folder declares.
//
// encode(text) = added tokens matched first (leftmost-longest), then for each
// stretch between them: normalizer, pre-tokenizer, BPE per piece; with
// add_special_tokens the post-processor (TemplateProcessing adds Llama's BOS).
// Invalid UTF-8 in the text never fails: byte-level models encode the raw bytes,
// byte-fallback models encode them as <0xNN> tokens.
// decode(ids) = the token strings through the decoder chain; ids outside the
// vocabulary are skipped, as Hugging Face does.
//
// A Tokenizer is an immutable, cheaply copyable handle (shared state);
// encode/decode are safe to call from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cellm/status.h"
#include "cellm/types.h"

namespace cellm {

// A tokenizer as a GGUF file's metadata describes it (the tokenizer.ggml.* keys),
// as plain values: the text layer does not read GGUF files, the engine fills this
// from the model layer's reader (cellm/gguf.h).
struct GgufVocab {
  std::string model;  // tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece)
  std::string pre;    // tokenizer.ggml.pre: a gpt2 vocab's pre-tokenizer ("" = "default")
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens, by id
  std::vector<float> scores;         // tokenizer.ggml.scores (llama: the merge priorities)
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type: 1 normal, 2 unknown,
                                     // 3 control, 4 user defined, 5 unused, 6 byte
  std::vector<std::string> merges;   // tokenizer.ggml.merges (gpt2): "left right"
  std::optional<Token> bos_id, eos_id, eot_id, eom_id, unk_id, pad_id;
  std::optional<bool> add_bos, add_eos;  // default: llama adds BOS, gpt2 nothing
  std::optional<bool> add_space_prefix;  // llama: "▁" before the text (default true)
};

class Tokenizer {
 public:
  // Reads model_dir/tokenizer.json and tokenizer_config.json, and when present
  // generation_config.json and config.json (for bos/eos). Errors name the file
  // and the problem: NotFound, IoError, InvalidProgram (malformed), NotSupported.
  static Result<Tokenizer> load(const std::string& model_dir);
  // Builds the tokenizer a GGUF file describes, giving the ids Hugging Face's
  // tokenizer of the same model gives (see src/text/gguf_tokenizer.cpp for how
  // each field maps). `source` names the file in errors (InvalidProgram for
  // inconsistent fields, NotSupported for another model or pre-tokenizer).
  static Result<Tokenizer> from_gguf(const GgufVocab& vocab, std::string_view source);

  std::vector<Token> encode(std::string_view text, bool add_special_tokens) const;
  std::string decode(std::span<const Token> ids, bool skip_special_tokens = false) const;

  // One past the largest id of the vocabulary and the added tokens.
  size_t vocab_size() const;
  // BOS: generation_config.json, else config.json, else tokenizer_config.json.
  std::optional<Token> bos_id() const;
  // EOS ids, deduplicated, from generation_config.json, config.json and
  // tokenizer_config.json in that order (each may give an int or a list).
  const std::vector<Token>& eos_ids() const;
  std::optional<Token> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(Token id) const;
  // Whether `id` is an added token marked special (skipped by skip_special_tokens).
  bool is_special(Token id) const;
  // The exact bytes token `id` adds to the output when decoded in the middle of a
  // text (no start-of-text stripping, no UTF-8 repair): byte-level vocabularies
  // give the raw bytes behind GPT-2's byte alphabet; SentencePiece-style ones give
  // the piece with "▁" as a space and a <0xNN> byte-fallback piece as that byte;
  // an added token gives its content, except special ones (control tokens), which
  // give the empty string, as do ids outside the vocabulary. Constrained decoding
  // builds its byte vocabulary (cellm/grammar.h) from this.
  std::string token_bytes(Token id) const;
  // Whether both handles share one loaded tokenizer (copies of one load()).
  bool shares_state_with(const Tokenizer& other) const { return impl_ == other.impl_; }

  struct Impl;  // the parsed pipeline; defined in src/text/tokenizer_impl.h

 private:
  friend class IncrementalDecoder;
  std::shared_ptr<const Impl> impl_;
};

// Streams the text of tokens as they are generated. Each feed() returns the
// newly completed text (possibly empty), never a broken UTF-8 sequence; flush()
// returns what is held back at the end. The concatenation of all chunks equals
// Tokenizer::decode of all tokens, including SentencePiece's stripping of the
// first leading space (and of the end: a trailing run that a Strip decoder may
// cut is held back until more text follows), and byte-fallback runs, except for streams that end a
// run of <0xNN> tokens on valid UTF-8 and continue it with invalid bytes (the
// text already sent stays; decode() would turn the whole run into U+FFFD).
// Keeps the tokenizer's state alive. Not thread-safe: one decoder per stream.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);

  std::string feed(Token id);
  std::string flush();

 private:
  // Held tokens whose text still ends in U+FFFD; past this many they are sent.
  static constexpr size_t kMaxHeldTokens = 8;

  std::shared_ptr<const Tokenizer::Impl> impl_;
  bool skip_special_tokens_;
  std::vector<Token> held_;
  // Decoded text held back because the decoder cuts it if nothing follows.
  std::string held_text_;
  bool at_first_token_ = true;  // see DecodeState in src/text/tokenizer_decoder.h
  bool text_started_ = false;
};

}  // namespace cellm
