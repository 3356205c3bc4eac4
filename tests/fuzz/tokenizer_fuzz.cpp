// Fuzzes tokenizer.json loading (Tokenizer::load) and encode/decode of random
// text with what loads. Two input forms:
//   - JSON text: the bytes up to the first NUL are tokenizer.json (mutations of
//     the seed tokenizers), the bytes after it the text to encode;
//   - anything else builds a tokenizer from the bytes: a byte-fallback or a
//     byte-level BPE vocabulary with merges of its own tokens, added tokens,
//     and a normalizer, pre-tokenizer (fuzzed regexes included), post-processor
//     and decoder chosen among the supported components with fuzzed settings;
//     the rest of the bytes are the text.
// Loading writes the files into a private temporary folder (load reads a model
// folder). What loads must encode the text (valid UTF-8 or not), decode the ids
// back, decode ids outside the vocabulary, and stream them through an
// IncrementalDecoder, all without a sanitizer report.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cellm/tokenizer.h"
#include "fuzz_check.h"
#include "fuzz_json.h"

namespace {

using nlohmann::json;

const std::filesystem::path& work_dir() {
  static const std::filesystem::path dir = [] {
    std::string base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
    std::string pattern = base + "/cellm-fuzz-tokenizer-XXXXXX";
    FUZZ_CHECK(mkdtemp(pattern.data()) != nullptr, "a temporary folder");
    std::filesystem::path p(pattern);
    std::atexit([] { std::filesystem::remove_all(work_dir()); });
    return p;
  }();
  return dir;
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  FUZZ_CHECK(out.good(), "writing a temporary file");
}

// GPT-2's byte-to-character map: the printable bytes stand for themselves, the
// others for U+0100 onwards.
std::string byte_level_char(int b) {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int next = 256;
    for (int c = 0; c < 256; ++c) {
      const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
      const int cp = printable ? c : next++;
      std::string s;
      if (cp < 0x80) {
        s += static_cast<char>(cp);
      } else {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      }
      t[static_cast<size_t>(c)] = s;
    }
    return t;
  }();
  return table[static_cast<size_t>(b)];
}

json pattern(FuzzedDataProvider& fdp) {
  static const char* const kRegexes[] = {
      "\\s+|[,.!?]+",
      " ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}",
      "\\p{N}",
      "a*",
      ""};
  if (fdp.ConsumeBool()) return {{"String", cellm::fuzz::utf8_string(fdp, 4)}};
  return {{"Regex", fdp.ConsumeBool() ? json(fdp.PickValueInArray(kRegexes))
                                      : json(cellm::fuzz::utf8_string(fdp, 24))}};
}

json normalizer(FuzzedDataProvider& fdp, int depth) {
  switch (fdp.ConsumeIntegralInRange<int>(0, depth > 0 ? 6 : 5)) {
    case 0:
      return nullptr;
    case 1:
      return {{"type", "NFC"}};
    case 2:
      return {{"type", "NFD"}};
    case 3:
      return {{"type", "Prepend"}, {"prepend", cellm::fuzz::utf8_string(fdp, 4)}};
    case 4:
      return {{"type", "Replace"},
              {"pattern", pattern(fdp)},
              {"content", cellm::fuzz::utf8_string(fdp, 4)}};
    case 5:
      return {
          {"type", "Strip"}, {"strip_left", fdp.ConsumeBool()}, {"strip_right", fdp.ConsumeBool()}};
    default: {
      json list = json::array();
      for (int n = fdp.ConsumeIntegralInRange<int>(0, 3); n > 0; --n) {
        list.push_back(normalizer(fdp, depth - 1));
      }
      return {{"type", "Sequence"}, {"normalizers", list}};
    }
  }
}

json metaspace(FuzzedDataProvider& fdp) {
  static const char* const kSchemes[] = {"always", "first", "never"};
  return {{"type", "Metaspace"},
          {"replacement", fdp.ConsumeBool() ? json("\xE2\x96\x81") : json("_")},
          {"prepend_scheme", fdp.PickValueInArray(kSchemes)},
          {"split", fdp.ConsumeBool()}};
}

