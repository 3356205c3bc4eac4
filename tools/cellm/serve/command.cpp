// `cellm serve`: an OpenAI-compatible HTTP server over one Runner.
//
// Sizing. The KV pool is one budget of cells shared by need (ExecutorLimits with
// the capacity rule off): --kv-cells, or memory (--kv-memory GiB on the CPU,
// --kv-memory-fraction of the device memory left after the weights on CUDA). A
// session holds the cells of its own tokens, up to the model's context (or
// --max-session-tokens) and the pool. --max-sessions counts the generations that
// may run at once (a request with n choices runs n). The runner admits them by
// the cells they need (--kv-policy): `overcommit` starts a generation when its
// prompt fits and preempts the latest admitted one when a step runs short;
// `reserve` starts it only when its prompt and max_tokens fit. Finished
// generations leave their cells to the executor's prefix cache, which later
// prompts share and which is evicted, least recently used first, when cells are
// needed (--no-prefix-cache turns it off).
//
// Threads. cpp-httplib serves each connection on a worker of a fixed pool
// (max_sessions + max_queued_requests + 64: running, waiting, plus room for
// refusals, /metrics and idle keep-alive connections). Handlers block on their
// own job; runner callbacks only queue events (cellm/serve.h).
//
// Connections (serve/connection.h). No client holds a worker waiting on it for
// longer than --request-timeout: a request must arrive whole within it (else 408),
// each write of an answer must be taken within it (a stream whose client stopped
// reading is cancelled). Headers, bodies and JSON nesting have limits answered with
// a 4xx naming them.
//
// Memory. glibc gives threads up to 8 malloc arenas per core and each keeps what it
// freed, so with one worker per connection the resident set kept climbing over
// identical rounds of load as requests landed on arenas not yet grown (+36% on a
// second round in one run); two arenas reach their size in the first round and stay
// flat (docs/RELIABILITY.md). MALLOC_ARENA_MAX in the environment still wins. The
// KV pool's pages are touched as cells are first used: the prefix cache can grow the
// resident set up to the pool (--kv-cells / --kv-memory), which bounds it in bytes;
// /metrics shows the cells it holds (cellm_kv_cells_cached) and the process's
// resident memory (process_resident_memory_bytes).
//
// Security. With --api-key every endpoint but /health (and /metrics with
// --metrics-public) wants 'Authorization: Bearer KEY', compared in constant time.
// Error answers never carry the model folder's path or an exception's text.
//
// Shutdown. SIGINT/SIGTERM: admission closes (waiters and later requests get 503),
// the listener closes (new connections are refused) and idle connections close;
// requests in flight may finish for --shutdown-timeout seconds, then every running
// generation is cancelled (streams end with an error event) and waiting reads and
// writes fail. A second signal cancels at once. Then the Runner shuts down and the
// command exits 0.
#include <httplib.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <utility>

#include "args.h"
#include "cellm/engine.h"
#include "cellm/runner.h"
#include "cellm/serve.h"
#include "cli.h"
#include "commands.h"
#include "serve/connection.h"
#include "serve/endpoints.h"
#include "serve/host_memory.h"
#include "serve/http.h"

