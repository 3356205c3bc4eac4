// Loading a model for the engine: the folder (or the bundled default, or a preset), the
// tokenizer and chat template beside the weights, and the pages of the weights touched
// once with a progress bar. A GGUF file holds all of them: its tokenizer.* metadata is
// read here (the model layer's reader) and handed to the text layer as plain values.
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>

#include "cellm/engine.h"
#include "cellm/gguf.h"
#include "engine/weight_formats.h"

namespace cellm {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A one-line bar on stderr: "loading weights [#####     ]  52% 1.2/2.3 GB".
class ProgressBar {
 public:
  explicit ProgressBar(size_t total_bytes)
      : total_(total_bytes), enabled_(isatty(STDERR_FILENO) != 0 && total_bytes > 0) {}
  void update(size_t done) {
    if (!enabled_) return;
    const int pct =
        static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total_));
    if (pct == last_pct_) return;
    last_pct_ = pct;
    const int width = 30, filled = pct * width / 100;
    std::fprintf(stderr, "\rloading weights [%s%s] %3d%% %.2f/%.2f GB",
                 std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(width - filled), ' ').c_str(), pct,
                 static_cast<double>(done) / 1e9, static_cast<double>(total_) / 1e9);
    std::fflush(stderr);
  }
  ~ProgressBar() {
    if (enabled_) std::fprintf(stderr, "\n");
  }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

 private:
  size_t total_;
  bool enabled_;
  int last_pct_ = -1;
};

// Reads one byte per page of every weight so the pages are resident, reporting progress
// to `progress` (or the stderr bar when it is empty).
void touch_weights(const ModelWeights& weights, const LoadProgress& progress) {
  const size_t total = weights.total_bytes();
  std::optional<ProgressBar> bar;
  if (!progress) bar.emplace(total);
  const auto report = [&](size_t done) {
    if (bar) {
      bar->update(done);
    } else {
      progress(done, total);
    }
  };
  size_t done = 0;
  volatile unsigned char sink = 0;
  constexpr size_t kPage = 4096;
  for (const TensorView* t : weights.tensors()) {
    const auto* bytes = static_cast<const unsigned char*>(t->data);
    for (size_t off = 0; off < t->nbytes; off += kPage) {
      sink = static_cast<unsigned char>(sink ^ bytes[off]);
      if ((off & ((size_t{1} << 24) - 1)) == 0) report(done + off);
    }
    done += t->nbytes;
    report(done);
  }
  (void)sink;
}

// The tokenizer.ggml.* keys of `m` as the text layer's GgufVocab.
Result<GgufVocab> gguf_vocab(const GgufMetadata& m) {
  GgufVocab v;
  CELLM_ASSIGN_OR_RETURN(std::optional<std::string> model, m.get_string("tokenizer.ggml.model"));
  if (!model) return InvalidProgram(m.source + ": missing metadata 'tokenizer.ggml.model'");
  v.model = *model;
  CELLM_ASSIGN_OR_RETURN(std::optional<std::string> pre, m.get_string("tokenizer.ggml.pre"));
  v.pre = pre.value_or("");
  CELLM_ASSIGN_OR_RETURN(const std::vector<std::string>* tokens,
                         m.get_strings("tokenizer.ggml.tokens"));
  if (tokens == nullptr)
    return InvalidProgram(m.source + ": missing metadata 'tokenizer.ggml.tokens'");
  v.tokens = *tokens;
  CELLM_ASSIGN_OR_RETURN(const std::vector<double>* scores, m.get_reals("tokenizer.ggml.scores"));
  if (scores != nullptr) v.scores.assign(scores->begin(), scores->end());
  CELLM_ASSIGN_OR_RETURN(const std::vector<int64_t>* types,
                         m.get_ints("tokenizer.ggml.token_type"));
  if (types != nullptr) v.token_types.assign(types->begin(), types->end());
  CELLM_ASSIGN_OR_RETURN(const std::vector<std::string>* merges,
                         m.get_strings("tokenizer.ggml.merges"));
  if (merges != nullptr) v.merges = *merges;
  const auto id = [&](const char* key, std::optional<Token>& out) -> Status {
    CELLM_ASSIGN_OR_RETURN(std::optional<int64_t> value, m.get_int(key));
    if (value) {
      if (*value < 0 || *value > INT32_MAX) {
        return InvalidProgram(m.source + ": " + key + " " + std::to_string(*value) +
                              " is out of range");
      }
      out = static_cast<Token>(*value);
    }
    return Status::Ok();
  };
  CELLM_RETURN_IF_ERROR(id("tokenizer.ggml.bos_token_id", v.bos_id));
  CELLM_RETURN_IF_ERROR(id("tokenizer.ggml.eos_token_id", v.eos_id));
  CELLM_RETURN_IF_ERROR(id("tokenizer.ggml.eot_token_id", v.eot_id));
  CELLM_RETURN_IF_ERROR(id("tokenizer.ggml.eom_token_id", v.eom_id));
  CELLM_RETURN_IF_ERROR(id("tokenizer.ggml.unknown_token_id", v.unk_id));
  CELLM_RETURN_IF_ERROR(id("tokenizer.ggml.padding_token_id", v.pad_id));
  CELLM_ASSIGN_OR_RETURN(v.add_bos, m.get_bool("tokenizer.ggml.add_bos_token"));
  CELLM_ASSIGN_OR_RETURN(v.add_eos, m.get_bool("tokenizer.ggml.add_eos_token"));
  CELLM_ASSIGN_OR_RETURN(v.add_space_prefix, m.get_bool("tokenizer.ggml.add_space_prefix"));
  return v;
}

