#include "server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "server/openai.h"
#include "tokenizer/unicode.h"

namespace augur::server {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// A Prometheus histogram with fixed buckets (seconds).
struct Histogram {
  static constexpr std::array<double, 14> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                     0.25,  0.5,    1,     2.5,  5,     10,  30};
  std::array<int64_t, kBounds.size()> counts{};
  int64_t count = 0;
  double sum = 0;
  void observe(double v) {
    for (size_t i = 0; i < kBounds.size(); ++i)
      if (v <= kBounds[i]) ++counts[i];
    ++count;
    sum += v;
  }
  void write(std::ostringstream& os, const char* name, const char* help) const {
    os << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
    for (size_t i = 0; i < kBounds.size(); ++i) os << name << "_bucket{le=\"" << kBounds[i] << "\"} " << counts[i] << "\n";
    os << name << "_bucket{le=\"+Inf\"} " << count << "\n" << name << "_sum " << sum << "\n" << name << "_count " << count << "\n";
  }
};

// The server's counters; the loop's thread only.
struct Metrics {
  std::map<std::pair<std::string, int>, int64_t> requests;  // (endpoint, status)
  int64_t prompt_tokens = 0, generated_tokens = 0, cached_tokens = 0, cancelled = 0;
  int64_t drafted = 0, accepted = 0;
  Histogram ttft, itl;
};

}  // namespace

struct Server::Impl {
  // One choice of a call: one engine request.
  struct Choice {
    Scheduler::Ticket ticket = 0;
    ChoiceOutput out;
    ToolCallFilter filter;
    bool sent_first = false;  // a chunk of this choice went out (chat: with the role)
    bool done = false;
    Clock::time_point last;
    bool any_token = false;
  };
  // One HTTP request being answered.
  struct Call {
    evhttp_request* req = nullptr;
    evhttp_connection* conn = nullptr;
    std::string endpoint;
    ApiRequest api;
    ResponseMeta meta;
    std::vector<Choice> choices;
    int open = 0;          // choices not done
    bool started = false;  // the event stream's headers went out
    bool failed = false;
    bool any_token = false;  // a request's first token, of whichever choice, is its TTFT
    Usage usage;
    Clock::time_point t0;
  };
  // What the scheduler's thread hands over.
  struct Delivery {
    Scheduler::Ticket ticket;
    Event event;
    bool is_error = false;
    std::string error;
  };

  Engine& engine;
  ServerOptions opts;
  SchedulerOptions sched_opts;
  std::unique_ptr<Scheduler> sched;
  event_base* base = nullptr;
  evhttp* http = nullptr;
  event* wake = nullptr;
  event* sigint = nullptr;
  event* sigterm = nullptr;
  event* watch = nullptr;
  evhttp_bound_socket* bound = nullptr;
  bool stopping = false;  // a signal came: shut_down
  int bound_port = 0;
  ApiContext ctx;
  Metrics metrics;
  std::mt19937_64 rng{std::random_device{}()};
  uint64_t next_id = 1;
  const std::string id_prefix = [] {
    std::random_device rd;
    char hex[24];
    std::snprintf(hex, sizeof hex, "%08x%08x-", rd(), rd());
    return std::string(hex);
  }();
  std::map<Scheduler::Ticket, std::pair<Call*, int>> by_ticket;
  std::map<evhttp_connection*, Call*> by_connection;

  std::mutex mu;
  std::vector<Delivery> outbox;  // mu