namespace cellm::cli {
namespace {

using nlohmann::json;

const std::vector<FlagSpec> kFlags = {
    {"model", "DIR", "Hugging Face model folder (default: the bundled models/kjv-small)"},
    {"host", "ADDR", "address to listen on (default 127.0.0.1)"},
    {"port", "N", "TCP port; 0 picks a free one (default 8080)"},
    {"executor", "KIND", "cpu or cuda (default: cuda when a GPU is present, else cpu)"},
    weights_flag(),
    kv_dtype_flag(),
    activations_flag(),
    {"max-sessions", "N", "generations running at once; n choices count n (default 16)"},
    {"max-session-tokens", "N",
     "positions per session, prompt and completion (default: the model's context, capped by "
     "the KV pool)"},
    {"kv-cells", "N", "KV cells in the pool (default: from memory)"},
    {"kv-memory", "GiB",
     "CPU: the KV pool's memory (default: a quarter of the host's memory: its RAM, or the "
     "cgroup's limit when lower); a pool that cannot fit stops the start"},
    {"kv-memory-fraction", "F",
     "CUDA: the share of device memory left after the weights that the KV pool takes "
     "(default 0.90)"},
    {"kv-policy", "P",
     "overcommit (admit when the prompt fits; preempt and recompute when cells run out) or "
     "reserve (admit when prompt + max_tokens fit) (default overcommit)"},
    {"no-prefix-cache", "", "do not keep finished generations' cells for later prompts"},
    {"max-queued-requests", "N", "requests that may wait for a session; more get 429 (default 64)"},
    // Faults and security (serve/connection.h, docs/serve.md).
    {"api-key", "KEY",
     "require 'Authorization: Bearer KEY' on every endpoint but /health (and /metrics with "
     "--metrics-public)"},
    {"metrics-public", "", "with --api-key: serve /metrics without the key"},
    {"request-timeout", "S",
     "seconds a client may take to send a whole request, and to take each write of an "
     "answer; a stalled stream is cancelled (default 60)"},
    {"shutdown-timeout", "S",
     "on SIGTERM/SIGINT, seconds requests in flight may take to finish before they are "
     "cancelled (default 5)"},
    {"served-model-name", "NAMES",
     "the model's name in /v1/models and requests; a comma-separated list gives aliases "
     "(default: the model folder's name)"},
    {"chat-template", "FILE", "a Jinja chat template to use instead of the model's"},
    {"tool-call-parser", "FORMAT",
     "hermes, llama3 or mistral: the tool-call format of the model's replies (default: the "
     "one its chat template shows)"},
    {"allowed-origins", "LIST",
     "CORS: comma-separated origins browsers may call from, or * for any (default: none)"},
    {"step-width", "W", "tokens per forward (default 256)"},
    {"threads", "N", "CPU threads; 0 = all (default 0)"},
    {"no-cuda-graphs", "", "CUDA: run decode steps eagerly instead of replaying graphs"},
    {"no-overlap", "",
     "CUDA: wait for each decode step before queueing the next (to measure what queueing it "
     "during the host's work buys under this load)"},
};

constexpr int kMallocArenas = 2;  // see "Memory" above

constexpr size_t kMaxBodyBytes = 4 << 20;
constexpr size_t kMaxHeaderBytes = 16 << 10;
// Deeper JSON than any request needs (a chat message's content part is 4 levels,
// a JSON schema a few dozen) and shallow enough for recursive consumers.
constexpr int kMaxJsonDepth = 128;

// Known routes keep the path label of the request counter bounded.
std::string path_label(const std::string& path) {
  for (const char* known : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health",
                            "/metrics", "/tokenize", "/detokenize"}) {
    if (path == known) return path;
  }
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

struct Flags {
  std::string model_dir;
  WeightFormat weights = WeightFormat::kAuto;
  KvDtype kv_dtype = KvDtype::kAuto;
  std::string host = "127.0.0.1";
  int port = 8080;
  ExecutorKind executor = ExecutorKind::kCpu;
  int32_t max_sessions = 16;
  std::optional<int32_t> max_session_tokens;
  int32_t max_queued = 64;
  std::optional<int32_t> kv_cells;
  std::optional<double> kv_memory_gib;
  std::optional<double> kv_memory_fraction;
  KvPolicy kv_policy = KvPolicy::kOvercommit;
  bool prefix_cache = true;
  std::optional<std::string> api_key;
  bool metrics_public = false;
  double request_timeout_s = 60;
  double shutdown_timeout_s = 5;
  std::vector<std::string> served_names;
  std::optional<std::string> chat_template_file;
  std::optional<serve::ToolCallFormat> tool_call_parser;
  std::vector<std::string> allowed_origins;
  int32_t step_width = 256;
  int32_t threads = 0;
  bool bf16_activations = true;
  bool cuda_graphs = true;
  bool overlap_decode = true;
};

Result<Flags> read_flags(const Args& args) {
  Flags f;
  CELLM_ASSIGN_OR_RETURN(int64_t port, args.get_int("port", 8080, 0, 65535));
  CELLM_ASSIGN_OR_RETURN(int64_t max_sessions, args.get_int("max-sessions", 16, 1, 4096));
  CELLM_ASSIGN_OR_RETURN(int64_t max_queued, args.get_int("max-queued-requests", 64, 0, 100000));
  CELLM_ASSIGN_OR_RETURN(int64_t step_width, args.get_int("step-width", 256, 2, 1 << 16));
  CELLM_ASSIGN_OR_RETURN(int64_t threads, args.get_int("threads", 0, 0, 1024));
  if (args.has("max-session-tokens")) {
    CELLM_ASSIGN_OR_RETURN(int64_t t, args.get_int("max-session-tokens", 1024, 2, 1 << 24));
    f.max_session_tokens = static_cast<int32_t>(t);
  }
  CELLM_ASSIGN_OR_RETURN(f.executor, parse_executor_flag(args));
  CELLM_ASSIGN_OR_RETURN(f.weights, parse_weights_flag(args, f.executor));
  CELLM_ASSIGN_OR_RETURN(f.kv_dtype, parse_kv_dtype_flag(args));
  f.host = args.get("host").value_or("127.0.0.1");
  f.port = static_cast<int>(port);
  f.max_sessions = static_cast<int32_t>(max_sessions);
  f.max_queued = static_cast<int32_t>(max_queued);
  if (args.has("kv-cells")) {
    CELLM_ASSIGN_OR_RETURN(int64_t cells, args.get_int("kv-cells", 0, 2, (int64_t{1} << 31) - 2));
    f.kv_cells = static_cast<int32_t>(cells);
  }
  if (args.has("kv-memory")) {
    CELLM_ASSIGN_OR_RETURN(double gib, args.get_float("kv-memory", 0));
    if (!(gib > 0)) return InvalidArgument("--kv-memory must be a positive number of GiB");
    f.kv_memory_gib = gib;
  }
  if (args.has("kv-memory-fraction")) {
    CELLM_ASSIGN_OR_RETURN(double fraction, args.get_float("kv-memory-fraction", 0));
    if (!(fraction > 0 && fraction <= 1)) {
      return InvalidArgument("--kv-memory-fraction must be in (0, 1]");
    }
    f.kv_memory_fraction = fraction;
  }
  if (const std::optional<std::string> policy = args.get("kv-policy")) {
    if (*policy == "overcommit") {
      f.kv_policy = KvPolicy::kOvercommit;
    } else if (*policy == "reserve") {
      f.kv_policy = KvPolicy::kReserve;
    } else {
      return InvalidArgument("--kv-policy must be overcommit or reserve, not '" + *policy + "'");
    }
  }
  f.prefix_cache = !args.has("no-prefix-cache");
  f.step_width = static_cast<int32_t>(step_width);
  f.threads = static_cast<int32_t>(threads);
  CELLM_ASSIGN_OR_RETURN(f.bf16_activations, parse_activations_flag(args));
  f.cuda_graphs = !args.has("no-cuda-graphs");
  f.overlap_decode = !args.has("no-overlap");
  if (auto key = args.get("api-key")) {
    if (key->empty()) return InvalidArgument("--api-key must not be empty");
    f.api_key = *key;
  }
  f.metrics_public = args.has("metrics-public");
  auto seconds = [&](const char* flag, double fallback, bool zero_ok) -> Result<double> {
    CELLM_ASSIGN_OR_RETURN(double s, args.get_float(flag, fallback));
    if (!(zero_ok ? s >= 0 : s > 0) || !(s <= 86400)) {
      return InvalidArgument(std::string("--") + flag + " must be a number of seconds " +
                             (zero_ok ? "from 0" : "above 0") + " to 86400");
    }
    return s;
  };
  // A request needs some time to arrive; shutting down may cancel at once (0).
  CELLM_ASSIGN_OR_RETURN(f.request_timeout_s, seconds("request-timeout", 60, false));
  CELLM_ASSIGN_OR_RETURN(f.shutdown_timeout_s, seconds("shutdown-timeout", 5, true));
  auto list = [&](const char* flag) -> Result<std::vector<std::string>> {
    std::vector<std::string> items;
    const std::optional<std::string> value = args.get(flag);
    if (!value) return items;
    size_t start = 0;
    while (true) {
      const size_t comma = value->find(',', start);
      std::string item = value->substr(start, comma - start);
      if (item.empty()) {
        return InvalidArgument(std::string("--") + flag + " has an empty item in '" + *value + "'");
      }
      items.push_back(std::move(item));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return items;
  };
  CELLM_ASSIGN_OR_RETURN(f.served_names, list("served-model-name"));
  CELLM_ASSIGN_OR_RETURN(f.allowed_origins, list("allowed-origins"));
  f.chat_template_file = args.get("chat-template");
  if (std::optional<std::string> parser = args.get("tool-call-parser")) {
    Result<serve::ToolCallFormat> format = serve::tool_call_format_named(*parser);
    if (!format.ok()) {
      return Status(format.status().code(), "--tool-call-parser: " + format.status().message());
    }
    f.tool_call_parser = *format;
  }
  ModelSource source;
  source.path = args.get("model").value_or("");
  CELLM_ASSIGN_OR_RETURN(f.model_dir, resolve_model_folder(source));
  return f;
}

// CORS: a request from an allowed origin may read the answer.
void allow_origin(const std::vector<std::string>& allowed, const httplib::Request& req,
                  httplib::Response& res) {
  if (allowed.empty() || !req.has_header("Origin")) return;
  const std::string origin = req.get_header_value("Origin");
  for (const std::string& a : allowed) {
    if (a == "*" || a == origin) {
      res.set_header("Access-Control-Allow-Origin", a == "*" ? "*" : origin);
      res.set_header("Vary", "Origin");
      return;
    }
  }
}

// A chat template from a file, with the tokenizer's BOS and EOS strings as its
// bos_token and eos_token.
Result<ChatTemplate> load_chat_template_file(const std::string& path, const Tokenizer& tokenizer) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("--chat-template: cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  auto token_text = [&](std::optional<Token> id) {
    return id ? tokenizer.id_to_token(*id).value_or("") : std::string();
  };
  const std::vector<Token>& eos = tokenizer.eos_ids();
  Result<ChatTemplate> t =
      ChatTemplate::parse(text.str(), token_text(tokenizer.bos_id()),
                          token_text(eos.empty() ? std::nullopt : std::optional<Token>(eos[0])));
  if (!t.ok())
    return Status(t.status().code(), "--chat-template " + path + ": " + t.status().message());
  return t;
}

// SIGINT/SIGTERM are blocked in every thread and taken by one waiter thread;
// SIGUSR1 wakes it when the server has ended (by itself, or after a stop).
class SignalWaiter {
 public:
  SignalWaiter() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  }
  // On the waiter thread: `on_stop(sig)` when SIGINT or SIGTERM arrives, then
  // `on_deadline(second_signal)` once `grace` has passed or at a second signal,
  // unless the server has ended before (join()).
  template <typename Stop, typename Deadline>
  void start(Stop on_stop, Deadline on_deadline, std::chrono::milliseconds grace) {
    thread_ = std::thread([this, on_stop, on_deadline, grace] {
      int sig = 0;
      sigwait(&set_, &sig);
      if (sig == SIGUSR1) return;
      on_stop(sig);
      const auto deadline = std::chrono::steady_clock::now() + grace;
      while (true) {
        const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(
            deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) return on_deadline(false);
        timespec ts{};
        ts.tv_sec = static_cast<time_t>(left.count() / 1'000'000'000);
        ts.tv_nsec = static_cast<long>(left.count() % 1'000'000'000);
        const int got = sigtimedwait(&set_, nullptr, &ts);
        if (got == SIGUSR1) return;
        if (got == SIGINT || got == SIGTERM) return on_deadline(true);
      }
    });
  }
  void join() {
    if (!thread_.joinable()) return;
    pthread_kill(thread_.native_handle(), SIGUSR1);
    thread_.join();
  }

 private:
  sigset_t set_;
  std::thread thread_;
};

// The CPU executor's KV pool against the host's memory (the process's cgroup limit
// included): --kv-memory must not exceed it, and the pool --kv-cells or --kv-memory
// asks for must fit beside what the process holds already (the weights).
// Without either flag the pool gets a quarter of that memory.
Status size_cpu_kv_pool(const Flags& flags, const ModelConfig& config, ExecutorLimits& limits) {
  const HostMemory memory = read_host_memory();
  const int64_t limit = memory.limit_bytes();
  if (limit <= 0) return Status::Ok();  // unknown: nothing to check against
  if (!flags.kv_cells && !flags.kv_memory_gib) {
    limits.kv_memory_bytes = limit / 4;
    return Status::Ok();
  }
  // One cell's K and V over every layer, as the CPU executor stores them at --kv-dtype.
  const int64_t cell_bytes = CpuExecutor::cell_bytes(config, flags.kv_dtype);
  const int64_t free_bytes = std::max<int64_t>(0, limit - memory.resident_bytes);
  const std::string room = "this host has " + memory.describe_limit() + " and the process holds " +
                           bytes_text(memory.resident_bytes) + " already (the model)";
  if (flags.kv_cells) {
    const double pool = double(*flags.kv_cells) * double(cell_bytes);
    if (pool > double(free_bytes)) {
      return OutOfResources("the KV pool does not fit in memory: --kv-cells " +
                            std::to_string(*flags.kv_cells) + " x " + bytes_text(cell_bytes) +
                            " a cell = " + bytes_text(static_cast<int64_t>(pool)) + ", but " +
                            room + "; lower --kv-cells");
    }
    return Status::Ok();
  }
  const int64_t asked = limits.kv_memory_bytes;
  if (asked > free_bytes) {
    return OutOfResources("the KV pool does not fit in memory: --kv-memory " + bytes_text(asked) +
                          " (" + std::to_string(asked / cell_bytes) + " cells x " +
                          bytes_text(cell_bytes) + "), but " + room + "; lower --kv-memory");
  }
  return Status::Ok();
}

}  // namespace

int run_serve(int argc, const char* const* argv) {
  const std::string cmd = "cellm serve";
  const std::string usage = "cellm serve [--model DIR] [--host ADDR] [--port N] [options]";
  if (wants_help(argc, argv)) {
    std::printf("%s", format_help(usage,
                                  "Serves the model over HTTP with OpenAI's API: /v1/completions, "
                                  "/v1/chat/completions, /v1/models, /tokenize, /detokenize, "
                                  "/health, /metrics.",
                                  kFlags)
                          .c_str());
    return 0;
  }
  Result<Args> args_or = Args::parse(argc, argv, 2, kFlags, cmd);
  if (!args_or.ok()) return fail(cmd, args_or.status());
  Result<Flags> flags_or = read_flags(*args_or);
  if (!flags_or.ok()) return fail(cmd, flags_or.status());
  const Flags& flags = *flags_or;

  // Before any thread starts (the executor's pool too), so every thread
  // inherits the blocked signals and only the waiter takes them.
  ::signal(SIGPIPE, SIG_IGN);
#if defined(__GLIBC__)
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, kMallocArenas);
#endif
  SignalWaiter signals;
  // Every connection is a descriptor: take the hard limit, not the soft 1024.
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }

