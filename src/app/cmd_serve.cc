// `ember serve`: the OpenAI-compatible HTTP server over one model (see src/serve/http_server.h).
// Cheap checks come first: the flags, then the port (bound before the weights load, so a port in
// use fails at once). Start-up prints the address, model, context length and KV capacity. SIGINT/SIGTERM: new
// requests get 503 at once, in-flight ones may finish for --shutdown-grace seconds (a second
// signal, or the end of the grace period, cancels what is left), then the process exits 0.
#include <pthread.h>
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
#include "app/model_files.h"
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

}  // namespace

int ServeCommand(int argc, char** argv, int first) {
  std::string model_dir, served_name, chat_template_file, tool_call_parser = "auto",
              reasoning_parser = "auto";
  std::string host = "127.0.0.1";
  int64_t port = 8080, max_body_bytes = int64_t{16} << 20, http_threads = 2;
  int64_t max_connections = 4096, stream_buffer_bytes = int64_t{1} << 20;
  double shutdown_grace = 30.0, header_timeout = 10, body_timeout = 30, keep_alive_timeout = 10,
         stall_timeout = 30;
  std::string allowed_hosts, cors_origin;
  serve::HttpConfig http;
  EngineFlags engine_flags;
  FlagParser flags(
      "usage: ember serve --model DIR [--host 127.0.0.1] [--port 8080] [--served-model-name NAME]\n"
      "       [--api-key KEY] [--max-batch N] [--kv-cache-bytes B] [--max-queue N]\n"
      "       [--chat-template FILE] [--tool-call-parser auto|none|hermes|llama3_json|harmony]\n"
      "       [--reasoning-parser auto|none|think|harmony]\n"
      "       [--max-body-bytes B] [--http-threads N] [--max-connections N]\n"
      "       [--header-timeout S] [--body-timeout S] [--keep-alive-timeout S]\n"
      "       [--stream-buffer-bytes B] [--stall-timeout S] [--allowed-hosts H,H] [--cors-origin O]");
  flags.AddString("--model", &model_dir, "Hugging Face model folder or .gguf file");
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
  if (model_dir.empty()) return Fail("--model is required");
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

  // The tokenizer and the chat template before the weights: a missing or broken one fails in
  // milliseconds, not after minutes of loading a large model.
  auto tokenizer = LoadModelTokenizer(model_dir);
  if (!tokenizer.ok()) return Fail(tokenizer.message());
  if (*tokenizer == nullptr) return Fail(TokenizerSource(model_dir) + ": not found (serve needs it)");
  ChatTemplate chat_template;
  bool have_template_object = false;
  if (!chat_template_file.empty()) {
    auto source = ReadFileToString(chat_template_file);
    if (!source.ok()) return Fail(source.message());
    auto t = ChatTemplate::FromSource(*source, (*tokenizer)->bos_token(), (*tokenizer)->eos_token());
    if (!t.ok()) return Fail(chat_template_file + ": " + t.message());
    chat_template = std::move(*t);
    have_template_object = true;
  } else {
    auto t = LoadModelChatTemplate(model_dir);
    if (!t.ok()) return Fail(t.message());
    chat_template = std::move(*t);
    have_template_object = true;
  }
  auto parsers =
      serve::ChooseOutputParsers(reasoning_parser, tool_call_parser, chat_template.tools_source());
  if (!parsers.ok()) return Fail(parsers.message());

  auto loaded = LoadModelAndEngine(model_dir, engine_flags, std::move(*tokenizer));
  if (!loaded.ok()) return Fail(loaded.message());
  LoadedModel& lm = *loaded;

  serve::ServedModel served = ServedModelOf(lm);
  served.name = served_name.empty() ? BaseName(model_dir) : served_name;
  served.chat_template = have_template_object ? &chat_template : nullptr;
  if (have_template_object && lm.tokenizer != nullptr)
    served.protected_strings = serve::ProtectedStringsOf(*lm.tokenizer, chat_template);
  served.max_n = engine_flags.Config().max_n;
  served.token_texts = serve::JsonModeTexts(*lm.tokenizer, served.vocab_size);
  served.tool_format = parsers->tools;
  served.reasoning_format = parsers->reasoning;

  std::printf("ember serve: listening on http://%s:%d\n", host.c_str(), *bound);
  std::printf("  model %s (%s), context %d tokens, KV capacity %lld tokens (%lld bytes), tool calls: "
              "%s, reasoning: %s%s%s\n",
              served.name.c_str(), model_dir.c_str(), served.context_length,
              static_cast<long long>(lm.engine->kv_capacity_tokens()),
              static_cast<long long>(lm.engine->kv_cache_bytes()),
              serve::ToolCallFormatName(served.tool_format),
              serve::ReasoningFormatName(served.reasoning_format),
              chat_template.has_template() ? "" : ", no chat template (completions only)",
              http.api_key.empty() ? "" : ", API key required");
  std::fflush(stdout);

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
      const EngineStats stats = lm.engine->Stats();
      if (stats.num_running == 0 && stats.num_queued == 0) break;
      const timespec poll{0, 50'000'000};
      if (sigtimedwait(&signals, nullptr, &poll) > 0) {
        LOG_INFO << "ember serve: second signal, cancelling in-flight requests";
        break;
      }
    }
    lm.engine->Shutdown(/*drain=*/false);  // what is left ends now (cancelled: 503 / error event)
    server.Stop();                         // stop accepting; Serve() returns
  });
  server.Serve(std::move(served));
  // Serve() also returns if the listener fails; make sure the signal thread ends either way.
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  lm.engine->Shutdown(/*drain=*/false);
  std::printf("ember serve: stopped\n");
  return 0;
}

}  // namespace ember::app