json pre_tokenizer(FuzzedDataProvider& fdp, int depth) {
  static const char* const kBehaviors[] = {"Removed", "Isolated", "MergedWithPrevious",
                                           "MergedWithNext", "Contiguous"};
  switch (fdp.ConsumeIntegralInRange<int>(0, depth > 0 ? 4 : 3)) {
    case 0:
      return nullptr;
    case 1:
      return {{"type", "Split"},
              {"pattern", pattern(fdp)},
              {"behavior", fdp.PickValueInArray(kBehaviors)},
              {"invert", fdp.ConsumeBool()}};
    case 2:
      return {{"type", "ByteLevel"},
              {"add_prefix_space", fdp.ConsumeBool()},
              {"trim_offsets", true},
              {"use_regex", fdp.ConsumeBool()}};
    case 3:
      return metaspace(fdp);
    default: {
      json list = json::array();
      for (int n = fdp.ConsumeIntegralInRange<int>(0, 3); n > 0; --n) {
        list.push_back(pre_tokenizer(fdp, depth - 1));
      }
      return {{"type", "Sequence"}, {"pretokenizers", list}};
    }
  }
}

json decoder(FuzzedDataProvider& fdp, int depth) {
  switch (fdp.ConsumeIntegralInRange<int>(0, depth > 0 ? 7 : 6)) {
    case 0:
      return nullptr;
    case 1:
      return {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
    case 2:
      return {{"type", "ByteFallback"}};
    case 3:
      return {{"type", "Fuse"}};
    case 4:
      return {{"type", "Replace"},
              {"pattern", pattern(fdp)},
              {"content", cellm::fuzz::utf8_string(fdp, 4)}};
    case 5:
      return {{"type", "Strip"},
              {"content", fdp.ConsumeBool() ? json(" ") : json(cellm::fuzz::utf8_string(fdp, 2))},
              {"start", cellm::fuzz::value_like(fdp, 1)},
              {"stop", cellm::fuzz::value_like(fdp, 1)}};
    case 6:
      return metaspace(fdp);
    default: {
      json list = json::array();
      for (int n = fdp.ConsumeIntegralInRange<int>(0, 4); n > 0; --n) {
        list.push_back(decoder(fdp, depth - 1));
      }
      return {{"type", "Sequence"}, {"decoders", list}};
    }
  }
}

json token_id(FuzzedDataProvider& fdp, int64_t vocab) {
  return fdp.ConsumeIntegralInRange<int>(0, 7)
             ? json(fdp.ConsumeIntegralInRange<int64_t>(0, vocab + 3))
             : cellm::fuzz::edge_integer(fdp);
}

json post_processor(FuzzedDataProvider& fdp, int64_t vocab, int depth) {
  switch (fdp.ConsumeIntegralInRange<int>(0, depth > 0 ? 3 : 2)) {
    case 0:
      return nullptr;
    case 1: {
      json single = json::array();
      json special = json::object();
      for (int n = fdp.ConsumeIntegralInRange<int>(0, 3); n > 0; --n) {
        if (fdp.ConsumeBool()) {
          single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
          continue;
        }
        const std::string name = fdp.ConsumeBool() ? "<s>" : cellm::fuzz::utf8_string(fdp, 6);
        single.push_back({{"SpecialToken", {{"id", name}, {"type_id", 0}}}});
        json ids = json::array();
        for (int k = fdp.ConsumeIntegralInRange<int>(0, 2); k > 0; --k) {
          ids.push_back(token_id(fdp, vocab));
        }
        special[name] = {{"id", name}, {"ids", ids}, {"tokens", {name}}};
      }
      return {{"type", "TemplateProcessing"}, {"single", single}, {"special_tokens", special}};
    }
    case 2:
      return {{"type", "ByteLevel"}, {"trim_offsets", true}};
    default: {
      json list = json::array();
      for (int n = fdp.ConsumeIntegralInRange<int>(0, 3); n > 0; --n) {
        list.push_back(post_processor(fdp, vocab, depth - 1));
      }
      return {{"type", "Sequence"}, {"processors", list}};
    }
  }
}

// A tokenizer.json from the fuzzer's bytes (see the top of the file).
std::string build_tokenizer(FuzzedDataProvider& fdp) {
  const bool byte_level = fdp.ConsumeBool();
  std::vector<std::string> tokens;
  if (byte_level) {
    for (int b = 0; b < 256; ++b) tokens.push_back(byte_level_char(b));
  } else {
    tokens = {"<unk>", "<s>", "</s>"};
    static const char* const kHex = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      tokens.push_back(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">");
    }
    for (const char* piece : {"\xE2\x96\x81", "a", "b", "c", "e", "h", "l", "o", " "}) {
      tokens.push_back(piece);
    }
  }
  json merges = json::array();
  const bool pair_merges = fdp.ConsumeBool();
  for (int n = fdp.ConsumeIntegralInRange<int>(0, 24); n > 0; --n) {
    const size_t base = byte_level ? 0 : 3;
    const auto pick = [&] {
      return fdp.ConsumeIntegralInRange<int>(0, 3) == 0
                 ? cellm::fuzz::utf8_string(fdp, 3)
                 : tokens[fdp.ConsumeIntegralInRange<size_t>(base, tokens.size() - 1)];
    };
    const std::string left = pick();
    const std::string right = pick();
    merges.push_back(pair_merges ? json::array({left, right}) : json(left + " " + right));
    if (fdp.ConsumeIntegralInRange<int>(0, 7) != 0) tokens.push_back(left + right);
  }
  json vocab = json::object();
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = i;
  if (fdp.ConsumeIntegralInRange<int>(0, 15) == 0) {
    vocab[cellm::fuzz::utf8_string(fdp, 4)] = token_id(fdp, static_cast<int64_t>(tokens.size()));
  }
  const auto vocab_size = static_cast<int64_t>(tokens.size());
  json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", byte_level ? json(nullptr) : json("<unk>")},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", fdp.ConsumeBool()},
                {"byte_fallback", !byte_level},
                {"ignore_merges", fdp.ConsumeBool()},
                {"vocab", vocab},
                {"merges", merges}};
  json added = json::array();
  for (int n = fdp.ConsumeIntegralInRange<int>(0, 4); n > 0; --n) {
    added.push_back(
        {{"id", token_id(fdp, vocab_size)},
         {"content", fdp.ConsumeBool() ? json("<|eot|>") : json(cellm::fuzz::utf8_string(fdp, 8))},
         {"single_word", fdp.ConsumeBool()},
         {"lstrip", fdp.ConsumeBool()},
         {"rstrip", fdp.ConsumeBool()},
         {"normalized", fdp.ConsumeBool()},
         {"special", fdp.ConsumeBool()}});
  }
  const json tokenizer = {{"version", "1.0"},
                          {"added_tokens", added},
                          {"normalizer", normalizer(fdp, 1)},
                          {"pre_tokenizer", pre_tokenizer(fdp, 1)},
                          {"post_processor", post_processor(fdp, vocab_size, 1)},
                          {"decoder", decoder(fdp, 1)},
                          {"model", model}};
  return tokenizer.dump();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string tokenizer_json;
  std::string text;
  if (cellm::fuzz::looks_like_json(data, size)) {
    const std::string bytes(reinterpret_cast<const char*>(data), size);
    const size_t nul = bytes.find('\0');
    tokenizer_json = bytes.substr(0, nul);
    text = nul == std::string::npos ? "Hello, world! 123 <|eot|>" : bytes.substr(nul + 1);
  } else {
    FuzzedDataProvider fdp(data, size);
    tokenizer_json = build_tokenizer(fdp);
    text = fdp.ConsumeRemainingBytesAsString();
  }
  const std::filesystem::path& dir = work_dir();
  write_file(dir / "tokenizer.json", tokenizer_json);
  write_file(dir / "tokenizer_config.json", "{}");
  cellm::Result<cellm::Tokenizer> loaded = cellm::Tokenizer::load(dir.string());
  if (!loaded.ok()) {
    FUZZ_CHECK(!loaded.status().message().empty(), "an error says what is wrong");
    return 0;
  }
  const cellm::Tokenizer& tok = *loaded;
  const std::vector<cellm::Token> plain = tok.encode(text, /*add_special_tokens=*/false);
  const std::vector<cellm::Token> ids = tok.encode(text, /*add_special_tokens=*/true);
  FUZZ_CHECK(tok.encode(text, false) == plain, "encode is deterministic");
  for (cellm::Token id : plain) {
    FUZZ_CHECK(id >= 0 && static_cast<size_t>(id) < tok.vocab_size(), "ids inside the vocabulary");
  }
  (void)tok.decode(ids);
  (void)tok.decode(plain, /*skip_special_tokens=*/true);
  // Ids the model never produced: negative, past the vocabulary, from the text.
  std::vector<cellm::Token> odd = {-1, static_cast<cellm::Token>(tok.vocab_size()),
                                   std::numeric_limits<cellm::Token>::max()};
  for (unsigned char c : text.substr(0, 64)) odd.push_back(static_cast<cellm::Token>(c) * 3 - 7);
  (void)tok.decode(odd);
  for (bool skip : {false, true}) {
    cellm::IncrementalDecoder stream(tok, skip);
    for (cellm::Token id : ids) (void)stream.feed(id);
    for (cellm::Token id : odd) (void)stream.feed(id);
    (void)stream.flush();
  }
  for (cellm::Token id : odd) {
    (void)tok.id_to_token(id);
    (void)tok.is_special(id);
  }
  return 0;
}