  EngineOptions options;
  options.model.path = flags.model_dir;
  options.model.weights = flags.weights;
  options.executor = flags.executor;
  Result<std::shared_ptr<const LoadedModel>> model =
      load_model(options.model, /*with_tokenizer=*/true);
  if (!model.ok()) return fail(cmd, model.status());
  print_weights_summary(**model);
  const ModelConfig& config = (*model)->weights->config();

  ExecutorLimits& limits = options.limits;
  limits.capacity_rule = false;  // one pool shared by need
  limits.kv_dtype = flags.kv_dtype;
  limits.prefix_cache = flags.prefix_cache;
  limits.max_sessions = flags.max_sessions;
  limits.max_session_tokens = flags.max_session_tokens.value_or(0);  // 0: the model's context
  if (flags.kv_cells) limits.max_cells = *flags.kv_cells;
  if (flags.kv_memory_gib) {
    limits.kv_memory_bytes = static_cast<int64_t>(*flags.kv_memory_gib * double(int64_t{1} << 30));
  }
  if (flags.kv_memory_fraction) limits.kv_memory_fraction = *flags.kv_memory_fraction;
  limits.step_width = std::min<int32_t>(
      flags.step_width,
      static_cast<int32_t>(std::min<int64_t>(config.max_position_embeddings(), 1 << 30)));
  options.runner.policy = flags.kv_policy;
  options.cpu.num_threads = flags.threads;
  options.cpu.bf16_activations = flags.bf16_activations;
  options.cuda.cuda_graph_for_decode = flags.cuda_graphs;
  options.cuda.overlap_decode = flags.overlap_decode;
  // The CPU executor grows its KV storage on demand, so a pool that cannot fit
  // would fail only when sessions fill it: refused here, with the sizes.
  if (flags.executor == ExecutorKind::kCpu) {
    if (Status s = size_cpu_kv_pool(flags, config, limits); !s.ok()) return fail(cmd, s);
  }
  Result<Engine> engine = Engine::create(*model, options);
  if (!engine.ok()) return fail(cmd, engine.status());
  Runner& runner = engine->runner();
  const Tokenizer& tokenizer = *engine->tokenizer();
  ServeMetrics metrics;
  Admission admission(flags.max_sessions, flags.max_queued);
  auto serving = std::make_unique<ServeEngine>(runner, tokenizer, metrics);

