// run_with_deadline: the state the worker thread touches lives in a shared_ptr, so a
// thread left behind after an expiry writes into memory that outlives the caller.
#include "runtime/comm/deadline_call.hpp"

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

namespace cohort::comm {

namespace {

struct call_state {
  std::mutex mutex;
  std::condition_variable finished_cv;
  bool finished = false;
  bool ok = false;
  std::string error;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

const char* to_string(deadline_outcome o) {
  switch (o) {
    case deadline_outcome::done:
      return "done";
    case deadline_outcome::failed:
      return "failed";
    case deadline_outcome::expired:
      return "expired";
  }
  return "?";
}

deadline_result run_with_deadline(const std::string& what, std::function<bool()> fn,
                                  std::chrono::milliseconds deadline) {
  auto state = std::make_shared<call_state>();
  const auto t0 = std::chrono::steady_clock::now();
  std::thread worker([state, fn = std::move(fn)] {
    bool ok = false;
    std::string error;
    try {
      ok = fn();
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "unknown exception";
    }
    std::lock_guard<std::mutex> lock(state->mutex);
    state->finished = true;
    state->ok = ok;
    state->error = error;
    state->finished_cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(state->mutex);
  const bool finished =
      state->finished_cv.wait_until(lock, t0 + deadline, [&] { return state->finished; });
  deadline_result r;
  r.seconds = seconds_since(t0);
  const std::string ms = std::to_string(deadline.count()) + " ms";
  if (!finished) {
    lock.unlock();
    worker.detach();
    r.outcome = deadline_outcome::expired;
    r.text = what + " did not return within " + ms +
             ": this worker leaves the group as a dead member and exits (a thread stuck in "
             "NCCL holds the device); the group goes on without it";
    return r;
  }
  lock.unlock();
  worker.join();
  r.outcome = state->ok ? deadline_outcome::done : deadline_outcome::failed;
  r.text =
      what + (state->ok ? " done"
                        : " failed" + (state->error.empty() ? std::string() : ": " + state->error));
  return r;
}

}  // namespace cohort::comm