  Impl(Engine& e, const SchedulerOptions& so, const ServerOptions& o) : engine(e), opts(o), sched_opts(so) {
    static std::once_flag threads;
    std::call_once(threads, [] { evthread_use_pthreads(); });
    base = event_base_new();
    http = evhttp_new(base);
    if (!base || !http) fail("[server] libevent could not start");
    // libevent's own limit is far above ours, so that an oversized body gets
    // our JSON 413, not its HTML one.
    evhttp_set_max_body_size(http, ev_ssize_t(opts.max_body_bytes) * 4 + 4096);
    // Headers are bounded (libevent's default is not); methods are all let
    // through, so that a wrong one gets our JSON 405, not libevent's HTML 501.
    evhttp_set_max_headers_size(http, 64 * 1024);
    evhttp_set_allowed_methods(http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_OPTIONS | EVHTTP_REQ_HEAD |
                                         EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE | EVHTTP_REQ_PATCH | EVHTTP_REQ_TRACE);
    evhttp_set_gencb(http, &Impl::on_request, this);
    wake = event_new(base, -1, 0, &Impl::on_wake, this);
    sigint = evsignal_new(base, SIGINT, &Impl::on_signal, this);
    sigterm = evsignal_new(base, SIGTERM, &Impl::on_signal, this);
    event_add(sigint, nullptr);
    event_add(sigterm, nullptr);
    watch = event_new(base, -1, EV_PERSIST, &Impl::on_watch, this);
    const timeval every{0, 100 * 1000};
    event_add(watch, &every);
    ctx.model_name = opts.model_name;
    ctx.default_max_tokens = opts.default_max_tokens;
    ctx.has_chat_template = engine.text() && engine.text()->chat;
  }

  ~Impl() {
    sched.reset();  // its thread stops before the loop's objects go
    // Calls still open (a stop() without the signal's goodbyes) go first,
    // their connections told not to call on_close for them: evhttp_free
    // closes every connection.
    for (auto& [conn, call] : by_connection) {
      evhttp_connection_set_closecb(conn, nullptr, nullptr);
      delete call;
    }
    by_connection.clear();
    by_ticket.clear();
    if (sigint) event_free(sigint);
    if (sigterm) event_free(sigterm);
    if (wake) event_free(wake);
    if (watch) event_free(watch);
    if (http) evhttp_free(http);
    if (base) event_base_free(base);
  }

  // SIGINT / SIGTERM: no new connections or requests; each open call ends
  // with a 503 (a stream with an error event and [DONE]), and the loop ends
  // once those replies had a moment to go out.
  static void on_signal(evutil_socket_t, short, void* arg) { static_cast<Impl*>(arg)->shut_down(); }

  void shut_down() {
    if (stopping) return;
    stopping = true;
    if (bound) evhttp_del_accept_socket(http, bound);
    bound = nullptr;
    std::vector<Call*> open;
    for (const auto& [conn, call] : by_connection) open.push_back(call);
    for (Call* c : open) fail_call(c, ApiError{503, "the server is shutting down", "server_error", "", ""});
    const timeval grace{0, 500 * 1000};
    event_base_loopexit(base, &grace);
  }

  // ---- replies ----
  void count(const std::string& endpoint, int status) { ++metrics.requests[{endpoint, status}]; }

  void reply(evhttp_request* req, int status, const std::string& body, const char* type = "application/json") {
    evkeyvalq* h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", type);
    if (evhttp_request_get_command(req) == EVHTTP_REQ_HEAD) {
      // The headers GET would get, no body: libevent 2.1 would send one
      // (and no Content-Length), which a kept-alive client reads as the
      // start of its next response.
      evhttp_add_header(h, "Content-Length", std::to_string(body.size()).c_str());
      evhttp_send_reply(req, status, status_text(status), nullptr);
      return;
    }
    evbuffer* b = evbuffer_new();
    evbuffer_add(b, body.data(), body.size());
    evhttp_send_reply(req, status, status_text(status), b);
    evbuffer_free(b);
  }
  static const char* status_text(int s) {
    switch (s) {
      case 200: return "OK";
      case 400: return "Bad Request";
      case 404: return "Not Found";
      case 405: return "Method Not Allowed";
      case 413: return "Payload Too Large";
      case 429: return "Too Many Requests";
      case 503: return "Service Unavailable";
      default: return "Error";
    }
  }
  void reply_error(evhttp_request* req, const std::string& endpoint, const ApiError& e) {
    count(endpoint, e.status);
    reply(req, e.status, e.body().dump(-1, ' ', false, json::error_handler_t::replace));
  }
  void sse(evhttp_request* req, const std::string& data) {
    evbuffer* b = evbuffer_new();
    evbuffer_add(b, "data: ", 6);
    evbuffer_add(b, data.data(), data.size());
    evbuffer_add(b, "\n\n", 2);
    evhttp_send_reply_chunk(req, b);
    evbuffer_free(b);
  }