  ServeContext ctx;
  ctx.model_dir = flags.model_dir;
  if (!flags.served_names.empty()) {
    ctx.model_id = flags.served_names[0];
    ctx.model_aliases.assign(flags.served_names.begin() + 1, flags.served_names.end());
  } else {
    ctx.model_id = std::filesystem::path(flags.model_dir).lexically_normal().filename().string();
    if (ctx.model_id.empty()) {
      ctx.model_id = std::filesystem::path(flags.model_dir).parent_path().filename().string();
    }
  }
  std::vector<std::string> not_applied;
  Result<GenerationDefaults> defaults = read_generation_defaults(
      (std::filesystem::path(flags.model_dir) / "generation_config.json").string(), not_applied);
  if (!defaults.ok()) return fail(cmd, defaults.status());
  ctx.limits.defaults = *defaults;
  for (const std::string& name : not_applied) {
    std::fprintf(stderr,
                 "cellm serve: warning: generation_config.json sets %s, which this server does "
                 "not apply; requests that send it get 400\n",
                 name.c_str());
  }
  ctx.created_unix = unix_now();
  ctx.limits.max_n = flags.max_sessions;
  // What the executor resolved: the context a session may use, capped by the pool.
  ctx.limits.max_session_tokens = engine->limits().max_session_tokens;
  ctx.limits.model_context = static_cast<int64_t>(config.max_position_embeddings());
  ctx.limits.kv_cells = engine->kv_pool().cells;
  ctx.limits.vocab_size = static_cast<int32_t>(config.vocab_size());
  ctx.api_key = flags.api_key;
  ctx.tokenizer = tokenizer;
  ctx.engine = serving.get();
  ctx.admission = &admission;
  ctx.metrics = &metrics;

