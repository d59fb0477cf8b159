// `cohort bench serve CKPT [--streams S] [--max-tokens M] [--prompt TEXT] [--stream]
// [--hostile N [--hostile-threads T] [--seed X] [--settle-s D]] [--bind-threads SRV[:CLI]]
// [--json]`: `cohort serve` as its clients see it (docs/serving.md, "cohort bench serve").
// Starts `cohort serve CKPT --bind 127.0.0.1:0` as a child, sends S greedy requests one at a
// time, then the same S at once (a thread and a connection each), and reports tokens/s of
// both and their ratio, with the mean time to first token (the server's histogram; the
// client's too with --stream). With --hostile N it then sends N requests built to break the
// server (garbled, truncated and deeply nested JSON, wrong types, huge numbers, invalid
// UTF-8, bodies over the limit, unknown routes, broken HTTP, slow clients, streams left
// mid-way), reproducible from --seed, and checks the server afterwards: alive, GET /health
// 200, the same greedy text as before, its RSS against idle. Exit 1 when it died, /health
// failed or the text changed. Owns the client side only; the server is cmd_serve.cpp's. The
// hostile requests are tools/bench_serve_hostile.cpp's; the server child and the HTTP calls,
// tools/bench_serve_client.cpp's; this file measures, checks and prints.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/core/process.hpp"
#include "tools/bench_serve_client.hpp"
#include "tools/bench_serve_hostile.hpp"
#include "tools/bench_util.hpp"
#include "tools/commands.hpp"

namespace cohort::cli {
namespace {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

struct bench_serve_options {
  std::string checkpoint;
  int streams = 16;
  int max_tokens = 64;
  std::string prompt;  // empty: kjv_prompts in turn
  bool stream = false;
  int hostile = 0;
  int hostile_threads = 16;
  uint64_t seed = 1;
  double settle_s = 2;
  std::string bind_threads;  // SERVER_CPUS[:CLIENT_CPUS]
  bool json = false;
  int tp = 1, pp = 1;  // the server's --tp / --pp
};

struct phase_result {
  int requests = 0;
  int64_t tokens = 0;
  double seconds = 0;
  double ttft_ms_server = 0;   // the server's histogram over the phase: arrival to first token
  double ttft_ms_client = -1;  // --stream: the client's, request sent to first event
  std::vector<std::string> texts;
  double tokens_per_s() const { return seconds > 0 ? static_cast<double>(tokens) / seconds : 0; }
};

// BODIES one at a time, or all at once (a thread and a connection each, released together).
phase_result run_phase(int port, const std::vector<std::string>& bodies, bool concurrent,
                       bool stream) {
  std::vector<reply> replies(bodies.size());
  const auto [sum0, count0] = ttft_totals(port);
  clock_type::time_point t0, t1;
  if (!concurrent) {
    t0 = clock_type::now();
    for (std::size_t i = 0; i < bodies.size(); ++i) replies[i] = complete(port, bodies[i], stream);
    t1 = clock_type::now();
  } else {
    std::mutex mu;
    std::condition_variable cv;
    bool go = false;
    int ready = 0;
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < bodies.size(); ++i)
      threads.emplace_back([&, i] {
        {
          std::unique_lock<std::mutex> lk(mu);
          ++ready;
          cv.notify_all();
          cv.wait(lk, [&] { return go; });
        }
        replies[i] = complete(port, bodies[i], stream);
      });
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return ready == static_cast<int>(bodies.size()); });
      go = true;
      t0 = clock_type::now();
    }
    cv.notify_all();
    for (auto& t : threads) t.join();
    t1 = clock_type::now();
  }
  phase_result p;
  p.requests = static_cast<int>(bodies.size());
  p.seconds = std::chrono::duration<double>(t1 - t0).count();
  double ttft = 0;
  for (const reply& r : replies) {
    if (r.status != 200)
      throw error("bench serve: a request of the " +
                  std::string(concurrent ? "concurrent" : "sequential") + " run got " +
                  (r.status == 0 ? std::string("no answer") : "HTTP " + std::to_string(r.status)) +
                  ": " + r.error);
    p.tokens += r.tokens;
    p.texts.push_back(r.text);
    ttft += r.ttft_s;
  }
  if (stream) p.ttft_ms_client = 1e3 * ttft / static_cast<double>(replies.size());
  const auto [sum1, count1] = ttft_totals(port);
  if (count1 > count0) p.ttft_ms_server = 1e3 * (sum1 - sum0) / (count1 - count0);
  return p;
}

