// `cohort bench serve` end to end, for what it says rather than how fast: a checkpoint from a
// short `cohort train`, both throughput runs, 300 hostile requests counted by kind and status
// (the same seed, the same requests), the server alive and serving the same text after them,
// and no server left behind, whether the bench ends well or its server never starts.
#include <doctest/doctest.h>

#include <cerrno>
#include <csignal>
#include <string>

#include "tests/mp/dp_util.hpp"

using namespace cohort;
using namespace cohort::mp;

namespace {

// Whether process PID is gone (reaped by the bench, not merely orphaned).
bool gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

int count(const nlohmann::json& j, const std::string& key) {
  return j.contains(key) ? j[key].get<int>() : 0;
}

}  // namespace

TEST_CASE("bench serve: both throughputs, 300 hostile requests, the server intact after them") {
  temp_dir dir;
  const std::string ckpt = small_checkpoint(dir);
  const std::string args =
      "bench serve " + ckpt + " --streams 4 --max-tokens 8 --hostile 300 --settle-s 1 --json";
  int rc = -1;
  const std::string out = run_capture(args, &rc, false);
  REQUIRE_MESSAGE(rc == 0, out);
  const nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  REQUIRE_MESSAGE(j.is_object(), out);

  for (const char* mode : {"sequential", "concurrent"}) {
    CAPTURE(mode);
    CHECK(j[mode]["requests"] == 4);
    CHECK(j[mode]["tokens"] == 32);
    CHECK(j[mode]["tokens_per_s"].get<double>() > 0);
    CHECK(j[mode]["ttft_ms_server"].get<double>() > 0);
  }
  CHECK(j["ratio"].get<double>() > 0);

  const nlohmann::json& h = j["hostile"];
  CAPTURE(h.dump());
  int classes = 0, sent = 0;
  for (const auto& [name, n] : h["classes"].items()) classes += n.get<int>();
  for (const auto& [name, k] : h["kinds"].items()) sent += k["sent"].get<int>();
  CHECK(classes == 300);
  CHECK(sent == 300);
  // cohort serve answers 4xx to bad input and 503 only while stopping: any other 5xx is a
  // handler's exception. A connection refused or left unanswered for 30 s is a server that
  // stopped accepting or hung.
  CHECK(h["server_errors"] == 0);
  CHECK(count(h["classes"], "timeout") == 0);
  CHECK(count(h["classes"], "refused") == 0);
  // What can only be refused is refused (invalid JSON, nesting without a prompt, bytes that
  // are not UTF-8 or not in the vocabulary, a body over 1 MiB); what is valid is answered (a
  // prompt longer than the context is cut from the left; a stream is 200 before it is left).
  const std::pair<const char*, const char*> expected[] = {
      {"truncated_json", "4xx"}, {"deep_nesting", "4xx"}, {"invalid_utf8", "4xx"},
      {"oversized_body", "4xx"}, {"long_prompt", "2xx"},  {"stream_disconnect", "2xx"}};
  for (const auto& [kind, cls] : expected) {
    CAPTURE(kind);
    REQUIRE(h["kinds"].contains(kind));
    CHECK(count(h["kinds"][kind], cls) == h["kinds"][kind]["sent"].get<int>());
  }
  CHECK(h["server_alive"] == true);
  CHECK(h["health_after"] == 200);
  CHECK(h["text_unchanged"] == true);
  // The streams left mid-way gave their KV blocks back.
  CHECK(h["after_settle"]["kv_blocks_used"] == 0);
  CHECK(h["after_settle"]["running"] == 0);
  CHECK(h["after_settle"]["waiting"] == 0);
  CHECK(h["rss_kib"]["idle"].get<int64_t>() > 0);
  CHECK(h["rss_kib"]["settled"].get<int64_t>() > 0);
  CHECK(j["server_exit"] == 0);  // SIGTERM, not SIGKILL
  CHECK(j["server_killed"] == false);
  CHECK(gone(j["server_pid"].get<pid_t>()));

  // The same seed sends the same requests: the same number of each kind.
  int rc2 = -1;
  const nlohmann::json again = nlohmann::json::parse(
      run_capture(
          "bench serve " + ckpt + " --streams 1 --max-tokens 1 --hostile 300 --settle-s 0 --json",
          &rc2),
      nullptr, false);
  REQUIRE(rc2 == 0);
  REQUIRE(again.is_object());
  for (const auto& [name, k] : h["kinds"].items())
    CHECK_MESSAGE(again["hostile"]["kinds"][name]["sent"] == k["sent"], name);
}

TEST_CASE("bench serve: a server that cannot start is an error with its output, no child left") {
  temp_dir dir;
  int rc = -1;
  const std::string out =
      run_capture("bench serve " + dir.path() + " --streams 1 --max-tokens 1", &rc, true);
  CHECK(rc == 1);
  CHECK_MESSAGE(out.find("before it listened") != std::string::npos, out);
  CHECK_MESSAGE(out.find("checkpoint") != std::string::npos, out);  // serve's own message
  int bad = -1;
  // A CPU that is not online: refused before any child starts.
  run_capture("bench serve " + dir.path() + " --bind-threads 1000", &bad);
  CHECK(bad == 2);
}
