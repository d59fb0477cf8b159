// `cohort serve CKPT [--bind HOST:PORT]`: a GPT that cohort trained behind the OpenAI-style
// HTTP API (docs/serving.md): POST /v1/completions (streamed as server-sent events on
// request), GET /v1/models, GET /health, GET /metrics. One process on the CPU; requests share
// the model through runtime/train/serve_engine (continuous batching over a paged KV cache).
// Owns the command line, the routes and the request checks; cpp-httplib parses HTTP, and
// obs::bind_http gives it the metrics endpoint's socket policy and connection bounds.
#include <httplib.h>
#include <malloc.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "runtime/core/error.hpp"
#include "runtime/core/process.hpp"
#include "runtime/cpu/kernels.hpp"
#include "runtime/obs/metrics.hpp"
#include "runtime/obs/metrics_connections.hpp"
#include "runtime/obs/metrics_server.hpp"
#include "runtime/train/generate.hpp"
#include "runtime/train/serve_engine.hpp"
#include "runtime/train/serve_shards.hpp"
#include "tools/commands.hpp"
#include "tools/serve_router.hpp"

namespace cohort::cli {
namespace {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

// An error answer in OpenAI's shape: {"error": {"message", "type", "param"}}.
void fail(httplib::Response& res, int status, const std::string& message,
          const std::string& param = "") {
  json e = {{"message", message},
            {"type", status >= 500 ? "server_error" : "invalid_request_error"},
            {"param", param.empty() ? json(nullptr) : json(param)}};
  res.status = status;
  res.set_content(json{{"error", e}}.dump(-1, ' ', false, json::error_handler_t::replace) + "\n", "application/json");
}

// A request's completion as the engine makes it, shared by the engine's callbacks and the
// HTTP handler that answers (or streams) it.
struct completion {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<int32_t> fresh;  // made, not yet streamed
  std::string text;
  int tokens = 0;
  bool done = false;
  bool gone = false;  // the client went away: stop the request
  std::string finish;
  clock_type::time_point start = clock_type::now(), last;
};

// What POST /v1/completions asked for, checked: empty ERROR, or what is wrong and the field.
struct parsed_request {
  train::serve_request req;
  bool stream = false;
  std::string error, param;
};

parsed_request parse_completion(const std::string& body, const train::loaded_gpt& g,
                                int max_tokens_limit) {
  parsed_request p;
  auto bad = [&p](const std::string& what, const std::string& param) {
    p.error = what;
    p.param = param;
    return p;
  };
  json j;
  try {
    j = json::parse(body);
  } catch (const std::exception& e) {
    return bad(std::string("the body is not JSON: ") + e.what(), "");
  }
  if (!j.is_object()) return bad("the body must be a JSON object", "");
  if (!j.contains("prompt") || !j["prompt"].is_string())
    return bad("'prompt' is required and must be a string", "prompt");
  const std::string prompt = j["prompt"].get<std::string>();
  if (prompt.empty()) return bad("'prompt' is empty", "prompt");
  try {
    p.req.prompt = train::encode_text(g.vocab, prompt);
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (what.rfind("--prompt: ", 0) == 0) what = "'prompt': " + what.substr(10);
    return bad(what, "prompt");
  }
  auto integer = [&](const char* key, int64_t lo, int64_t hi, int64_t dflt, int64_t& out) {
    if (!j.contains(key) || j[key].is_null()) {
      out = dflt;
      return true;
    }
    if (!j[key].is_number_integer()) return false;
    out = j[key].get<int64_t>();
    return out >= lo && out <= hi;
  };
  auto number = [&](const char* key, double dflt, double& out) {
    if (!j.contains(key) || j[key].is_null()) {
      out = dflt;
      return true;
    }
    if (!j[key].is_number()) return false;
    out = j[key].get<double>();
    return true;
  };
  int64_t max_tokens = 0, seed = 0, n = 0;
  if (!integer("max_tokens", 0, max_tokens_limit, 16, max_tokens))
    return bad("'max_tokens' must be an integer in [0, " + std::to_string(max_tokens_limit) +
                   "] (cohort serve --max-tokens-limit)",
               "max_tokens");
  if (!integer("seed", 0, INT64_MAX, 0, seed))
    return bad("'seed' must be an integer >= 0", "seed");
  if (!integer("n", 1, 1, 1, n)) return bad("'n' must be 1 (one completion a request)", "n");
  double temperature = 1, top_p = 1;
  if (!number("temperature", 1.0, temperature))
    return bad("'temperature' must be a number >= 0", "temperature");
  if (!number("top_p", 1.0, top_p)) return bad("'top_p' must be a number in (0, 1]", "top_p");
  p.req.sample.temperature = static_cast<float>(temperature);
  p.req.sample.top_p = static_cast<float>(top_p);
  try {
    nn::check_sampling(p.req.sample);
  } catch (const std::exception& e) {
    // The sampler names its command-line options; a request names its fields.
    std::string what = e.what();
    const bool temp = what.rfind("--temperature", 0) == 0;
    if (temp) what = "'temperature'" + what.substr(13);
    if (what.rfind("--top-p", 0) == 0) what = "'top_p'" + what.substr(7);
    return bad(what, temp ? "temperature" : "top_p");
  }
  if (j.contains("stream") && !j["stream"].is_null()) {
    if (!j["stream"].is_boolean()) return bad("'stream' must be true or false", "stream");
    p.stream = j["stream"].get<bool>();
  }
  p.req.max_tokens = static_cast<int>(max_tokens);
  p.req.seed = static_cast<uint64_t>(seed);
  return p;
}

struct serve_options {
  std::string checkpoint;
  std::string bind = "127.0.0.1:8000";
  int n_head = 0;
  train::serve_limits limits;
  int max_tokens_limit = 4096;
  int request_timeout_s = 300;
  int max_connections = 256;
  int threads = 1;
  int replicas = 1;
  train::shard_layout layout;  ///< --tp, --pp: the model across 1 + tp * pp processes
  std::string shard_dir;       ///< a shard process: its group's folder (hidden option)
  int shard_rank = 0;          ///< a shard process: its rank in the group (hidden option)
};

class server {
 public:
  /// D: the model's decoder when it runs elsewhere (shards); null: G's own, here.
  server(const serve_options& o, train::loaded_gpt g, std::unique_ptr<nn::decoder> d = nullptr)
      : opts_(o),
        g_(std::move(g)),
        engine_(d ? std::move(d) : std::make_unique<nn::gpt_decoder>(*g_.model), o.limits) {
    m_.counter("cohort_serve_requests_total", "Completion requests answered, by HTTP status");
    m_.counter("cohort_serve_tokens_total", "Tokens generated");
    m_.gauge("cohort_serve_running", "Requests in the running batch");
    m_.gauge("cohort_serve_waiting", "Requests waiting for room in the batch or the KV cache");
    m_.gauge("cohort_serve_kv_blocks_used", "KV cache blocks held by running requests");
    m_.gauge("cohort_serve_kv_blocks_total", "KV cache blocks");
    m_.counter("cohort_serve_preemptions_total",
               "Requests moved out of the batch for lack of KV blocks (recomputed later)");
    m_.histogram("cohort_serve_time_to_first_token_seconds",
                 "From a request's arrival to its first token",
                 {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10});
    m_.histogram("cohort_serve_inter_token_seconds", "Between two tokens of one request",
                 {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1});
    name_ = "cohort-gpt-step-" + std::to_string(g_.step);
    routes();
  }