std::string completion_body(const std::string& prompt, int max_tokens, uint64_t seed, bool stream) {
  json b = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"seed", seed}};
  if (stream) b["stream"] = true;
  return b.dump();
}

// ---------------------------------------------------------------------------------------
// Hostile requests (tools/bench_serve_hostile.cpp), then the server checked after them.

void run_hostile(const bench_serve_options& o, served_child& server,
                 const std::string& reference_body, const std::string& reference_text,
                 hostile_report& h) {
  const int port = server.port();
  h.settle_s = o.settle_s;
  send_hostile(port, o.hostile, o.hostile_threads, o.seed, h);
  h.rss_after = server.rss_kib();
  h.alive = server.alive();
  if (!h.alive) return;
  get_text(port, "/health", &h.health);
  const reply again = complete(port, reference_body, false);
  h.text_unchanged = again.status == 200 && again.text == reference_text;
  std::this_thread::sleep_for(std::chrono::duration<double>(o.settle_s));
  h.rss_settled = server.rss_kib();
  const std::string m = get_text(port, "/metrics");
  h.kv_blocks_used = sample(m, "cohort_serve_kv_blocks_used");
  h.running = sample(m, "cohort_serve_running");
  h.waiting = sample(m, "cohort_serve_waiting");
  h.alive = server.alive();
}

// ---------------------------------------------------------------------------------------
// The report.

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "?";
}

json phase_json(const phase_result& p) {
  json j = {{"requests", p.requests},
            {"tokens", p.tokens},
            {"seconds", p.seconds},
            {"tokens_per_s", p.tokens_per_s()},
            {"ttft_ms_server", p.ttft_ms_server}};
  if (p.ttft_ms_client >= 0) j["ttft_ms_client"] = p.ttft_ms_client;
  return j;
}

// Mean and largest of a kind's durations, in milliseconds.
std::pair<double, double> mean_max_ms(const hostile_report& h, const std::string& kind) {
  const auto it = h.seconds_by_kind.find(kind);
  if (it == h.seconds_by_kind.end() || it->second.empty()) return {0, 0};
  double sum = 0, top = 0;
  for (double s : it->second) {
    sum += s;
    top = std::max(top, s);
  }
  return {1e3 * sum / static_cast<double>(it->second.size()), 1e3 * top};
}

json hostile_json(const hostile_report& h) {
  json statuses = json::object();
  for (const auto& [s, n] : h.statuses) statuses[std::to_string(s)] = n;
  json kinds = json::object();
  for (const auto& [name, counts] : h.kinds) {
    kinds[name] = counts;
    const auto [mean, top] = mean_max_ms(h, name);
    kinds[name]["mean_ms"] = mean;
    kinds[name]["max_ms"] = top;
  }
  return {{"requests", h.requests},
          {"seed", h.seed},
          {"threads", h.threads},
          {"seconds", h.seconds},
          {"classes", h.classes},
          {"statuses", statuses},
          {"kinds", kinds},
          {"server_errors", h.server_errors},
          {"unavailable_503", h.unavailable},
          {"busy_429", h.busy},
          {"server_alive", h.alive},
          {"server_death", h.death},
          {"health_after", h.health},
          {"text_unchanged", h.text_unchanged},
          {"rss_kib",
           {{"idle", h.rss_idle},
            {"before", h.rss_before},
            {"after", h.rss_after},
            {"settled", h.rss_settled}}},
          {"settle_s", h.settle_s},
          {"after_settle",
           {{"kv_blocks_used", h.kv_blocks_used}, {"running", h.running}, {"waiting", h.waiting}}}};
}

