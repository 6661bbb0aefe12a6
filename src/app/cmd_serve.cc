// `ember serve`: the OpenAI-compatible HTTP server over one model (see src/serve/http_server.h).
// Cheap checks come first: the flags, then the port (bound before the weights load, so a port in
// use fails at once). Start-up prints the address, model, context length and KV capacity. SIGINT/SIGTERM: new
// requests get 503 at once, in-flight ones may finish for --shutdown-grace seconds (a second
// signal, or the end of the grace period, cancels what is left), then the process exits 0.
#include <pthread.h>
#include <unistd.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "app/commands.h"
#include "app/common.h"
#include "app/served_bundle.h"
#include "serve/http_server.h"
#include "serve/output_parsers.h"
#include "template/chat_template.h"
#include "util/flags.h"
#include "util/log.h"
#include "util/mapped_file.h"

namespace ember::app {

namespace {

std::string BaseName(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const size_t slash = dir.find_last_of('/');
  return slash == std::string::npos ? dir : dir.substr(slash + 1);
}

void PrintServedModel(const ServedBundle& bundle, const std::string& dir, const std::string& host,
                      int port, bool api_key) {
  const serve::ServedModel& served = bundle.served();
  std::printf("ember serve: listening on http://%s:%d\n", host.c_str(), port);
  std::printf("  model %s (%s), context %d tokens, KV capacity %lld tokens (%lld bytes, %s), tool "
              "calls: %s, reasoning: %s%s%s\n",
              served.name.c_str(), dir.c_str(), served.context_length,
              static_cast<long long>(bundle.engine().kv_capacity_tokens()),
              static_cast<long long>(bundle.engine().kv_cache_bytes()),
              bundle.engine().model().KvDTypes().c_str(),
              serve::ToolCallFormatName(served.tool_format),
              serve::ReasoningFormatName(served.reasoning_format),
              bundle.chat_template().has_template() ? "" : ", no chat template (completions only)",
              api_key ? ", API key required" : "");
}

// The library's default budget: three quarters of the machine's memory.
int64_t DefaultModelsMemory() {
  const int64_t pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? pages / 4 * 3 * page : int64_t{8} << 30;
}

}  // namespace

int ServeCommand(int argc, char** argv, int first) {
  std::string model_dir, models_dir, served_name, chat_template_file, tool_call_parser = "auto",
              reasoning_parser = "auto";
  std::string host = "127.0.0.1";
  int64_t models_memory = 0;
  int64_t port = 8080, max_body_bytes = int64_t{16} << 20, http_threads = 2;
  int64_t max_connections = 4096, stream_buffer_bytes = int64_t{1} << 20;
  double shutdown_grace = 30.0, header_timeout = 10, body_timeout = 30, keep_alive_timeout = 10,
         stall_timeout = 30;
  std::string allowed_hosts, cors_origin;
  serve::HttpConfig http;
  EngineFlags engine_flags;
  FlagParser flags(
      "usage: ember serve (--model DIR | --models-dir DIR [--models-memory B])\n"
      "       [--host 127.0.0.1] [--port 8080] [--served-model-name NAME]\n"
      "       [--api-key KEY] [--max-batch N] [--kv-cache-bytes B] [--kv-cache-dtype T]\n"
      "       [--max-queue N]\n"
      "       [--prompt-cache-ram-bytes B] [--prompt-cache-dir DIR --prompt-cache-disk-bytes B]\n"
      "       [--chat-template FILE]\n"
      "       [--tool-call-parser auto|none|hermes|llama3_json|mistral|harmony]\n"
      "       [--reasoning-parser auto|none|think|harmony]\n"
      "       [--max-body-bytes B] [--http-threads N] [--max-connections N]\n"
      "       [--header-timeout S] [--body-timeout S] [--keep-alive-timeout S]\n"
      "       [--stream-buffer-bytes B] [--stall-timeout S] [--allowed-hosts H,H]\n"
      "       [--cors-origin O]");
  flags.AddString("--model", &model_dir, "Hugging Face model folder or .gguf file");
  flags.AddString("--models-dir", &models_dir,
                  "serve every model folder below DIR, each loaded when a request names it");
  flags.AddInt("--models-memory", &models_memory,
               "bytes the library's resident models may hold (weights + KV caps; least recently "
               "used idle models are evicted; default 3/4 of the machine's memory)");
  flags.AddString("--host", &host, "address to bind (default 127.0.0.1: loopback only)");
  flags.AddInt("--port", &port, "TCP port (default 8080; 0 = any free port)");
  flags.AddString("--served-model-name", &served_name, "model id clients use (default: folder name)");
  flags.AddString("--api-key", &http.api_key, "require 'Authorization: Bearer KEY' on /v1 routes");
  flags.AddString("--chat-template", &chat_template_file, "Jinja chat template file (overrides the model's)");
  flags.AddString("--tool-call-parser", &tool_call_parser,
                  "how the model writes tool calls (default auto: read from the chat template)");
  flags.AddString("--reasoning-parser", &reasoning_parser,
                  "split reasoning_content off: think (a leading <think> block) or harmony "
                  "(gpt-oss's analysis channel) (default auto: read from the chat template)");
  flags.AddInt("--max-body-bytes", &max_body_bytes, "request body limit, 413 above (default 16 MiB)");
  flags.AddInt("--http-threads", &http_threads,
               "I/O threads, shared by every connection (default 2; at most 64 are used)");
  flags.AddInt("--max-connections", &max_connections,
               "open connections at most; more are answered 503 and closed (default 4096)");
  flags.AddDouble("--header-timeout", &header_timeout,
                  "seconds a request header may take to arrive (default 10; 408 after)");
  flags.AddDouble("--body-timeout", &body_timeout,
                  "seconds a request body may take after its header (default 30; 408 after)");
  flags.AddDouble("--keep-alive-timeout", &keep_alive_timeout,
                  "seconds an idle connection waits for its next request (default 10)");
  flags.AddInt("--stream-buffer-bytes", &stream_buffer_bytes,
               "unsent response bytes above which a stream stops taking tokens (default 1 MiB)");
  flags.AddDouble("--stall-timeout", &stall_timeout,
                  "seconds a client may read nothing while output waits; then its request is "
                  "cancelled and the connection closed (default 30)");
  flags.AddString("--allowed-hosts", &allowed_hosts,
                  "comma-separated Host names accepted besides the bound address ('*': any)");
  flags.AddString("--cors-origin", &cors_origin,
                  "let web pages from ORIGIN call the server ('*': any; default: none)");
  flags.AddDouble("--shutdown-grace", &shutdown_grace,
                  "seconds in-flight requests may finish after SIGTERM/SIGINT (default 30)");
  engine_flags.Register(flags, /*serving=*/true);
  if (int rc = ParseOrExit(flags, argc, argv, first); rc >= 0) return rc;
  // Refused before anything loads (a library model would otherwise fail at its first request).
  if (Status st = engine_flags.CheckSpeculation(); !st.ok()) return Fail(st.message());
  if (model_dir.empty() == models_dir.empty())
    return Fail(model_dir.empty() ? "--model DIR (or --models-dir DIR) is required"
                                  : "--model and --models-dir exclude each other");
  if (!models_dir.empty() && !served_name.empty())
    return Fail("--served-model-name: not with --models-dir (a library model's id is its folder)");
  if (!models_dir.empty() &&
      (!engine_flags.loras.empty() || engine_flags.max_loras > 0 || !engine_flags.adapter.empty()))
    return Fail("--lora / --max-loras / --adapter: not with --models-dir (adapters belong to one "
                "base model: serve it with --model)");
  if (!models_dir.empty() && !chat_template_file.empty())
    return Fail("--chat-template: not with --models-dir (each model uses its own)");
  if (models_memory < 0) return Fail("--models-memory: must be positive");
  if (models_memory > 0 && models_dir.empty()) return Fail("--models-memory: needs --models-dir");
  if (models_memory == 0) models_memory = DefaultModelsMemory();
  if (port < 0 || port > 65535) return Fail("--port: must be in [0, 65535]");
  if (max_body_bytes < 1) return Fail("--max-body-bytes: must be positive");
  // Bad names and flags that conflict by themselves fail before the model loads (with no
  // template, auto adds no conflict); the template's part of the choice comes after.
  if (auto early = serve::ChooseOutputParsers(reasoning_parser, tool_call_parser, ""); !early.ok())
    return Fail(early.message());
  // Still accepts the old thread-per-connection values; more than 64 I/O threads buy nothing.
  if (http_threads < 1 || http_threads > 8192) return Fail("--http-threads: must be in [1, 8192]");
  if (max_connections < 1 || max_connections > 1000000)
    return Fail("--max-connections: must be in [1, 1000000]");
  if (stream_buffer_bytes < 1) return Fail("--stream-buffer-bytes: must be positive");
  for (auto [name, value] : {std::pair{"--header-timeout", header_timeout},
                             std::pair{"--body-timeout", body_timeout},
                             std::pair{"--keep-alive-timeout", keep_alive_timeout},
                             std::pair{"--stall-timeout", stall_timeout}}) {
    if (!(value > 0 && value <= 86400)) return Fail(std::string(name) + ": must be in (0, 86400] seconds");
  }
  if (!(shutdown_grace >= 0 && shutdown_grace <= 86400))
    return Fail("--shutdown-grace: must be in [0, 86400] seconds");

  // Signals go to one waiting thread (sigwait), never to a worker in the middle of a write.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that hung up must not kill the server

  http.host = host;
  http.port = static_cast<int>(port);
  http.max_body_bytes = static_cast<size_t>(max_body_bytes);
  http.num_threads = static_cast<int>(std::min<int64_t>(http_threads, 64));
  http.max_connections = static_cast<int>(max_connections);
  http.header_timeout_s = header_timeout;
  http.body_timeout_s = body_timeout;
  http.keep_alive_timeout_s = keep_alive_timeout;
  http.stream_buffer_bytes = static_cast<size_t>(stream_buffer_bytes);
  http.stall_timeout_s = stall_timeout;
  http.cors_origin = cors_origin;
  for (size_t start = 0; start <= allowed_hosts.size();) {
    const size_t comma = std::min(allowed_hosts.find(',', start), allowed_hosts.size());
    if (comma > start) http.allowed_hosts.push_back(allowed_hosts.substr(start, comma - start));
    start = comma + 1;
  }
  serve::HttpServer server(http);
  auto bound = server.Bind();  // before the weights: a port in use fails in milliseconds
  if (!bound.ok()) return Fail(bound.message());

  ServeModelOptions model_options;
  model_options.chat_template_file = chat_template_file;
  model_options.reasoning_parser = reasoning_parser;
  model_options.tool_call_parser = tool_call_parser;
  model_options.engine = engine_flags;
  // One model (--model), or a library of them loaded on demand (--models-dir).
  std::unique_ptr<ServedBundle> bundle;
  std::unique_ptr<serve::ModelLibrary> library;
  if (!models_dir.empty()) {
    serve::LibraryHooks hooks;
    hooks.load = [model_options](const serve::LibraryModelInfo& info)
        -> Result<std::unique_ptr<serve::ResidentModel>> {
      auto b = ServedBundle::Load(info.path, info.id, model_options);
      if (!b.ok()) return b.status();
      return std::unique_ptr<serve::ResidentModel>(std::move(*b));
    };
    hooks.estimate_bytes = [engine_flags](const serve::LibraryModelInfo& info) {
      return EstimateServedBytes(info, engine_flags);
    };
    library = std::make_unique<serve::ModelLibrary>(models_dir, models_memory, std::move(hooks));
    if (Status scanned = library->Rescan(); !scanned.ok()) return Fail(scanned.message());
    std::printf("ember serve: listening on http://%s:%d\n", host.c_str(), *bound);
    std::printf("  model library %s: %zu models, loaded on demand within %lld MiB%s\n",
                models_dir.c_str(), library->List().size(),
                static_cast<long long>(models_memory >> 20),
                http.api_key.empty() ? "" : ", API key required");
  } else {
    auto loaded = ServedBundle::Load(
        model_dir, served_name.empty() ? BaseName(model_dir) : served_name, model_options);
    if (!loaded.ok()) return Fail(loaded.message());
    bundle = std::move(*loaded);
    PrintServedModel(*bundle, model_dir, host, *bound, !http.api_key.empty());
  }
  std::fflush(stdout);
  // The engines serving now (the library's resident ones), for the shutdown's drain.
  const auto engines = [&] {
    std::vector<serve::ModelLibrary::Lease> leases;
    if (library != nullptr) leases = library->Resident();
    else leases.emplace_back(&bundle->served(), [](const serve::ServedModel*) {});
    return leases;
  };

  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (sig == 0) return;
    server.BeginShutdown();  // new requests: 503
    LOG_INFO << "ember serve: signal " << sig << ", letting in-flight requests finish (up to "
             << shutdown_grace << " s; signal again to cancel them)";
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration<double>(shutdown_grace);
    while (std::chrono::steady_clock::now() < deadline) {
      bool idle = true;
      for (const auto& m : engines()) {
        const EngineStats stats = m->engine->Stats();
        idle = idle && stats.num_running == 0 && stats.num_queued == 0;
      }
      if (idle) break;
      const timespec poll{0, 50'000'000};
      if (sigtimedwait(&signals, nullptr, &poll) > 0) {
        LOG_INFO << "ember serve: second signal, cancelling in-flight requests";
        break;
      }
    }
    // What is left ends now (cancelled: 503 / error event).
    for (const auto& m : engines()) m->engine->Shutdown(/*drain=*/false);
    server.Stop();  // stop accepting; Serve() returns
  });
  if (library != nullptr) server.ServeLibrary(library.get());
  else server.Serve(bundle->served());
  // Serve() also returns if the listener fails; make sure the signal thread ends either way.
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  for (const auto& m : engines()) m->engine->Shutdown(/*drain=*/false);
  std::printf("ember serve: stopped\n");
  return 0;
}

}  // namespace ember::app
