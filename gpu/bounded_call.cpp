#include "gpu/bounded_call.hpp"

#include <chrono>
#include <future>
#include <memory>
#include <thread>

namespace cohort::gpu {

bool call_within(std::function<void()> fn, int deadline_ms) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> returned = done->get_future();
  std::thread worker([fn = std::move(fn), done] {
    try {
      fn();
    } catch (...) {
    }
    done->set_value();
  });
  if (returned.wait_for(std::chrono::milliseconds(deadline_ms > 0 ? deadline_ms : 0)) ==
      std::future_status::ready) {
    worker.join();
    return true;
  }
  worker.detach();
  return false;
}

}  // namespace cohort::gpu