  // Binds, prints the address, serves until stop().
  int run() {
    const int bound =
        bind_serve_http(svr_, opts_.bind, opts_.request_timeout_s, opts_.max_connections);
    const std::string host = obs::metrics_server::parse_host_port(opts_.bind).first;
    std::printf("serve: %s (step %lld) at http://%s:%d/v1/completions\n", g_.path.c_str(),
                static_cast<long long>(g_.step), host.c_str(), bound);
    std::fflush(stdout);
    const std::string warn = obs::metrics_server::exposure_warning(host, false);
    if (!warn.empty()) std::fprintf(stderr, "serve: %s\n", warn.c_str());
    // Memory back to the system once a burst is over: glibc keeps what each connection's
    // thread freed in that thread's arena (10,000 hostile requests left the server 107-123
    // MiB above its idle size, docs/serving.md), so an idle server trims, once per burst.
    std::thread trimmer([this] {
      uint64_t trimmed_at = requests_;
      while (!loop_.returned()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        const train::serve_stats st = engine_.stats();
        if (requests_ != trimmed_at && st.running == 0 && st.waiting == 0) {
          trimmed_at = requests_;
          ::malloc_trim(0);
        }
      }
    });
    const bool ok = loop_.run(svr_);
    trimmer.join();
    return ok ? 0 : 1;
  }
  /// From the signal thread.
  void stop() { loop_.stop(svr_); }