  // ---- requests ----
  // Nothing may escape into libevent: a failure answers 500 and serving goes on.
  static void on_request(evhttp_request* req, void* arg) {
    Impl* self = static_cast<Impl*>(arg);
    try {
      self->handle(req);
    } catch (const std::exception& e) {
      self->reply_error(req, "", ApiError{500, std::string("internal error: ") + e.what(), "server_error", "", ""});
    }
  }

  void handle(evhttp_request* req) {
    const char* uri = evhttp_request_get_uri(req);
    std::string path = uri ? uri : "";
    if (const size_t q = path.find('?'); q != std::string::npos) path.resize(q);
    const evhttp_cmd_type method = evhttp_request_get_command(req);
    // HEAD goes where GET does (reply() sends the headers alone).
    auto want = [&](evhttp_cmd_type m) {
      if (method == m || (m == EVHTTP_REQ_GET && method == EVHTTP_REQ_HEAD)) return true;
      evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", m == EVHTTP_REQ_GET ? "GET, HEAD" : "POST");
      reply_error(req, path, ApiError{405, "method not allowed on " + path, "invalid_request_error", "", ""});
      return false;
    };
    if (path == "/health") {
      if (!want(EVHTTP_REQ_GET)) return;
      const Scheduler::Stats s = sched->stats();
      count(path, s.failed ? 503 : 200);
      reply(req, s.failed ? 503 : 200,
            s.failed ? json{{"status", "failed"}, {"error", s.failure}}.dump(-1, ' ', false, json::error_handler_t::replace) : json{{"status", "ok"}}.dump(-1, ' ', false, json::error_handler_t::replace));
    } else if (path == "/v1/models") {
      if (!want(EVHTTP_REQ_GET)) return;
      count(path, 200);
      const json model = {{"id", opts.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "augur"},
                          {"max_model_len", ctx.max_context}};
      reply(req, 200, json{{"object", "list"}, {"data", json::array({model})}}.dump(-1, ' ', false, json::error_handler_t::replace));
    } else if (path == "/metrics") {
      if (!want(EVHTTP_REQ_GET)) return;
      count(path, 200);
      reply(req, 200, metrics_text(), "text/plain; version=0.0.4");
    } else if (path == "/v1/chat/completions" || path == "/v1/completions") {
      if (!want(EVHTTP_REQ_POST)) return;
      if (stopping)  // a kept-alive connection's request after the signal
        reply_error(req, path, ApiError{503, "the server is shutting down", "server_error", "", ""});
      else
        start_call(req, path);
    } else {
      // Counted under one label: paths are the client's to choose, and each
      // would otherwise add a series to /metrics for good.
      reply_error(req, "other", ApiError{404, "no such endpoint: " + path, "invalid_request_error", "", ""});
    }
  }