// The chat template of tokenizer.chat_template, with the bos/eos token strings.
Result<ChatTemplate> gguf_chat_template(const GgufMetadata& m, const GgufVocab& v) {
  CELLM_ASSIGN_OR_RETURN(std::optional<std::string> text, m.get_string("tokenizer.chat_template"));
  if (!text) return NotFound(m.source + ": no tokenizer.chat_template");
  const auto token = [&](const std::optional<Token>& id) {
    return id && static_cast<size_t>(*id) < v.tokens.size() ? v.tokens[static_cast<size_t>(*id)]
                                                            : std::string();
  };
  Result<ChatTemplate> chat = ChatTemplate::parse(*text, token(v.bos_id), token(v.eos_id));
  if (!chat.ok()) {
    return Status(chat.status().code(),
                  m.source + ": tokenizer.chat_template: " + chat.status().message());
  }
  return chat;
}

// `loaded` with its linear weights held as `format` (--weights), recorded in `m`.
Result<ModelWeights> held_as(Result<ModelWeights> loaded, LoadedModel& m, WeightFormat format) {
  if (!loaded.ok()) return loaded.status();
  m.weights_format = format;
  if (format == WeightFormat::kAuto) return loaded;
  Result<ModelWeights> held = apply_weight_format(*loaded, format, m.weights_summary);
  if (!held.ok()) {
    return Status(held.status().code(), m.name + ": " + held.status().message());
  }
  return held;
}

}  // namespace

Result<std::string> resolve_model_folder(const ModelSource& source) {
  namespace fs = std::filesystem;
  if (!source.preset.empty()) {
    return InvalidArgument("the preset '" + source.preset + "' has no model folder");
  }
  if (!source.path.empty()) return source.path;
  for (const fs::path& p :
       {fs::path("models/kjv-small"), fs::path(CELLM_SOURCE_DIR) / "models" / "kjv-small"}) {
    std::error_code ec;
    if (fs::exists(p / "config.json", ec)) return p.string();
  }
  return NotFound(
      "no --model given and the bundled model models/kjv-small was not found (run from the "
      "repository root)");
}

namespace {

// NotFound for a path named like a GGUF file that is not there (rather than the
// model folder's message).
Status check_gguf_exists(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::error_code ec;
  if (ext == ".gguf" && !std::filesystem::exists(path, ec)) {
    return NotFound(path + ": no such GGUF file");
  }
  return Status::Ok();
}

}  // namespace

Result<Tokenizer> load_tokenizer(const std::string& path) {
  CELLM_RETURN_IF_ERROR(check_gguf_exists(path));
  if (!is_gguf_path(path)) return Tokenizer::load(path);
  CELLM_ASSIGN_OR_RETURN(GgufMetadata metadata, read_gguf_metadata(path));
  CELLM_ASSIGN_OR_RETURN(GgufVocab vocab, gguf_vocab(metadata));
  return Tokenizer::from_gguf(vocab, path);
}

Result<std::shared_ptr<const LoadedModel>> load_model(const ModelSource& source,
                                                      bool with_tokenizer,
                                                      const LoadProgress& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  auto m = std::make_shared<LoadedModel>();
  if (!source.preset.empty()) {
    if (!source.path.empty()) {
      return InvalidArgument("give a model folder or a preset, not both");
    }
    CELLM_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::preset(source.preset));
    m->name = "preset:" + source.preset;
    CELLM_ASSIGN_OR_RETURN(
        ModelWeights w,
        held_as(ModelWeights::random(config, DType::kBF16, source.seed), *m, source.weights));
    m->weights = std::make_shared<const ModelWeights>(std::move(w));
    m->load_seconds = seconds_since(t0);
    return std::shared_ptr<const LoadedModel>(std::move(m));
  }
  CELLM_ASSIGN_OR_RETURN(m->dir, resolve_model_folder(source));
  m->name = m->dir;
  CELLM_RETURN_IF_ERROR(check_gguf_exists(m->dir));
  if (is_gguf_path(m->dir)) {
    std::optional<GgufVocab> vocab;
    std::optional<GgufMetadata> metadata;
    if (with_tokenizer) {
      CELLM_ASSIGN_OR_RETURN(metadata, read_gguf_metadata(m->dir));
      CELLM_ASSIGN_OR_RETURN(vocab, gguf_vocab(*metadata));
      CELLM_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::from_gguf(*vocab, m->dir));
      m->tokenizer = std::move(tok);
    }
    CELLM_ASSIGN_OR_RETURN(ModelWeights w, held_as(ModelWeights::load(m->dir), *m, source.weights));
    touch_weights(w, progress);
    m->weights = std::make_shared<const ModelWeights>(std::move(w));
    if (with_tokenizer) {
      Result<ChatTemplate> chat = gguf_chat_template(*metadata, *vocab);
      m->chat_template_status = chat.status();
      if (chat.ok()) m->chat_template = std::move(*chat);
    }
    m->load_seconds = seconds_since(t0);
    return std::shared_ptr<const LoadedModel>(std::move(m));
  }
  if (with_tokenizer) {
    CELLM_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(m->dir));
    m->tokenizer = std::move(tok);
  }
  CELLM_ASSIGN_OR_RETURN(ModelWeights w, held_as(ModelWeights::load(m->dir), *m, source.weights));
  touch_weights(w, progress);
  m->weights = std::make_shared<const ModelWeights>(std::move(w));
  if (with_tokenizer) {
    Result<ChatTemplate> chat = ChatTemplate::load(m->dir);
    m->chat_template_status = chat.status();
    if (chat.ok()) m->chat_template = std::move(*chat);
  }
  m->load_seconds = seconds_since(t0);
  return std::shared_ptr<const LoadedModel>(std::move(m));
}

}  // namespace cellm
