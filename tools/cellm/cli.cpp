#include "cli.h"

#include <cstdint>
#include <cstdio>

#include "cellm/sampler.h"

namespace cellm::cli {

const std::vector<FlagSpec>& sampling_flags() {
  static const std::vector<FlagSpec> flags = {
      {"temperature", "T", "0 = greedy (default 0)"},
      {"top-k", "K", "keep the K most probable tokens; 0 = off (default 0)"},
      {"top-p", "P", "nucleus sampling mass; 1 = off (default 1)"},
      {"min-p", "P", "drop tokens below P x the top probability; 0 = off (default 0)"},
  };
  return flags;
}

Result<SamplingParams> parse_sampling_flags(const Args& args) {
  SamplingParams sp;
  CELLM_ASSIGN_OR_RETURN(const double temperature, args.get_float("temperature", 0.0));
  CELLM_ASSIGN_OR_RETURN(const double top_p, args.get_float("top-p", 1.0));
  CELLM_ASSIGN_OR_RETURN(const double min_p, args.get_float("min-p", 0.0));
  CELLM_ASSIGN_OR_RETURN(const int64_t top_k, args.get_int("top-k", 0, 0, INT32_MAX));
  sp.temperature = static_cast<float>(temperature);
  sp.top_p = static_cast<float>(top_p);
  sp.min_p = static_cast<float>(min_p);
  sp.top_k = static_cast<int32_t>(top_k);
  CELLM_RETURN_IF_ERROR(validate_sampling(sp));
  return sp;
}

std::string describe_sampling(const SamplingParams& params) {
  if (params.temperature == 0.0f) return "greedy";
  const auto term = [](const char* name, double value) {
    char text[64];
    std::snprintf(text, sizeof(text), "%s %g", name, value);
    return std::string(text);
  };
  std::string text = term("temperature", params.temperature);
  if (params.top_k > 0) text += ", " + term("top-k", params.top_k);
  if (params.top_p < 1.0f) text += ", " + term("top-p", params.top_p);
  if (params.min_p > 0.0f) text += ", " + term("min-p", params.min_p);
  return text;
}

Result<ExecutorKind> parse_executor_flag(const Args& args) {
  const std::optional<std::string> text = args.get("executor");
  if (!text) return Engine::default_executor_kind();
  if (*text == "cpu") return ExecutorKind::kCpu;
  if (*text == "cuda") return ExecutorKind::kCuda;
  return InvalidArgument("--executor must be 'cpu' or 'cuda', got '" + *text + "'");
}

FlagSpec weights_flag() {
  return {"weights", "FORMAT",
          "how the linear layers' weights are held: " + weight_format_names() +
              "; the q formats quantize as they load, for the CPU executor; fp8 (fp8_head: the "
              "LM head too) quantizes to e4m3 with a scale per row (in models of 8 layers or "
              "more the last layer stays as stored), run in e4m3 by both executors (default "
              "auto: as stored)"};
}

Result<WeightFormat> parse_weights_flag(const Args& args, ExecutorKind& executor) {
  const std::optional<std::string> text = args.get("weights");
  if (!text) return WeightFormat::kAuto;
  CELLM_ASSIGN_OR_RETURN(const WeightFormat format, parse_weight_format(*text));
  if (cuda_runs_weight_format(format)) return format;
  if (!args.has("executor")) {
    executor = ExecutorKind::kCpu;
  } else if (executor == ExecutorKind::kCuda) {
    return InvalidArgument("--weights " + *text +
                           " quantizes for the CPU executor; the CUDA executor runs --weights "
                           "bf16 or auto (give --executor cpu)");
  }
  return format;
}

FlagSpec kv_dtype_flag() {
  return {"kv-dtype", "TYPE",
          "how the KV cache stores K and V: auto (the executor's own: f32 on the CPU, the "
          "precision's on CUDA), f32, bf16 (CUDA), or fp8 (e4m3 with a scale per cell, layer "
          "and KV head: about 0.27 of f32's bytes at head_dim 64, on both executors)"};
}

Result<KvDtype> parse_kv_dtype_flag(const Args& args) {
  const std::optional<std::string> text = args.get("kv-dtype");
  if (!text) return KvDtype::kAuto;
  return parse_kv_dtype(*text);
}

FlagSpec activations_flag() {
  return {"activations", "MODE",
          "CPU executor, the products with bf16 weights: bf16 rounds their activations to bf16 "
          "and multiplies with AVX-512 BF16 dot products where the CPU has them (a bf16 model "
          "computed as torch and llama.cpp compute it: logits within ~0.2% of f32's, up to twice "
          "as fast), f32 keeps them exact in f32 (default bf16)"};
}

Result<bool> parse_activations_flag(const Args& args) {
  const std::string mode = args.get("activations").value_or("bf16");
  if (mode == "bf16") return true;
  if (mode == "f32") return false;
  return InvalidArgument("--activations must be bf16 or f32, got '" + mode + "'");
}

void print_weights_summary(const LoadedModel& model) {
  if (!model.weights_summary.empty()) {
    std::fprintf(stderr, "weights %s\n", model.weights_summary.c_str());
  }
}

Result<TimedChoice> parse_timed_choice(const std::string& text, const std::string& option) {
  if (text == "timed") return TimedChoice::kTimed;
  if (text == "on") return TimedChoice::kOn;
  if (text == "off") return TimedChoice::kOff;
  return InvalidArgument("--" + option + " must be timed, on or off, not '" + text + "'");
}

}  // namespace cellm::cli
