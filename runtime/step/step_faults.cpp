#include "runtime/step/step_faults.hpp"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace cohort::step {

std::chrono::steady_clock::duration slow_extra(std::chrono::steady_clock::duration spent,
                                               double factor) {
  if (!(factor > 1)) return std::chrono::steady_clock::duration::zero();
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(spent * (factor - 1));
}

fault_seat::fault_seat(std::unique_ptr<train::seat> inner, fault_hooks hooks, slow_clock clock)
    : forwarding_seat(std::move(inner)), hooks_(std::move(hooks)), clock_(std::move(clock)) {
  if (const char* v = std::getenv("COHORT_TEST_ABORT_COMM")) {
    long long step = -1;
    int rank = -1;
    if (std::sscanf(v, "%lld:%d", &step, &rank) == 2) {
      abort_step_ = step;
      abort_rank_ = rank;
      spdlog::warn("dp group: COHORT_TEST_ABORT_COMM: rank {} aborts its communicator in step {}",
                   rank, step);
    }
  }
}

void fault_seat::begin(uint64_t generation, int64_t step, int rank,
                       std::function<void()> abort_comm) {
  now_.reset();
  if (armed_ && armed_->generation == generation && armed_->step == step) now_.swap(armed_);
  abort_now_ = !abort_done_ && abort_step_ == step && abort_rank_ == rank;
  abort_comm_ = std::move(abort_comm);
}

double fault_seat::compute_gradients(int64_t step, const std::vector<int>& micro,
                                     const nn::grads_ready_fn& ready) {
  std::optional<net::fault_order> f;
  f.swap(now_);
  double factor = 1;
  if (f && f->action == net::fault_action::slow) {
    factor = f->factor;
    f.reset();
  }
  struct restore {  // a throwing compute leaves no stretch behind for the next call
    double& v;
    ~restore() { v = 1; }
  } r{slow_factor_};
  slow_factor_ = factor;
  passes_seen_ = 0;
  const auto now = [this] { return clock_.now ? clock_.now() : std::chrono::steady_clock::now(); };
  const auto t0 = factor > 1 ? now() : std::chrono::steady_clock::time_point{};
  double loss_rows = 0;
  if (!f && !abort_now_) {
    loss_rows = inner().compute_gradients(step, micro, ready);
  } else {
    // Once, right after the first gradients went to the data plane.
    loss_rows = inner().compute_gradients(step, micro, [&](std::size_t off, std::size_t n) {
      ready(off, n);
      if (abort_now_) {
        abort_now_ = false;
        abort_done_ = true;
        if (abort_comm_) abort_comm_();
      }
      if (f) {
        const net::fault_order x = *f;
        f.reset();
        carry_out(x);
      }
    });
  }
  // slow on a seat that reported no pass (the whole model has no per-pass callback): the
  // whole call at once.
  if (factor > 1 && passes_seen_ == 0) stretch(now() - t0);
  return loss_rows;
}

void fault_seat::set_links(train::stage_links l) {
  l.after_compute = [this,
                     next = std::move(l.after_compute)](std::chrono::steady_clock::duration spent) {
    if (next) next(spent);
    ++passes_seen_;
    stretch(spent);
  };
  forwarding_seat::set_links(std::move(l));
}

void fault_seat::stretch(std::chrono::steady_clock::duration spent) {
  const auto extra = slow_extra(spent, slow_factor_);
  if (extra <= std::chrono::steady_clock::duration::zero()) return;
  if (clock_.pause)
    clock_.pause(extra);
  else
    std::this_thread::sleep_for(extra);
}

void fault_seat::carry_out(const net::fault_order& f) {
  if (f.action == net::fault_action::kill) {
    spdlog::warn("dp group: injected fault: killing this worker in step {}", f.step);
    std::fflush(nullptr);
    ::kill(::getpid(), SIGKILL);
  } else if (f.action == net::fault_action::hang) {
    spdlog::warn("dp group: injected fault: hanging {} ms in step {}", f.duration_ms, f.step);
    if (hooks_.mute_heartbeats) hooks_.mute_heartbeats(f.duration_ms);
    std::this_thread::sleep_for(std::chrono::milliseconds(f.duration_ms));
  } else if (f.action == net::fault_action::partition) {
    spdlog::warn("dp group: injected fault: cut off from the coordinator for {} ms in step {}",
                 f.duration_ms, f.step);
    if (hooks_.cut_off) hooks_.cut_off(f.duration_ms);
  }
}

}  // namespace cohort::step