  void start_call(evhttp_request* req, const std::string& path) {
    const Endpoint endpoint = path == "/v1/completions" ? Endpoint::Completions : Endpoint::ChatCompletions;
    evbuffer* in = evhttp_request_get_input_buffer(req);
    const size_t n = evbuffer_get_length(in);
    if (n > opts.max_body_bytes) {
      reply_error(req, path, ApiError{413, "the body is " + std::to_string(n) + " bytes; the limit is " +
                                               std::to_string(opts.max_body_bytes), "invalid_request_error", "", ""});
      return;
    }
    std::string body(n, '\0');
    evbuffer_copyout(in, body.data(), n);
    auto call = std::make_unique<Call>();
    call->endpoint = path;
    call->t0 = Clock::now();
    try {
      call->api = parse_request(endpoint, body, ctx, rng());
    } catch (const ApiError& e) {
      reply_error(req, path, e);
      return;
    }
    call->api.params.speculation = opts.speculation;
    // Ids unique across restarts and replicas: the process's random prefix
    // and a count.
    call->meta.id = std::string(endpoint == Endpoint::ChatCompletions ? "chatcmpl-" : "cmpl-") + id_prefix +
                    std::to_string(next_id++);
    call->meta.created = int64_t(std::time(nullptr));
    call->meta.model = opts.model_name;
    const int n_choices = int(call->api.prompts.size()) * call->api.n;
    call->choices.resize(size_t(n_choices));
    Call* c = call.get();
    for (int i = 0; i < n_choices; ++i) {
      RequestParams p = call->api.params;
      p.sampling.seed += uint64_t(i % call->api.n);
      try {
        c->choices[size_t(i)].ticket = sched->submit(call->api.prompts[size_t(i / call->api.n)], p, sink());
      } catch (const QueueFull& e) {
        for (int j = 0; j < i; ++j) forget(c->choices[size_t(j)].ticket, true);
        reply_error(req, path, ApiError{429, "the server is busy: " + std::string(e.what()), "rate_limit_error", "", ""});
        return;
      } catch (const std::exception& e) {
        // The choices admitted so far are cancelled whatever failed: they
        // would otherwise deliver to this call once it is gone.
        for (int j = 0; j < i; ++j) forget(c->choices[size_t(j)].ticket, true);
        const bool engine = dynamic_cast<const Error*>(&e) != nullptr;
        reply_error(req, path, ApiError{engine ? 503 : 500, e.what(), "server_error", "", ""});
        return;
      }
      by_ticket[c->choices[size_t(i)].ticket] = {c, i};
    }
    c->open = n_choices;
    c->req = req;
    c->conn = evhttp_request_get_connection(req);
    by_connection[c->conn] = call.release();
    evhttp_connection_set_closecb(c->conn, &Impl::on_close, this);
  }

  // Runs on the scheduler's thread: hand over, wake the loop.
  RequestSink sink() {
    RequestSink s;
    s.event = [this](Ticket t, const Event& e) { deliver(Delivery{t, e, false, {}}); };
    s.error = [this](Ticket t, const std::string& m) { deliver(Delivery{t, Event(), true, m}); };
    return s;
  }

  void deliver(Delivery d) {
    {
      std::lock_guard<std::mutex> lock(mu);
      outbox.push_back(std::move(d));
    }
    event_active(wake, 0, 0);
  }

  void forget(Scheduler::Ticket t, bool cancel) {
    by_ticket.erase(t);
    if (cancel) sched->cancel(t);
  }

  static void on_close(evhttp_connection* conn, void* arg) {
    Impl* self = static_cast<Impl*>(arg);
    auto it = self->by_connection.find(conn);
    if (it == self->by_connection.end()) return;
    Call* c = it->second;
    self->by_connection.erase(it);
    bool any_open = false;
    for (Choice& ch : c->choices)
      if (!ch.done) {
        any_open = true;
        self->forget(ch.ticket, true);
      }
    if (any_open) {
      ++self->metrics.cancelled;
      self->count(c->endpoint, 499);  // client closed the request
    }
    // When libevent itself saw the client go (a stream's end of file), it
    // detached the unfinished request from the connection instead of freeing
    // it, and it is ours to free; freed with its connection otherwise
    // (on_watch's evhttp_connection_free).
    if (evhttp_request_get_connection(c->req) == nullptr) evhttp_request_free(c->req);
    delete c;
  }