  // Error answers name the model by its id, never by where it is kept.
  {
    std::vector<std::pair<std::string, std::string>> redactions;
    std::error_code ec;  // a form that cannot be resolved is left out (empty)
    const std::filesystem::path given(flags.model_dir);
    for (const std::string& dir :
         {flags.model_dir, std::filesystem::absolute(given, ec).lexically_normal().string(),
          std::filesystem::weakly_canonical(given, ec).string()}) {
      std::string trimmed = dir;
      while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
      redactions.emplace_back(trimmed, "<model " + ctx.model_id + ">");
    }
    if (flags.chat_template_file) {
      redactions.emplace_back(*flags.chat_template_file, "<chat template file>");
    }
    set_error_redactions(std::move(redactions));
  }

  ConnectionLimits connection_limits;
  connection_limits.request_timeout =
      std::chrono::milliseconds(std::max<int64_t>(1, std::llround(flags.request_timeout_s * 1000)));
  connection_limits.max_header_bytes = kMaxHeaderBytes;
  connection_limits.max_body_bytes = kMaxBodyBytes;
  HttpServer svr(connection_limits);
  const size_t http_threads =
      static_cast<size_t>(flags.max_sessions) + static_cast<size_t>(flags.max_queued) + 64;
  svr.new_task_queue = [http_threads] { return new httplib::ThreadPool(http_threads); };
  std::atomic<bool> stopping{false};