void print_hostile(const hostile_report& h) {
  static const std::vector<std::string> cols = {"2xx",     "4xx",     "5xx",  "no_answer",
                                                "timeout", "refused", "other"};
  std::printf("\nhostile: %d requests (seed %llu, %d threads) in %.1f s\n", h.requests,
              static_cast<unsigned long long>(h.seed), h.threads, h.seconds);
  std::printf("%-18s %7s", "kind", "sent");
  for (const auto& c : cols) std::printf(" %9s", c.c_str());
  std::printf(" %8s %8s\n", "mean_ms", "max_ms");
  auto row = [&](const std::string& name, const std::map<std::string, int>& m) {
    auto at = [&](const std::string& k) {
      const auto it = m.find(k);
      return it == m.end() ? 0 : it->second;
    };
    std::printf("%-18s %7d", name.c_str(), at("sent"));
    for (const auto& c : cols) std::printf(" %9d", at(c));
    const auto [mean, top] = mean_max_ms(h, name);
    if (name != "total") std::printf(" %8.1f %8.1f", mean, top);
    std::printf("\n");
  };
  for (const std::string& name : attack_kind_names()) {
    const auto it = h.kinds.find(name);
    if (it != h.kinds.end()) row(name, it->second);
  }
  std::map<std::string, int> total = h.classes;
  total["sent"] = h.requests;
  row("total", total);
  std::printf("statuses:");
  const char* sep = " ";
  for (const auto& [s, n] : h.statuses) {
    std::printf("%s%d: %d", sep, s, n);
    sep = ", ";
  }
  std::printf("\n5xx other than 503: %d; 503 (engine stopped): %d; 429 (queue full): %d\n",
              h.server_errors, h.unavailable, h.busy);
  if (!h.alive) {
    std::printf("after: the server DIED (%s)\n", h.death.c_str());
    return;
  }
  std::printf(
      "after: server alive, GET /health %d, greedy text %s; after %.1f s: KV blocks "
      "used %.0f, running %.0f, waiting %.0f\n",
      h.health, h.text_unchanged ? "unchanged" : "CHANGED", h.settle_s, h.kv_blocks_used, h.running,
      h.waiting);
  auto mib = [](long kib) { return static_cast<double>(kib) / 1024.0; };
  std::printf(
      "RSS: idle %.1f MiB, before the attack %.1f MiB, right after %.1f MiB, %.1f s "
      "later %.1f MiB (%+.1f MiB against before)\n",
      mib(h.rss_idle), mib(h.rss_before), mib(h.rss_after), h.settle_s, mib(h.rss_settled),
      mib(h.rss_settled - h.rss_before));
}

int run_bench(const bench_serve_options& o) {
  const cpu_binding cpus = parse_binding(o.bind_threads);
  const std::vector<std::string> prompts =
      o.prompt.empty() ? kjv_prompts : std::vector<std::string>{o.prompt};
  std::vector<std::string> bodies;
  for (int i = 0; i < o.streams; ++i)
    bodies.push_back(completion_body(prompts[static_cast<std::size_t>(i) % prompts.size()],
                                     o.max_tokens, static_cast<uint64_t>(i), o.stream));
  const scratch_dir scratch("bench-serve");
  served_child server(o.checkpoint, scratch.path(), cpus,
                      {"--tp", std::to_string(o.tp), "--pp", std::to_string(o.pp)});
  if (cpus.client) bind_this_thread(*cpus.client, cpus.client_text);
  if (!o.json)
    std::fprintf(stderr, "bench serve: cohort serve (pid %d) on port %d\n",
                 static_cast<int>(server.pid()), server.port());

  const std::string warm = completion_body(prompts[0], 4, 0, false);
  const reply w = complete(server.port(), warm, false);
  if (w.status != 200)
    throw error("bench serve: the warm-up request got " +
                (w.status == 0 ? std::string("no answer") : "HTTP " + std::to_string(w.status)) +
                ": " + w.error + "; the server's output:" + server.tail());
  hostile_report h;
  h.rss_idle = server.rss_kib();

  const phase_result seq = run_phase(server.port(), bodies, false, o.stream);
  const phase_result con = run_phase(server.port(), bodies, true, o.stream);
  int equal = 0;
  for (std::size_t i = 0; i < bodies.size(); ++i) equal += seq.texts[i] == con.texts[i];
  const double ratio = seq.tokens_per_s() > 0 ? con.tokens_per_s() / seq.tokens_per_s() : 0;

  if (o.hostile > 0) {
    const std::string ref_body = completion_body(prompts[0], o.max_tokens, 0, false);
    h.rss_before = server.rss_kib();
    const reply ref = complete(server.port(), ref_body, false);
    if (ref.status != 200)
      throw error("bench serve: the reference request got HTTP " + std::to_string(ref.status));
    if (!o.json)
      std::fprintf(stderr, "bench serve: %d hostile requests from %d threads...\n", o.hostile,
                   o.hostile_threads);
    run_hostile(o, server, ref_body, ref.text, h);
  }
  const int server_exit = server.stop();
  if (o.hostile > 0 && !h.alive)
    h.death = proc::describe_exit_code(server_exit) + "; the end of its stderr:" + server.tail();

  if (o.json) {
    json j = {{"checkpoint", o.checkpoint},
              {"step", server.step()},
              {"cpu", cpu_name()},
              {"cpus_online", static_cast<int>(std::thread::hardware_concurrency())},
              {"server_cpus", cpus.server_text},
              {"client_cpus", cpus.client_text},
              {"streams", o.streams},
              {"max_tokens", o.max_tokens},
              {"stream", o.stream},
              {"prompts", prompts},
              {"sequential", phase_json(seq)},
              {"concurrent", phase_json(con)},
              {"ratio", ratio},
              {"texts_equal", equal},
              {"server_pid", static_cast<int>(server.pid())},
              {"server_exit", server_exit},
              {"server_killed", server.killed()}};
    if (o.hostile > 0) j["hostile"] = hostile_json(h);
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("bench serve: %s (step %lld), %d requests of %d tokens, greedy%s\n",
                o.checkpoint.c_str(), static_cast<long long>(server.step()), o.streams,
                o.max_tokens, o.stream ? ", streamed" : "");
    std::printf("cpu: %s, %u online; server on CPUs %s, client on CPUs %s\n", cpu_name().c_str(),
                std::thread::hardware_concurrency(),
                cpus.server_text.empty() ? "(any)" : cpus.server_text.c_str(),
                cpus.client_text.empty() ? "(any)" : cpus.client_text.c_str());
    std::printf("%-16s %9s %9s %9s %11s %15s%s\n", "mode", "requests", "tokens", "seconds",
                "tokens/s", "ttft_ms_server", o.stream ? " ttft_ms_client" : "");
    const std::string at_once = std::to_string(o.streams) + " at once";
    auto row = [&](const std::string& name, const phase_result& p) {
      std::printf("%-16s %9d %9lld %9.3f %11.1f %15.2f", name.c_str(), p.requests,
                  static_cast<long long>(p.tokens), p.seconds, p.tokens_per_s(), p.ttft_ms_server);
      if (o.stream) std::printf(" %14.2f", p.ttft_ms_client);
      std::printf("\n");
    };
    row("one at a time", seq);
    row(at_once, con);
    std::printf("ratio (%s / one at a time): %.2fx; texts equal between the modes: %d of %d\n",
                at_once.c_str(), ratio, equal, o.streams);
    if (o.hostile > 0) print_hostile(h);
    std::printf("server: SIGTERM -> %s%s\n", proc::describe_exit_code(server_exit).c_str(),
                server.killed() ? " (it did not stop within 15 s: SIGKILLed)" : "");
  }
  return o.hostile > 0 && !h.passed() ? exit_runtime : exit_ok;
}

}  // namespace

