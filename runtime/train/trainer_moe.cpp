// The trainer's side of expert parallelism (parallel.ep; docs/moe.md): the exchange it lends
// the model's MoE layers for a step (the EP group's all-to-all, timed, counted and traced;
// in bitwise mode another rank's share of an expert's gradients settled into the fixed-point
// sum on its own, as that rank would have converted it), and the MoE counters a step reports.
#include <algorithm>
#include <chrono>
#include <string>

#include "runtime/comm/communicator.hpp"
#include "runtime/core/trace.hpp"
#include "runtime/nn/gpt.hpp"
#include "runtime/train/fixed_point.hpp"
#include "runtime/train/trainer.hpp"

namespace cohort::train {

void trainer::set_experts_comm(comm::communicator* c, int passes) {
  experts_comm_ = c;
  experts_passes_ = c != nullptr ? passes : 0;
  if (c == nullptr) {
    model_->set_moe_exchange(nullptr);
    return;
  }
  experts_.ranks = c->size();
  experts_.rank = c->rank();
  experts_.alltoall = [this](const void* send, void* recv, std::size_t bytes) {
    const auto t0 = std::chrono::steady_clock::now();
    {
      trace::span s("alltoall", "comm", trace::track::compute,
                    trace::args({{"bytes", static_cast<int64_t>(bytes * experts_comm_->size())}}));
      experts_comm_->alltoall(send, recv, bytes);
    }
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::steady_clock::now() - t0);
    ++moe_.alltoall_calls;
    // What this rank sends the others (its own block stays here).
    moe_.alltoall_bytes += static_cast<uint64_t>(bytes) * static_cast<uint64_t>(experts_comm_->size() - 1);
    moe_.alltoall_us += static_cast<uint64_t>(us.count());
  };
  experts_.settle = nullptr;
  if (bitwise_) {
    // Another rank's rows alone are in these gradients, computed from zero: converted as that
    // rank converts its micro-batch's (fixed_sum_stage), then cleared for the next.
    experts_.settle = [this](nn::linear& fc, nn::linear& proj) {
      float* base = model_->flat_grads().data();
      for (nn::tensor* g : {&proj.db, &proj.dw, &fc.db, &fc.dw}) {
        if (g->numel() == 0) continue;
        const int64_t offset = g->data() - base;
        accumulate_gradients(fixed_.data(), base, offset, g->numel(),
                             "step " + std::to_string(sharded_step_) + " (an expert's gradient)");
        std::fill(g->data(), g->data() + g->numel(), 0.0f);
      }
    };
  }
  model_->set_moe_exchange(&experts_);
}

void trainer::count_moe() {
  const auto* g = dynamic_cast<const nn::gpt*>(model_.get());
  if (g == nullptr || !g->has_moe()) return;
  const nn::gpt::moe_stats st = g->last_moe();
  if (moe_.expert_tokens.size() < st.tokens.size()) moe_.expert_tokens.resize(st.tokens.size(), 0);
  for (std::size_t e = 0; e < st.tokens.size(); ++e) moe_.expert_tokens[e] += st.tokens[e];
  moe_.dropped += st.dropped;
}

trainer::moe_counters trainer::take_moe_counters() {
  moe_counters out = std::move(moe_);
  moe_ = moe_counters{};
  return out;
}

}  // namespace cohort::train
