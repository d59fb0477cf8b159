// Helpers shared by the tests that run coordinator_node and worker_node for real in one
// process: polling with a deadline, and the options of a small two-worker world.
#pragma once
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "actors/coordinator.hpp"
#include "actors/worker.hpp"
#include "tests/eventually.hpp"

namespace cohort::actors::testing {

using cohort::test::eventually;

/// A coordinator for two data-parallel workers, fast heartbeats, a generous timeout.
inline coordinator_options two_workers() {
  coordinator_options o;
  o.membership.heartbeat_ms = 50;
  o.membership.timeout_ms = 2000;
  o.membership.dp = 2;
  o.tick_ms = 25;
  return o;
}

/// A worker called NAME (this process's pid; gives up on a silent coordinator after 10 s).
inline worker_options named(const std::string& name) {
  worker_options o;
  o.name = name;
  o.pid = ::getpid();
  o.coordinator_timeout_ms = 10000;
  return o;
}

}  // namespace cohort::actors::testing