void add_bench_serve(CLI::App& bench, int* rc) {
  auto o = std::make_shared<bench_serve_options>();
  CLI::App* cmd = bench.add_subcommand(
      "serve",
      "`cohort serve CKPT` on a free port as a child: S greedy requests one at a time, then "
      "the same S at once (tokens/s, ratio, time to first token); with --hostile N, N hostile "
      "requests and the server checked afterwards (exit 1 if it died, GET /health failed or "
      "its greedy text changed)");
  cmd->add_option("checkpoint", o->checkpoint,
                  "A checkpoint folder (step_NNNNNNNN) or a run's checkpoint directory")
      ->type_name("CKPT")
      ->required();
  cmd->add_option("--streams", o->streams, "requests in each mode (and at once)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--max-tokens", o->max_tokens, "tokens each request asks")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--prompt", o->prompt,
                  "every request's prompt (default: eight KJV openings in turn)");
  cmd->add_flag("--stream", o->stream,
                "stream the requests (server-sent events) and time the first event");
  cmd->add_option("--hostile", o->hostile, "hostile requests after the throughput runs")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  cmd->add_option("--hostile-threads", o->hostile_threads, "client threads sending them")
      ->check(CLI::Range(1, 128))
      ->capture_default_str();
  cmd->add_option("--seed", o->seed,
                  "the hostile requests' seed (the same seed, the same "
                  "requests)")
      ->capture_default_str();
  cmd->add_option("--settle-s", o->settle_s,
                  "seconds after the attack before the RSS and the KV cache are read again")
      ->check(CLI::Range(0.0, 600.0))
      ->capture_default_str();
  cmd->add_option("--tp", o->tp, "the server's --tp: its model in tp x pp shard processes")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--pp", o->pp, "the server's --pp")->capture_default_str()->check(CLI::Range(1, 64));
  cmd->add_option("--bind-threads", o->bind_threads,
                  "SERVER[:CLIENT] CPU lists (e.g. 1:0 or 0-1:): the server's threads run on "
                  "the first, this client's on the second (default: anywhere)");
  cmd->add_flag("--json", o->json, "one JSON object instead of the table");
  cmd->callback([o, rc] { *rc = run_bench(*o); });
}

}  // namespace cohort::cli