 private:
  void count(int status) {
    m_.add("cohort_serve_requests_total", {{"status", std::to_string(status)}}, 1);
  }

  json chunk_json(const std::string& text, const char* finish, const std::shared_ptr<completion>& c,
                  bool usage, int prompt_tokens) const {
    json choice = {{"text", text},
                   {"index", 0},
                   {"logprobs", nullptr},
                   {"finish_reason", finish == nullptr ? json(nullptr) : json(finish)}};
    json out = {{"id", "cmpl-" + std::to_string(reinterpret_cast<uintptr_t>(c.get()))},
                {"object", "text_completion"},
                {"created", static_cast<int64_t>(std::time(nullptr))},
                {"model", name_},
                {"choices", json::array({choice})}};
    if (usage)
      out["usage"] = {{"prompt_tokens", prompt_tokens},
                      {"completion_tokens", c->tokens},
                      {"total_tokens", prompt_tokens + c->tokens}};
    return out;
  }

  void routes() {
    svr_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("{\"status\":\"ok\"}\n", "application/json");
    });
    svr_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      json model = {{"id", name_}, {"object", "model"}, {"owned_by", "cohort"},
                    {"checkpoint", g_.path}, {"context", g_.shape.context}};
      res.set_content(json{{"object", "list"}, {"data", json::array({model})}}.dump(-1, ' ', false, json::error_handler_t::replace) + "\n",
                      "application/json");
    });
    svr_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      const train::serve_stats s = engine_.stats();
      m_.set("cohort_serve_running", {}, s.running);
      m_.set("cohort_serve_waiting", {}, s.waiting);
      m_.set("cohort_serve_kv_blocks_used", {}, s.kv_blocks_used);
      m_.set("cohort_serve_kv_blocks_total", {}, s.kv_blocks_total);
      {
        // The engine counts; its totals reach the counters as what grew since the last read.
        std::lock_guard<std::mutex> lk(metrics_mu_);
        m_.add("cohort_serve_tokens_total", {}, static_cast<double>(s.tokens_out - seen_.tokens_out));
        m_.add("cohort_serve_preemptions_total", {},
               static_cast<double>(s.preemptions - seen_.preemptions));
        seen_ = s;
      }
      res.set_content(m_.exposition(), obs::exposition_content_type);
    });
    svr_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      obs::metrics_connections::request_read();  // the body is in: no longer evictable
      ++requests_;
      complete(req, res);
    });
    svr_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (res.status == 404)
        fail(res, 404, "no route " + req.method + " " + req.path +
                           " (POST /v1/completions, GET /v1/models, /health, /metrics)");
      else if (res.status == 413)
        fail(res, 413, "the request body is over 1 MiB");
      else if (res.body.empty())
        fail(res, res.status, "bad request");
    });
    svr_.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
          std::string what = "internal error";
          try {
            if (ep) std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            what = e.what();
          }
          fail(res, 500, what);
        });
  }

  void complete(const httplib::Request& http, httplib::Response& res) {
    parsed_request p = parse_completion(http.body, g_, opts_.max_tokens_limit);
    if (!p.error.empty()) {
      count(400);
      return fail(res, 400, p.error, p.param);
    }
    auto c = std::make_shared<completion>();
    const int prompt_tokens = static_cast<int>(p.req.prompt.size());
    p.req.on_token = [this, c](int32_t id) {
      const auto now = clock_type::now();
      std::lock_guard<std::mutex> lk(c->mu);
      if (c->tokens == 0)
        m_.observe("cohort_serve_time_to_first_token_seconds", {},
                   std::chrono::duration<double>(now - c->start).count());
      else
        m_.observe("cohort_serve_inter_token_seconds", {},
                   std::chrono::duration<double>(now - c->last).count());
      c->last = now;
      ++c->tokens;
      c->text.push_back(g_.vocab[static_cast<std::size_t>(id)]);
      c->fresh.push_back(id);
      c->cv.notify_all();
      return !c->gone;
    };
    p.req.on_done = [c](const std::string& why) {
      std::lock_guard<std::mutex> lk(c->mu);
      c->done = true;
      c->finish = why;
      c->cv.notify_all();
    };
    const std::string refused = engine_.submit(std::move(p.req));
    if (!refused.empty()) {
      const int status = refused.rfind("the server is busy", 0) == 0 ? 429 : 400;
      count(status);
      return fail(res, status, refused, status == 400 ? "prompt" : "");
    }
    if (!p.stream) {
      std::unique_lock<std::mutex> lk(c->mu);
      c->cv.wait(lk, [&] { return c->done; });
      if (c->finish.rfind("error", 0) == 0) {
        count(503);
        return fail(res, 503, c->finish);
      }
      count(200);
      res.set_content(chunk_json(c->text, c->finish.c_str(), c, true, prompt_tokens).dump(-1, ' ', false, json::error_handler_t::replace) + "\n",
                      "application/json");
      return;
    }
    count(200);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, c, prompt_tokens](size_t, httplib::DataSink& sink) {
          std::unique_lock<std::mutex> lk(c->mu);
          c->cv.wait(lk, [&] { return c->done || !c->fresh.empty(); });
          std::string out;
          while (!c->fresh.empty()) {
            const std::string piece(1, g_.vocab[static_cast<std::size_t>(c->fresh.front())]);
            c->fresh.pop_front();
            out += "data: " + chunk_json(piece, nullptr, c, false, 0).dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
          }
          const bool done = c->done;
          std::string finish = c->finish;
          lk.unlock();
          if (done) {
            out += "data: " +
                   chunk_json("", finish.c_str(), c, true, prompt_tokens).dump(-1, ' ', false, json::error_handler_t::replace) +
                   "\n\ndata: [DONE]\n\n";
          }
          if (!sink.write(out.data(), out.size())) {
            std::lock_guard<std::mutex> g(c->mu);
            c->gone = true;  // the engine drops it at its next token
            return false;
          }
          if (done) sink.done();
          return true;
        },
        [c](bool) {
          std::lock_guard<std::mutex> g(c->mu);
          if (!c->done) c->gone = true;
        });
  }

  serve_options opts_;
  train::loaded_gpt g_;
  train::serve_engine engine_;
  obs::metrics m_;
  std::string name_;
  std::mutex metrics_mu_;
  train::serve_stats seen_;  ///< the engine's totals already in the counters
  serve_listener loop_;
  std::atomic<uint64_t> requests_{0};  ///< completions received (the trimmer's clock)
  httplib::Server svr_;
};