  // libevent notices a client that went away only when a write to it fails;
  // a request that is queued, prefilling or not streaming writes nothing, so
  // every 100 ms each waiting connection is asked whether it was closed.
  static void on_watch(evutil_socket_t, short, void* arg) {
    Impl* self = static_cast<Impl*>(arg);
    std::vector<evhttp_connection*> gone;
    for (const auto& [conn, call] : self->by_connection) {
      const int fd = int(bufferevent_getfd(evhttp_connection_get_bufferevent(conn)));
      if (fd < 0) continue;
      char b;
      const ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) gone.push_back(conn);
    }
    for (evhttp_connection* conn : gone) evhttp_connection_free(conn);  // calls on_close
  }

  static void on_wake(evutil_socket_t, short, void* arg) {
    try {
      static_cast<Impl*>(arg)->drain();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "augur serve: %s\n", e.what());
    }
  }

  void drain() {
    std::vector<Delivery> got;
    {
      std::lock_guard<std::mutex> lock(mu);
      got.swap(outbox);
    }
    for (Delivery& d : got) {
      auto it = by_ticket.find(d.ticket);
      if (it == by_ticket.end()) continue;  // its client has gone
      Call* c = it->second.first;
      const int i = it->second.second;
      if (d.is_error)
        fail_call(c, d.error);
      else
        on_event(c, i, d.event);
    }
  }

  void fail_call(Call* c, const std::string& message) {
    const bool ours = message.rfind("the engine failed", 0) == 0 || message.rfind("internal error", 0) == 0;
    // Clients (LangChain, LiteLLM, the Agents SDK) trim a conversation and
    // retry on this code or on "maximum context length" in the message.
    const bool too_long = message.find("maximum context length") != std::string::npos;
    fail_call(c, ApiError{ours ? 500 : 400, message, ours ? "server_error" : "invalid_request_error",
                          too_long ? (c->api.endpoint == Endpoint::ChatCompletions ? "messages" : "prompt") : "",
                          too_long ? "context_length_exceeded" : ""});
  }

  void fail_call(Call* c, const ApiError& e) {
    for (Choice& ch : c->choices)
      if (!ch.done) {
        ch.done = true;
        forget(ch.ticket, true);
      }
    count(c->endpoint, e.status);
    if (c->started) {  // mid-stream: an error event, then the end
      sse(c->req, e.body().dump(-1, ' ', false, json::error_handler_t::replace));
      sse(c->req, "[DONE]");
      evhttp_send_reply_end(c->req);
    } else {
      reply(c->req, e.status, e.body().dump(-1, ' ', false, json::error_handler_t::replace));
    }
    end_call(c);
  }

  // After the reply went out (the request is libevent's again).
  void end_call(Call* c) {
    evhttp_connection_set_closecb(c->conn, nullptr, nullptr);
    by_connection.erase(c->conn);
    delete c;
  }

  TokenText token_text() const {
    const TextModel* t = engine.text();
    // The text is the bytes' (U+FFFD for part of a character), so that
    // token and bytes agree, a leading space included.
    return {[t](int32_t id) { return t ? tok::utf8_lossy(t->tokenizer.token_bytes(id)) : std::to_string(id); },
            [t](int32_t id) { return t ? t->tokenizer.token_bytes(id) : std::to_string(id); }};
  }

  void start_stream(Call* c) {
    if (c->started) return;
    c->started = true;
    evkeyvalq* h = evhttp_request_get_output_headers(c->req);
    evhttp_add_header(h, "Content-Type", "text/event-stream");
    evhttp_add_header(h, "Cache-Control", "no-cache");
    evhttp_send_reply_start(c->req, 200, "OK");
  }

  void on_event(Call* c, int i, const Event& e) {
    Choice& ch = c->choices[size_t(i)];
    const Clock::time_point now = Clock::now();
    if (!e.ids.empty()) {
      if (!c->any_token) metrics.ttft.observe(seconds(c->t0, now));
      if (ch.any_token)
        for (size_t k = 0; k < e.ids.size(); ++k) metrics.itl.observe(seconds(ch.last, now) / double(e.ids.size()));
      c->any_token = ch.any_token = true;
      ch.last = now;
    }
    // The logprobs of the text: a closing stop id (EOS) has none, as in
    // OpenAI's replies, where the tokens of logprobs spell the content.
    std::vector<TokenLogprob> logprobs = e.logprobs;
    if (e.done && e.stop_token && !logprobs.empty()) logprobs.pop_back();
    ch.out.text += e.text;
    ch.out.logprobs.insert(ch.out.logprobs.end(), logprobs.begin(), logprobs.end());
    const bool chat = c->api.endpoint == Endpoint::ChatCompletions;
    if (c->api.stream) {
      start_stream(c);
      const std::string text = c->api.tools ? ch.filter.feed(e.text) : e.text;
      if (!text.empty() || !logprobs.empty() || (chat && !ch.sent_first)) {
        sse(c->req, delta_chunk(c->api, c->meta, i, text, logprobs, chat && !ch.sent_first, token_text()).dump(-1, ' ', false, json::error_handler_t::replace));
        ch.sent_first = true;
      }
    }
    if (!e.done) return;
    ch.done = true;
    --c->open;
    by_ticket.erase(ch.ticket);
    ch.out.finish = e.finish;
    ch.out.completion_tokens = e.usage.completion_tokens;
    // A prompt's tokens count once (its choices share them), and its cached
    // tokens are its choices' most; a batch's prompts add up.
    ch.out.prompt_tokens = e.usage.prompt_tokens;
    ch.out.cached_tokens = e.usage.cached_tokens;
    c->usage.prompt_tokens = c->usage.cached_tokens = 0;
    for (size_t first = 0; first < c->choices.size(); first += size_t(c->api.n)) {
      int64_t prompt = 0, cached = 0;
      for (size_t j = first; j < first + size_t(c->api.n); ++j) {
        prompt = std::max(prompt, c->choices[j].out.prompt_tokens);
        cached = std::max(cached, c->choices[j].out.cached_tokens);
      }
      c->usage.prompt_tokens += prompt;
      c->usage.cached_tokens += cached;
    }
    c->usage.completion_tokens += e.usage.completion_tokens;
    metrics.prompt_tokens += e.usage.prompt_tokens;
    metrics.cached_tokens += e.usage.cached_tokens;
    metrics.generated_tokens += e.usage.completion_tokens;
    metrics.drafted += e.drafts.drafted;
    metrics.accepted += e.drafts.accepted;
    if (c->api.stream) {
      const char* finish = finish_name(e.finish);
      if (c->api.tools && !ch.filter.held().empty()) {
        if (const auto calls = parse_tool_calls(ch.filter.held(), c->api.prompts[0].chat_extra.value("tools", json()))) {
          if (!calls->content.empty())
            sse(c->req, delta_chunk(c->api, c->meta, i, calls->content, {}, false, token_text()).dump(-1, ' ', false, json::error_handler_t::replace));
          sse(c->req, tool_calls_chunk(c->api, c->meta, i, calls->calls, false).dump(-1, ' ', false, json::error_handler_t::replace));
          finish = "tool_calls";
        } else {
          sse(c->req, delta_chunk(c->api, c->meta, i, ch.filter.held(), {}, false, token_text()).dump(-1, ' ', false, json::error_handler_t::replace));
        }
      }
      sse(c->req, finish_chunk(c->api, c->meta, i, finish).dump(-1, ' ', false, json::error_handler_t::replace));
    }
    if (c->open > 0) return;
    count(c->endpoint, 200);
    if (c->api.stream) {
      if (c->api.include_usage) sse(c->req, usage_chunk(c->meta, c->api, c->usage).dump(-1, ' ', false, json::error_handler_t::replace));
      sse(c->req, "[DONE]");
      evhttp_send_reply_end(c->req);
    } else {
      std::vector<ChoiceOutput> outs;
      for (const Choice& x : c->choices) outs.push_back(x.out);
      reply(c->req, 200, response_body(c->api, c->meta, outs, c->usage, token_text()).dump(-1, ' ', false, json::error_handler_t::replace));
    }
    end_call(c);
  }

  std::string metrics_text() const {
    const Scheduler::Stats s = sched->stats();
    std::ostringstream os;
    os << "# HELP augur_requests_total HTTP requests answered, by endpoint and status (499: the client went away)\n"
       << "# TYPE augur_requests_total counter\n";
    for (const auto& [key, n] : metrics.requests)
      os << "augur_requests_total{endpoint=\"" << key.first << "\",status=\"" << key.second << "\"} " << n << "\n";
    auto counter = [&](const char* name, const char* help, double v) {
      os << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n" << name << " " << v << "\n";
    };
    auto gauge = [&](const char* name, const char* help, double v) {
      os << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n" << name << " " << v << "\n";
    };
    counter("augur_prompt_tokens_total", "Prompt tokens of finished requests", double(metrics.prompt_tokens));
    counter("augur_generation_tokens_total", "Tokens generated", double(metrics.generated_tokens));
    counter("augur_cached_prompt_tokens_total", "Prompt tokens served from cache, not prefilled",
            double(metrics.cached_tokens));
    counter("augur_cancelled_requests_total", "Requests whose client went away before the end",
            double(metrics.cancelled));
    counter("augur_speculative_drafted_tokens_total", "Draft tokens proposed", double(metrics.drafted));
    counter("augur_speculative_accepted_tokens_total", "Draft tokens the model accepted", double(metrics.accepted));
    counter("augur_preemptions_total", "Requests preempted (their KV blocks given back, fed again later)",
            double(s.preemptions));
    counter("augur_engine_steps_total", "Engine steps (one forward over the running batch)", double(s.steps));
    gauge("augur_queue_depth", "Requests waiting to run", double(s.queued));
    gauge("augur_running_requests", "Requests in the running batch", double(s.running));
    gauge("augur_kv_cache_blocks_used", "KV cache blocks in use by requests", double(s.kv_blocks_used));
    gauge("augur_kv_cache_blocks_total", "KV cache blocks", double(s.kv_blocks_total));
    gauge("augur_kv_cache_bytes_used", "KV cache memory in use", double(s.kv_blocks_used * s.kv_block_bytes));
    gauge("augur_state_slots_used", "Recurrent-state slots in use (hybrid models)", double(s.state_slots_used));
    gauge("augur_state_bytes_used", "Recurrent-state memory in use", double(s.state_slots_used * s.state_slot_bytes));
    gauge("augur_prefix_cache_blocks", "KV blocks the prefix cache holds (shared with requests, or free to reclaim)",
          double(s.prefix_blocks));
    gauge("augur_prefix_cache_states", "Recurrent-state copies the prefix cache holds (hybrid models)",
          double(s.prefix_states));
    gauge("augur_prefix_cache_state_bytes", "Memory of those copies", double(s.prefix_state_bytes));
    gauge("augur_prefix_cache_hit_ratio", "Cached prompt tokens over prompt tokens",
          metrics.prompt_tokens > 0 ? double(metrics.cached_tokens) / double(metrics.prompt_tokens) : 0.0);
    gauge("augur_speculative_acceptance_ratio", "Accepted over drafted tokens",
          metrics.drafted > 0 ? double(metrics.accepted) / double(metrics.drafted) : 0.0);
    metrics.ttft.write(os, "augur_time_to_first_token_seconds", "Request arrival to its first token");
    metrics.itl.write(os, "augur_inter_token_latency_seconds", "Time between a request's tokens");
    return os.str();
  }
};

Server::Server(Engine& engine, const SchedulerOptions& sched, const ServerOptions& opts)
    : impl_(std::make_unique<Impl>(engine, sched, opts)) {}

Server::~Server() = default;

void Server::bind() {
  Impl& m = *impl_;
  m.bound = evhttp_bind_socket_with_handle(m.http, m.opts.host.c_str(), uint16_t(m.opts.port));
  if (!m.bound) fail("[server] cannot listen on ", m.opts.host, ":", m.opts.port, " (in use, or not an address here)");
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  getsockname(evhttp_bound_socket_get_fd(m.bound), reinterpret_cast<sockaddr*>(&addr), &len);
  m.bound_port = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                            : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  // The draft source, then the scheduler (and its warm-up), once the port
  // is ours: a bad --draft stops the server before it answers anything.
  m.engine.prepare_speculation(m.opts.speculation);
  m.sched = std::make_unique<Scheduler>(m.engine, m.sched_opts);
  m.ctx.max_context = m.sched->capacity_tokens();
}

int Server::port() const { return impl_->bound_port; }

void Server::run() {
  if (!impl_->bound) bind();
  event_base_dispatch(impl_->base);
}

void Server::stop() { event_base_loopbreak(impl_->base); }

}  // namespace augur::server
