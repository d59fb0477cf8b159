#include "runtime/comm/build_abort.hpp"

#include "runtime/comm/comm_error.hpp"

namespace cohort::comm {

void build_abort::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_.load()) return;
  why_ = why;
  aborted_ = true;
  for (auto& [id, action] : armed_) action();
  armed_.clear();
}

std::string build_abort::why() const {
  std::lock_guard<std::mutex> lock(mu_);
  return why_;
}

std::size_t build_abort::arm(std::function<void()> action) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::size_t id = next_id_++;
  if (aborted_.load())
    action();
  else
    armed_.emplace(id, std::move(action));
  return id;
}

void build_abort::disarm(std::size_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  armed_.erase(id);
}

void build_abort::check(const std::string& op) const {
  if (!aborted_.load()) return;
  throw comm_error(comm_failure::aborted, op, "the build was aborted: " + why());
}

}  // namespace cohort::comm
