// augur serve: the OpenAI-compatible HTTP server.
//
// One libevent loop holds every connection (no thread a client): it parses
// requests (server/openai.h), hands them to the scheduler (runtime/
// scheduler.h), whose thread steps the engine over all running requests, and
// writes each request's events back as they come, as server-sent events for
// streams. A client that goes away has its requests cancelled and their
// memory freed.
//
// Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models,
// GET /health, GET /metrics (Prometheus text format).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/engine.h"
#include "runtime/scheduler.h"

namespace augur::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                       // 0: any free port (port() says which)
  std::string model_name = "augur";      // the id /v1/models lists and requests name
  size_t max_body_bytes = size_t(8) << 20;
  int64_t default_max_tokens = 256;
  SpeculationParams speculation;         // every request's draft source (none by default)
};

class Server {
 public:
  // The engine is the server's until it is destroyed.
  Server(Engine& engine, const SchedulerOptions& sched, const ServerOptions& opts);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Listens on host:port; throws augur::Error naming them when it cannot.
  void bind();
  int port() const;
  // Serves until stop() or SIGINT / SIGTERM.
  void run();
  // Thread-safe.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace augur::server
