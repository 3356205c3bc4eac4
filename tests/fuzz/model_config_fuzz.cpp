// Fuzzes config.json parsing (ModelConfig::parse). JSON text inputs are parsed
// as they are (mutations of the seed configs); any other input builds a config
// from the bytes: an architecture, sizes that are mostly plausible (small,
// powers of two) and sometimes at the limits, rope scaling, sliding windows,
// layer_types and special token ids. A config that parses must hold together:
// the derived sizes, the per-layer windows and the parameter count are
// computed (UBSan checks their arithmetic).
#include <cstdint>
#include <string>

#include "cellm/model_config.h"
#include "fuzz_check.h"
#include "fuzz_json.h"

namespace {

using nlohmann::json;

json size_value(FuzzedDataProvider& fdp) {
  switch (fdp.ConsumeIntegralInRange<int>(0, 5)) {
    case 0:
    case 1:
      return 2 * fdp.ConsumeIntegralInRange<int64_t>(1, 32);
    case 2:
    case 3:
      return int64_t{1} << fdp.ConsumeIntegralInRange<int>(0, 30);
    case 4:
      return fdp.ConsumeFloatingPointInRange<double>(-1.0, 64.0);  // 8.0 counts as 8
    default:
      return cellm::fuzz::edge_integer(fdp);
  }
}

json token_ids(FuzzedDataProvider& fdp) {
  if (fdp.ConsumeBool()) return fdp.ConsumeIntegralInRange<int64_t>(-2, 70000);
  json ids = json::array();
  for (int n = fdp.ConsumeIntegralInRange<int>(0, 4); n > 0; --n) {
    ids.push_back(fdp.ConsumeBool() ? json(fdp.ConsumeIntegralInRange<int64_t>(-2, 70000))
                                    : cellm::fuzz::edge_integer(fdp));
  }
  return ids;
}

std::string build_config(const uint8_t* data, size_t size) {
  static const char* const kArchitectures[] = {"LlamaForCausalLM", "MistralForCausalLM",
                                               "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                                               "GPT2LMHeadModel"};
  static const char* const kSizes[] = {
      "hidden_size",    "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
      "head_dim",       "intermediate_size", "vocab_size",          "max_position_embeddings",
      "sliding_window", "max_window_layers"};
  FuzzedDataProvider fdp(data, size);
  json c = json::object();
  if (fdp.ConsumeIntegralInRange<int>(0, 7) != 0) {
    c["architectures"] = {kArchitectures[fdp.ConsumeIntegralInRange<int>(0, 4)]};
  } else {
    c[fdp.ConsumeBool() ? "model_type" : "architectures"] = cellm::fuzz::value_like(fdp, "llama");
  }
  for (const char* field : kSizes) {
    if (fdp.ConsumeIntegralInRange<int>(0, 9) != 0) c[field] = size_value(fdp);
  }
  c["rms_norm_eps"] = fdp.ConsumeBool() ? json(1e-5) : cellm::fuzz::edge_number(fdp);
  if (fdp.ConsumeBool()) c["rope_theta"] = cellm::fuzz::value_like(fdp, 10000.0);
  if (fdp.ConsumeIntegralInRange<int>(0, 3) == 0) {
    json rope = {{fdp.ConsumeBool() ? "rope_type" : "type",
                  fdp.ConsumeIntegralInRange<int>(0, 3) ? json("llama3")
                                                        : cellm::fuzz::value_like(fdp, "x")}};
    for (const char* f : {"factor", "low_freq_factor", "high_freq_factor"}) {
      if (fdp.ConsumeIntegralInRange<int>(0, 5) != 0) rope[f] = cellm::fuzz::value_like(fdp, 1.0);
    }
    if (fdp.ConsumeIntegralInRange<int>(0, 5) != 0) {
      rope["original_max_position_embeddings"] = size_value(fdp);
    }
    c[fdp.ConsumeBool() ? "rope_scaling" : "rope_parameters"] = rope;
  }
  for (const char* flag :
       {"use_sliding_window", "tie_word_embeddings", "attention_bias", "mlp_bias"}) {
    if (fdp.ConsumeBool()) c[flag] = cellm::fuzz::value_like(fdp, true);
  }
  if (fdp.ConsumeIntegralInRange<int>(0, 3) == 0) {
    json types = json::array();
    for (int n = fdp.ConsumeIntegralInRange<int>(0, 66); n > 0; --n) {
      types.push_back(fdp.ConsumeIntegralInRange<int>(0, 15) == 0
                          ? cellm::fuzz::any_value(fdp, 0)
                          : json(fdp.ConsumeBool() ? "full_attention" : "sliding_attention"));
    }
    c["layer_types"] = types;
  }
  if (fdp.ConsumeBool()) c["bos_token_id"] = token_ids(fdp);
  if (fdp.ConsumeBool()) c["eos_token_id"] = token_ids(fdp);
  if (fdp.ConsumeBool()) c["hidden_act"] = fdp.ConsumeBool() ? json("silu") : json("gelu");
  if (fdp.ConsumeBool()) c["torch_dtype"] = cellm::fuzz::value_like(fdp, "bfloat16");
  if (fdp.ConsumeIntegralInRange<int>(0, 7) == 0) {
    c[cellm::fuzz::utf8_string(fdp, 24)] = cellm::fuzz::any_value(fdp, 2);
  }
  return c.dump();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = cellm::fuzz::looks_like_json(data, size)
                               ? std::string(reinterpret_cast<const char*>(data), size)
                               : build_config(data, size);
  cellm::Result<cellm::ModelConfig> config = cellm::ModelConfig::parse(text, "fuzz/config.json");
  if (!config.ok()) {
    FUZZ_CHECK(config.status().message().rfind("fuzz/config.json", 0) == 0,
               "an error names the file");
    return 0;
  }
  const cellm::ModelConfig& c = *config;
  FUZZ_CHECK(c.q_dim() == c.num_heads() * c.head_dim(), "q_dim = heads * head_dim");
  FUZZ_CHECK(c.num_queries_per_kv() * c.num_kv_heads() == c.num_heads(), "kv heads divide heads");
  FUZZ_CHECK(static_cast<int64_t>(c.windows().size()) == c.num_layers(), "a window per layer");
  for (int64_t layer = 0; layer < c.num_layers(); ++layer) {
    FUZZ_CHECK(c.window(layer) >= 0, "windows are not negative");
  }
  for (cellm::Token id : c.eos_token_ids()) {
    FUZZ_CHECK(id >= 0 && id < c.vocab_size(), "eos ids inside the vocabulary");
  }
  FUZZ_CHECK(c.num_parameters() > 0, "a positive parameter count");
  (void)c.has_sliding_window();
  return 0;
}
