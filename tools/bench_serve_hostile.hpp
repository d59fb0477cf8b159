// The hostile half of `cohort bench serve`: N requests built to break `cohort serve`, each a
// pure function of (seed, index), sent from T threads on raw sockets, and what came back
// counted by kind and status. Owns the report's type; what the server looks like after the
// attack (alive, /health, its text, RSS) is cmd_bench_serve.cpp's to find and print.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace cohort::cli {

/// One hostile run: send_hostile fills the counts; the bench fills the rest.
struct hostile_report {
  int requests = 0, threads = 0;
  uint64_t seed = 0;
  double seconds = 0;
  std::map<std::string, int> classes;                          // 2xx, 4xx, 5xx, no_answer, ...
  std::map<int, int> statuses;                                 // every HTTP status seen
  std::map<std::string, std::map<std::string, int>> kinds;     // kind -> class -> count
  std::map<std::string, std::vector<double>> seconds_by_kind;  // each request's, sent to done
  int server_errors = 0;  // 5xx other than 503 (an exception in a handler: a bug)
  int unavailable = 0;    // 503: the engine stopped (documented; only while stopping)
  int busy = 0;           // 429: the queue is full (documented)
  bool alive = false;
  std::string death;  // when it died: its exit and the end of its stderr
  int health = 0;
  bool text_unchanged = false;
  long rss_idle = 0, rss_before = 0, rss_after = 0, rss_settled = 0;
  double settle_s = 0;
  double kv_blocks_used = -1, running = -1, waiting = -1;
  bool passed() const { return alive && health == 200 && text_unchanged; }
};

/// Sends REQUESTS hostile requests built from SEED to 127.0.0.1:PORT, THREAD_COUNT at a time
/// (each on a connection of its own), and fills H's requests, threads, seed, seconds and
/// counts (classes, statuses, kinds, seconds_by_kind, server_errors, unavailable, busy).
void send_hostile(int port, int requests, int thread_count, uint64_t seed, hostile_report& h);

/// The attack kinds' names in the order of their table: the rows of the printed report.
std::vector<std::string> attack_kind_names();

}  // namespace cohort::cli