// The model across processes (--tp / --pp): this process is the head (rank 0) and starts
// the shards, children of this binary (`serve ... --shard-dir DIR --shard-rank K`, killed
// with it), and watches them: a shard that exits while the server runs ends the server with
// exit code 1 (under --replicas the router answers from another replica and starts this one
// again). The shards' group rendezvous through files in a private folder (0700).
class shard_children {
 public:
  shard_children(const serve_options& o, const std::vector<std::string>& common) : layout_(o.layout) {
    dir_ = proc::private_run_dir("cohort-serve");
    for (int r = 1; r < layout_.world(); ++r) {
      std::vector<std::string> args = common;
      args.insert(args.end(), {"--shard-dir", dir_, "--shard-rank", std::to_string(r)});
      pids_.push_back(proc::spawn_self(args));
    }
    std::fprintf(stderr, "serve: %d shard process(es), tp %d x pp %d (group folder %s)\n",
                 layout_.world() - 1, layout_.tp, layout_.pp, dir_.c_str());
    watcher_ = std::thread([this] { watch(); });
  }
  ~shard_children() {
    stopping_ = true;
    for (pid_t p : pids_) proc::stop_child(p, std::chrono::milliseconds(5000));
    if (watcher_.joinable()) watcher_.join();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const std::string& dir() const { return dir_; }
  /// The head's decoder once every shard has joined the group (it waits for them).
  std::unique_ptr<nn::decoder> head(const nn::gpt_shape& shape, int timeout_ms) {
    return std::make_unique<train::shard_head>(
        train::shard_group(dir_, layout_, 0, timeout_ms), shape, layout_);
  }
  /// The head is done: its shards' exits from now on are the end they were told.
  void ending() { stopping_ = true; }

 private:
  void watch() {
    while (!stopping_) {
      for (std::size_t k = 0; k < pids_.size(); ++k) {
        int status = 0;
        const pid_t got = ::waitpid(pids_[k], &status, WNOHANG);
        if (got != pids_[k] || stopping_) continue;
        std::fprintf(stderr,
                     "serve: shard %zu (pid %d) exited: %s; the server stops (exit 1: under "
                     "--replicas another replica answers and this one is started again)\n",
                     k + 1, static_cast<int>(pids_[k]),
                     proc::describe_exit_code(proc::exit_code_of(status)).c_str());
        std::fflush(stderr);
        std::_Exit(exit_runtime);  // the kernel kills the other shards (their death signal)
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  train::shard_layout layout_;
  std::string dir_;
  std::vector<pid_t> pids_;
  std::atomic<bool> stopping_{false};
  std::thread watcher_;
};

// The arguments every child of this serve shares (a replica, a shard): the model and limits.
std::vector<std::string> child_args(const serve_options& o) {
  std::vector<std::string> a = {
      "serve", o.checkpoint, "--kv-blocks", std::to_string(o.limits.kv_blocks),
      "--block-tokens", std::to_string(o.limits.block_tokens), "--max-batch",
      std::to_string(o.limits.max_batch), "--max-waiting", std::to_string(o.limits.max_waiting),
      "--max-tokens-limit", std::to_string(o.max_tokens_limit), "--request-timeout-s",
      std::to_string(o.request_timeout_s), "--max-connections", std::to_string(o.max_connections),
      "--threads", std::to_string(o.threads), "--tp", std::to_string(o.layout.tp), "--pp",
      std::to_string(o.layout.pp)};
  if (o.n_head > 0) a.insert(a.end(), {"--n-head", std::to_string(o.n_head)});
  return a;
}

// How long a shard group's collectives may wait: a step is milliseconds, but an idle server's
// shards wait for the next step in one (the head's death ends them sooner).
constexpr int shard_timeout_ms = 24 * 3600 * 1000;

}  // namespace

void add_serve(CLI::App& app, int* rc) {
  auto opt = std::make_shared<serve_options>();
  CLI::App* cmd = app.add_subcommand(
      "serve",
      "Serve a GPT from a checkpoint over HTTP, OpenAI-style: POST /v1/completions (\"stream\": "
      "true for server-sent events), GET /v1/models, /health, /metrics. Concurrent requests "
      "share each decode step (continuous batching over a paged KV cache). Runs until Ctrl-C.");
  cmd->add_option("checkpoint", opt->checkpoint,
                  "A checkpoint folder (step_NNNNNNNN) or a run's checkpoint directory")
      ->type_name("CKPT")
      ->required();
  cmd->add_option("--bind", opt->bind, "HOST:PORT to listen on (PORT alone: 127.0.0.1; 0: any free port)")
      ->capture_default_str();
  cmd->add_option("--kv-blocks", opt->limits.kv_blocks, "Blocks in the KV cache")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--block-tokens", opt->limits.block_tokens, "Positions per KV block")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--max-batch", opt->limits.max_batch, "Requests decoded together at most")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--max-waiting", opt->limits.max_waiting,
                  "Requests queued at most; more get 429")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-tokens-limit", opt->max_tokens_limit, "Largest max_tokens a request may ask")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--request-timeout-s", opt->request_timeout_s,
                  "A connection is cut this long after it was accepted")
      ->capture_default_str()
      ->check(CLI::Range(1, 86400));
  cmd->add_option("--max-connections", opt->max_connections, "Connections held at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--n-head", opt->n_head,
                  "model.n_head of the run, for checkpoints that do not record it")
      ->type_name("N");
  cmd->add_option("--threads", opt->threads,
                  "OpenBLAS threads of the model's matrix products (the batch's products are "
                  "small: more threads spin more than they help)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--replicas", opt->replicas,
                  "Serve from this many replicas of the model behind --bind (child processes): "
                  "a request whose replica dies is answered by another, and the dead one is "
                  "started again (docs/serving.md, \"Replicas\")")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--tp", opt->layout.tp,
                  "Tensor-parallel shards of each pipeline stage: the model runs in tp x pp "
                  "processes of this host, this one scheduling (docs/serving.md, \"Across "
                  "processes\")")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--pp", opt->layout.pp, "Pipeline stages of the model (see --tp)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--shard-dir", opt->shard_dir, "")->group("");  // a shard process (internal)
  cmd->add_option("--shard-rank", opt->shard_rank, "")->group("");
  cmd->callback([opt, rc] {
    // Two malloc arenas, not one per connection thread (8 per core by default): a burst of
    // connections otherwise leaves memory behind in arenas the trimmer reaches less well.
    ::mallopt(M_ARENA_MAX, 2);
    cpu::set_num_threads(opt->threads);
    obs::metrics_server::parse_host_port(opt->bind);  // a bad --bind is a usage error first
    train::loaded_gpt g = train::load_gpt_checkpoint(opt->checkpoint, opt->n_head);
    train::check_shard_layout(g.shape, opt->layout);
    if (!opt->shard_dir.empty()) {  // one shard of a head's model: until the head says stop
      train::shard_options so;
      so.dir = opt->shard_dir;
      so.layout = opt->layout;
      so.rank = opt->shard_rank;
      so.kv_blocks = opt->limits.kv_blocks;
      so.block_tokens = opt->limits.block_tokens;
      so.timeout_ms = shard_timeout_ms;
      proc::block_termination_signals();  // the head ends it (stop, or its death signal)
      // The whole model goes once the shard holds its slice.
      train::run_shard(g, so, [&g] { g.model.reset(); });
      *rc = exit_ok;
      return;
    }
    if (opt->replicas > 1) {  // checked above: a bad checkpoint fails here, before any child
      router_options r;
      r.bind = opt->bind;
      r.replicas = opt->replicas;
      r.request_timeout_s = opt->request_timeout_s;
      r.max_connections = opt->max_connections;
      r.child_args = child_args(*opt);
      *rc = run_serve_router(r) == 0 ? exit_ok : exit_runtime;
      return;
    }
    std::fprintf(stderr,
                 "serve: GPT of %d layers, d_model %d, %d heads, context %d, %d tokens; KV cache "
                 "%d blocks of %d positions\n",
                 g.shape.n_layer, g.shape.d_model, g.shape.n_head, g.shape.context, g.shape.vocab,
                 opt->limits.kv_blocks, opt->limits.block_tokens);
    proc::block_termination_signals();
    std::unique_ptr<shard_children> shards;
    std::unique_ptr<nn::decoder> dec;
    if (opt->layout.world() > 1) {
      shards = std::make_unique<shard_children>(*opt, child_args(*opt));
      dec = shards->head(g.shape, shard_timeout_ms);
    }
    {
      server s(*opt, std::move(g), std::move(dec));
      proc::signal_watcher signals([&s](int) { s.stop(); });
      *rc = s.run() == 0 ? exit_ok : exit_runtime;
      if (shards) shards->ending();  // the server's end tells the shards to stop
    }
  });
}

}  // namespace cohort::cli