  svr.set_pre_routing_handler([&](const httplib::Request& req, httplib::Response& res) {
    request_log() = RequestLog{now_us(), 0, 0, false};
    allow_origin(flags.allowed_origins, req, res);
    if (req.method == "OPTIONS") {
      // A CORS preflight: answered here, before the API key is asked for.
      res.status = 204;
      if (res.has_header("Access-Control-Allow-Origin")) {
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
        res.set_header("Access-Control-Max-Age", "600");
      }
      return httplib::Server::HandlerResponse::Handled;
    }
    // Every endpoint but /health (and /metrics when public) wants the key, unknown
    // paths too: without it, nothing tells which paths exist.
    const bool open_path =
        req.path == "/health" || (flags.metrics_public && req.path == "/metrics");
    if (ctx.api_key && !open_path &&
        !constant_time_equals("Bearer " + *ctx.api_key, req.get_header_value("Authorization"))) {
      send_error(res, ApiError{401, "Incorrect or missing API key", "invalid_request_error", "",
                               "invalid_api_key"});
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  svr.set_logger([&](const httplib::Request& req, const httplib::Response& res) {
    const RequestLog log = std::exchange(request_log(), RequestLog{});
    // A request refused before routing (408, 431, 413) has no start time.
    const double ms = log.t_start_us > 0 ? static_cast<double>(now_us() - log.t_start_us) / 1e3 : 0;
    metrics.count_http(path_label(req.path), res.status);
    std::fprintf(
        stderr, "cellm serve: %s %s %d prompt_tokens=%lld generated_tokens=%lld %.1f ms%s\n",
        req.method.c_str(), req.path.c_str(), res.status, static_cast<long long>(log.prompt_tokens),
        static_cast<long long>(log.completion_tokens), ms, log.client_gone ? " (client gone)" : "");
  });
  // Every error answer is an OpenAI error object, httplib's own included.
  svr.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        const int status = res.status;
        if (status == 413) {
          send_error(res, ApiError{413,
                                   "the request body is larger than the server's limit of " +
                                       std::to_string(kMaxBodyBytes) + " bytes",
                                   "invalid_request_error", "", "body_too_large"});
          return httplib::Server::HandlerResponse::Handled;
        }
        // A request the connection layer refused (too slow, headers too large).
        if (std::optional<ApiError> refusal = HttpServer::connection_refusal()) {
          send_error(res, *refusal);
          return httplib::Server::HandlerResponse::Handled;
        }
        std::string message = "HTTP error " + std::to_string(status);
        if (status == 404) message = "no such endpoint";
        if (status == 414)
          message = "the request line is longer than the server's limit of 8192 bytes";
        send_error(res, ApiError{status, message,
                                 status >= 500 ? "server_error" : "invalid_request_error", "", ""});
        return httplib::Server::HandlerResponse::Handled;
      }));
  // An exception's text may name files or internals: it goes to the log, never to
  // the client.
  svr.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        std::fprintf(stderr, "cellm serve: %s %s: internal error: %s\n", req.method.c_str(),
                     req.path.c_str(), what.c_str());
        send_error(res, ApiError{500, "internal error (the server's log has the details)",
                                 "server_error", "", ""});
      });

  // The JSON endpoints' bodies (read after the pre-routing handler): nesting deeper
  // than kMaxJsonDepth is refused before any parser sees it.
  auto json_endpoint = [](auto handler) {
    return [handler](const httplib::Request& req, httplib::Response& res) {
      if (std::optional<ApiError> e = check_json_depth(req.body, kMaxJsonDepth)) {
        return send_error(res, *e);
      }
      handler(req, res);
    };
  };
  svr.Post("/v1/completions",
           json_endpoint([&](const httplib::Request& req, httplib::Response& res) {
             handle_completions(ctx, req, res);
           }));
  std::shared_ptr<const ChatEndpoint> chat = make_chat_endpoint(
      engine->chat_template(), engine->chat_template_status(), flags.tool_call_parser);
  if (flags.chat_template_file) {
    Result<ChatTemplate> custom = load_chat_template_file(*flags.chat_template_file, tokenizer);
    if (!custom.ok()) return fail(cmd, custom.status());
    chat = make_chat_endpoint(&*custom, Status::Ok(), flags.tool_call_parser);
  }
  if (const Status& s = chat_template_status(*chat); !s.ok()) {
    std::fprintf(stderr, "cellm serve: /v1/chat/completions unavailable: %s\n",
                 s.message().c_str());
  }
  svr.Post("/v1/chat/completions",
           json_endpoint([&](const httplib::Request& req, httplib::Response& res) {
             handle_chat(ctx, *chat, req, res);
           }));
  svr.Post("/tokenize", json_endpoint([&](const httplib::Request& req, httplib::Response& res) {
             handle_tokenize(ctx, *chat, req, res);
           }));
  svr.Post("/detokenize", json_endpoint([&](const httplib::Request& req, httplib::Response& res) {
             handle_detokenize(ctx, req, res);
           }));
  auto model_card = [&](const std::string& id) {
    return json{{"id", id},
                {"object", "model"},
                {"created", ctx.created_unix},
                {"owned_by", "cellm"},
                {"root", ctx.model_dir},
                {"max_model_len", ctx.limits.max_session_tokens}};
  };
  svr.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
    json data = json::array({model_card(ctx.model_id)});
    for (const std::string& alias : ctx.model_aliases) data.push_back(model_card(alias));
    send_json(res, 200, {{"object", "list"}, {"data", std::move(data)}});
  });
  svr.Get(R"(/v1/models/(.+))", [&](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    if (auto e = check_model(ctx, id)) return send_error(res, *e);
    send_json(res, 200, model_card(id));
  });
  svr.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    if (stopping.load()) {
      return send_json(res, 503, {{"status", "stopping"}});
    }
    send_json(res, 200, {{"status", "ok"}});
  });
  svr.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    ServeGauges g;
    g.requests_waiting = admission.waiting();
    g.requests_running = admission.requests_admitted();
    g.sessions_running = admission.slots_in_use();
    g.kv = runner.kv_metrics();
    g.engine = runner.metrics();
    g.queued_tasks = static_cast<int64_t>(runner.queued_tasks());
    // The process's resident memory, under the name Prometheus' client libraries give
    // it, so growth under load can be watched (docs/RELIABILITY.md).
    std::string text = metrics.render(g);
    text +=
        "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
        "# TYPE process_resident_memory_bytes gauge\n"
        "process_resident_memory_bytes " +
        std::to_string(process_resident_bytes()) + "\n";
    res.set_content(text, "text/plain; version=0.0.4");
  });

  int port = flags.port;
  if (port == 0) {
    port = svr.bind_to_any_port(flags.host);
    if (port < 0) port = 0;
  } else if (!svr.bind_to_port(flags.host, port)) {
    port = 0;
  }
  if (port == 0) {
    return fail(cmd, IoError("cannot listen on " + flags.host + ":" + std::to_string(flags.port)));
  }
  if (!raise_listen_backlog(port, 1024)) {
    std::fprintf(stderr, "cellm serve: warning: could not raise the listen backlog\n");
  }
  signals.start(
      [&](int sig) {
        std::fprintf(stderr,
                     "cellm serve: %s: stopping (no new connections; requests in flight may "
                     "finish for %g s)\n",
                     sig == SIGINT ? "SIGINT" : "SIGTERM", flags.shutdown_timeout_s);
        stopping.store(true);
        admission.close();
        svr.stop_accepting();
      },
      [&](bool second_signal) {
        std::fprintf(stderr, "cellm serve: %s: cancelling the %d requests in flight\n",
                     second_signal ? "second signal" : "shutdown timeout",
                     admission.requests_admitted());
        serving->cancel_all();
        svr.abort_waiting_io();
      },
      std::chrono::milliseconds(std::llround(flags.shutdown_timeout_s * 1000)));
  std::fprintf(stderr,
               "cellm serve: model %s (%s executor, %d generations at once, %s admission, "
               "prefix cache %s)\n",
               ctx.model_id.c_str(), to_string(engine->executor_kind()), flags.max_sessions,
               to_string(flags.kv_policy), flags.prefix_cache ? "on" : "off");
  std::fprintf(stderr, "cellm serve: %s\n", describe_kv_pool(engine->kv_pool()).c_str());
  std::fprintf(stderr, "cellm serve: listening on http://%s:%d\n", flags.host.c_str(), port);
  const bool listened = svr.listen_after_bind();
  signals.join();
  serving.reset();
  runner.shutdown();
  std::fprintf(stderr, "cellm serve: stopped\n");
  return listened || stopping.load() ? 0 : 1;
}

}  // namespace cellm::cli
