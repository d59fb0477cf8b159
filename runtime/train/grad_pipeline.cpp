#include "runtime/train/grad_pipeline.hpp"

#include "runtime/core/error.hpp"
#include "runtime/core/host_pages.hpp"
#include "runtime/train/grad_clip.hpp"
#include "runtime/train/grad_fixed_sum.hpp"
#include "runtime/train/grad_fixed_to_float.hpp"
#include "runtime/train/grad_onebit_denominator.hpp"
#include "runtime/train/grad_onebit_momentum.hpp"

namespace cohort::train {

std::string grad_sum::name() const {
  std::string n = compressed.empty()
                      ? (type == comm::grad_type::i64 ? "sum_i64" : "sum_f32")
                      : std::string("compressed_sum_") + comm::name_of(compressed[0].format);
  if (plain == comm::plain_sum::rank_order) n += "_rank_order";
  return n;
}

std::vector<std::string> grad_pipeline::names() const {
  std::vector<std::string> out;
  auto add = [&](const stages& s) {
    for (const auto& st : s) out.emplace_back(st->name());
  };
  add(micro_batch);
  add(before_sum);
  if (sum.error_feedback) out.emplace_back("error_feedback");
  out.push_back(sum.name());
  add(after_sum);
  add(before_optimizer);
  return out;
}

void grad_buffers::zero_grads() {
  const auto n = static_cast<std::size_t>(size);
  if (held != nullptr && dev->host_visible())
    zero_keeping(grads, sizeof(float), n, *held);
  else
    dev->zero(grads, n * sizeof(float));  // 0.0f is all zero bits
}

void run_stages(const grad_pipeline::stages& stages, grad_buffers& b, int64_t offset,
                int64_t count) {
  for (const auto& s : stages) s->run(b, offset, count);
}

grad_pipeline choose_grad_pipeline(const grad_mode& mode, int64_t elements, nn::optimizer& opt) {
  grad_pipeline p;
  p.phase = mode.onebit;
  auto* onebit = dynamic_cast<nn::onebit_adam*>(&opt);
  COHORT_CHECK((onebit != nullptr) == (mode.onebit != onebit_phase::off));
  const bool frozen = mode.onebit == onebit_phase::frozen;
  // The wire: 1-bit Adam sends floats in every phase (signs once frozen); compression sends
  // floats; only a bitwise run with neither sums its int64 fixed point itself.
  if (frozen)
    p.sum.compressed = onebit_wire(*onebit);
  else if (mode.onebit == onebit_phase::off && mode.compression != comm::wire_format::f32)
    p.sum.compressed.push_back({0, static_cast<std::size_t>(elements), mode.compression});
  const bool float_wire = mode.onebit != onebit_phase::off || !p.sum.compressed.empty();
  p.sum.type = mode.bitwise && !float_wire ? comm::grad_type::i64 : comm::grad_type::f32;
  // Bitwise with a float buffer: the plain stretches too are summed in rank order, so the
  // bits do not depend on the transport nor on which ranks share a host.
  if (mode.bitwise) p.sum.plain = comm::plain_sum::rank_order;
  p.sum.error_feedback = mode.error_feedback && !p.sum.compressed.empty();

  if (mode.bitwise) p.micro_batch.push_back(std::make_unique<fixed_sum_stage>());
  // A float wire carries the exact fixed-point sum, rounded once, before it travels.
  auto& decode = p.sum.type == comm::grad_type::f32 ? p.before_sum : p.after_sum;
  if (mode.bitwise) decode.push_back(std::make_unique<fixed_to_float_stage>());
  if (frozen) {
    p.before_sum.push_back(std::make_unique<momentum_share_stage>(*onebit));
    p.before_sum.push_back(
        std::make_unique<denominator_stage>(*onebit, denominator_stage::direction::divide));
    p.after_sum.push_back(
        std::make_unique<denominator_stage>(*onebit, denominator_stage::direction::multiply));
  } else {
    // After 1-bit Adam's freeze the buffer holds momentum on most ranges: no global gradient
    // exists to clip (DeepSpeed's 1-bit Adam does not clip either); the norm still tells
    // whether the run diverged.
    p.before_optimizer.push_back(std::make_unique<clip_stage>(mode.grad_clip));
  }
  return p;
}

}  // namespace cohort::train
