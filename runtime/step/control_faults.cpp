#include "runtime/step/control_faults.hpp"

#include <utility>

#include "runtime/core/rng.hpp"
#include "runtime/step/training_job.hpp"

namespace cohort::step {

bool drop_control_may_drop(net::msg_type t) {
  switch (t) {
    case net::msg_type::roster_update:
    case net::msg_type::heartbeat:
    case net::msg_type::heartbeat_ack:
    case net::msg_type::job_spec:
    case net::msg_type::worker_ready:
    case net::msg_type::step_open:
    case net::msg_type::step_vote:
    case net::msg_type::step_result:
    case net::msg_type::train_report:
    case net::msg_type::fault_order:
      return true;
    default:
      return false;
  }
}

bool drop_control_draw(const faults::fault_spec& d, uint64_t draw) {
  const uint64_t h = hash_coords(d.seed, 0x64726f70u, draw);
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0) < d.p;
}

namespace {

// Reads the job's `drop control` on every frame: `ctl inject` may add one mid-run.
class job_filter final : public frame_filter {
 public:
  explicit job_filter(std::shared_ptr<training_job> job) : job_(std::move(job)) {}

  bool drop(net::msg_type t) override {
    const faults::fault_spec* d = job_->drop_control();
    if (d == nullptr || !drop_control_may_drop(t)) return false;
    if (!drop_control_draw(*d, draws_++)) return false;
    job_->note_dropped_frame();
    return true;
  }
  bool decides(net::msg_type t) const override {
    return job_->drop_control() != nullptr && drop_control_may_drop(t);
  }
  std::vector<net::counter> counters() const override {
    if (job_->drop_control() == nullptr) return {};
    return {net::counter{"drop_control", job_->report().dropped_frames()}};
  }

 private:
  std::shared_ptr<training_job> job_;
  uint64_t draws_ = 0;  ///< frames `drop control` has decided on (its counter)
};

}  // namespace

int64_t link_cut::now_ns() const {
  const auto t = now_ ? now_() : std::chrono::steady_clock::now();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

void link_cut::cut_for(std::chrono::milliseconds ms) {
  until_ns_ = now_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(ms).count();
}

bool link_cut::down() const { return now_ns() < until_ns_.load(); }

std::shared_ptr<frame_filter> job_frame_filter(std::shared_ptr<training_job> job) {
  if (!job) return nullptr;
  return std::make_shared<job_filter>(std::move(job));
}

void held_link::cut_for(std::chrono::milliseconds ms) {
  mute_.cut_for(ms);
  cut_.cut_for(ms);
}

bool held_link::hold_out(const net::message& m) {
  if (!cut_.down()) return false;
  const std::lock_guard<std::mutex> lock(mu_);
  out_.push_back(m);
  return true;
}

bool held_link::hold_in(const std::string& peer, net::message& m) {
  if (!cut_.down()) return false;
  const std::lock_guard<std::mutex> lock(mu_);
  in_.emplace_back(peer, std::move(m));
  return true;
}

std::pair<std::vector<net::message>, std::vector<held_link::held_in>> held_link::release() {
  std::pair<std::vector<net::message>, std::vector<held_link::held_in>> out;
  if (cut_.down()) return out;
  const std::lock_guard<std::mutex> lock(mu_);
  out.first.swap(out_);
  out.second.swap(in_);
  return out;
}

}  // namespace cohort::step
