// One DP replica's step (replica_step.hpp): gradients of the step's last micro-batch are
// handed to the bucket engine range by range while backward goes on below them; the vote
// goes out only once every bucket is reduced, and the optimizer runs only when the step is
// committed: by the coordinator's result, or in a commit window as soon as the DP sum is
// complete here (it completes only once every member's gradients are in: every member
// computed the step, which is the vote).
#include "runtime/step/replica_step.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "runtime/ckpt/checkpoint.hpp"
#include "runtime/core/cpu_bind.hpp"
#include "runtime/nn/device.hpp"
#include "runtime/comm/buckets.hpp"
#include "runtime/comm/comm_error.hpp"
#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/paths.hpp"
#include "runtime/core/trace.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/step/balance.hpp"
#include "runtime/train/checkpoint_writer.hpp"
#include "runtime/train/param_stats.hpp"
#include "runtime/train/seat.hpp"
#include "runtime/train/trainer.hpp"

namespace cohort::step {

namespace {

void add(net::step_timing& a, const net::step_timing& b) {
  a.compute_us += b.compute_us;
  a.comm_wait_us += b.comm_wait_us;
  a.allreduce_us += b.allreduce_us;
  a.setup_us += b.setup_us;
  a.bytes_sent += b.bytes_sent;
  a.bytes_recv += b.bytes_recv;
  a.reshard_us += b.reshard_us;
  a.reshard_bytes += b.reshard_bytes;
  a.points += b.points;
  a.point_us += b.point_us;
  a.point_bytes += b.point_bytes;
  a.moe_tokens += b.moe_tokens;
  a.moe_dropped += b.moe_dropped;
  a.alltoall_calls += b.alltoall_calls;
  a.alltoall_bytes += b.alltoall_bytes;
  a.alltoall_us += b.alltoall_us;
  a.regroup_us += b.regroup_us;
  if (b.regroup_path != 0) a.regroup_path = b.regroup_path;  // the latest way it was built
}

// Sharded gradients: complete buckets backward may run ahead of their sums by.
constexpr std::size_t pending_sums = 2;

}  // namespace

void replica_step::refuse(const std::string& why) {
  throw comm::comm_error(comm::comm_failure::invalid, "step", why);
}

replica_step::replica_step(replica_io io, std::shared_ptr<dp_group_shared> shared)
    : io_(std::move(io)), shared_(std::move(shared)) {}

replica_step::~replica_step() { links_.drop(*shared_); }

// Time between handlers is time spent waiting for the coordinator.
void replica_step::begin_handler() {
  idle_before_us_ = last_end_ ? micros(io_.now() - *last_end_) : 0;
  total_.idle_us += idle_before_us_;
}

void replica_step::make_seat(bool staged, int stage, int tp_rank) {
  seat_ = std::make_unique<fault_seat>(io_.make_seat(*cfg_, staged, stage, tp_rank), io_.faults);
  if (early_fault_) seat_->arm(*early_fault_);
  early_fault_.reset();
}

void replica_step::on_fault(const net::fault_order& f) {
  if (seat_)
    seat_->arm(f);
  else
    early_fault_ = f;
}

void replica_step::on_job(const net::job_spec& spec, uint64_t member, uint64_t generation) {
  member_id_ = member;
  if (!cfg_) {
    try {
      cfg_ = std::make_unique<config>(load_config_text(spec.config_yaml, "<job from coordinator>"));
      // cluster.bind: before the model's threads exist (they inherit it).
      if (cfg_->cluster.bind != "none") {
        const proc::cpu_binding b =
            proc::bind_self(cfg_->cluster.bind, nn::local_rank_from_env(), proc::local_size_from_env());
        cpus_ = b.cpus;
        if (!b.note.empty()) spdlog::info("dp group: {}", b.note);
      } else {
        cpus_ = proc::current_cpus();
      }
      staged_ = cfg_->parallel.pp * cfg_->parallel.tp > 1;
      job_id_ = spec.job_id;
      data_host_ = io_.data_host(*cfg_);
      spdlog::info("dp group: data plane on {} (comm.interface {})", data_host_,
                   cfg_->comm.interface);
      if (staged_) {
        // The stage is built once the coordinator seats this worker (first step_open).
        if (!spec.resume_checkpoint.empty()) {
          resume_ = spec.resume_checkpoint;
          next_step_ = read_checkpoint_metadata(resume_).step;
        }
        spdlog::info(
            "dp group: pipeline / tensor-parallel job (pp {} x tp {}, {}), waiting for a seat",
            cfg_->parallel.pp, cfg_->parallel.tp, cfg_->parallel.schedule);
      } else {
        make_seat(false, 0, 0);
        if (!spec.resume_checkpoint.empty()) {
          next_step_ = seat_->load_checkpoint(spec.resume_checkpoint);
          spdlog::info("dp group: resumed from {} at step {}", spec.resume_checkpoint, next_step_);
        }
        spdlog::info("dp group: model {} with {} parameters, {} micro-batches per step",
                     cfg_->model.kind, seat_->elements(), seat_->micro_batches());
      }
    } catch (const std::exception& e) {
      io_.fatal(std::string("cannot build the job: ") + e.what());
      return;
    }
  }
  // A spare (member 0) loaded the job ahead of its seat: it says it is ready once seated.
  if (member == 0) return;
  protocol_.forget_window();
  io_.send(net::worker_ready{member_id_, generation, next_step_});
}

// A pipeline stage's seat, built at its first step_open; V.fatal when it cannot be.
void replica_step::seat_stage(const net::step_open& o, net::step_vote& v) {
  if (!seat_) {
    try {
      make_seat(true, o.stage, o.tp_rank);
      if (!resume_.empty()) next_step_ = seat_->load_checkpoint(resume_);
    } catch (const std::exception&) {
      seat_.reset();
      v.fatal = true;
      throw;
    }
    spdlog::info("dp group: seated at stage {} / TP rank {}: {} parameters ({})", o.stage,
                 o.tp_rank, seat_->elements(), cfg_->parallel.schedule);
  }
  const auto [stage, tp_rank] = seat_->position();
  if (stage != o.stage || tp_rank != o.tp_rank)
    refuse("this worker holds stage " + std::to_string(stage) + " / TP rank " +
           std::to_string(tp_rank) + ", but was seated at stage " + std::to_string(o.stage) +
           " / TP rank " + std::to_string(o.tp_rank));
}

// One step of this replica's seat: links of the generation, state from a donor, the
// gradients (bucketed while backward runs), the DP sum, and what the vote says.
void replica_step::run_step(const net::step_open& o, int rank, net::step_vote& v,
                            net::step_timing& t) {
  const auto t0 = io_.now();
  if (staged_) seat_stage(o, v);
  if (!links_.current(o, rank)) {
    try {
      io_.build_links(links_,
                      link_request{*cfg_, data_host_, o, rank, *seat_, staged_, member_id_});
      t.regroup_path = links_.regroup_path;
      t.regroup_us = links_.regroup_us;
    } catch (const usage_error&) {
      // The job's setup, not a peer (a group mixing devices, a backend the device cannot
      // run): every member refuses alike, and a retry would too.
      v.fatal = true;
      throw;
    }
  }
  // The coordinator's newest good rollback point: older ones are dropped.
  if (train::trainer* w = seat_->whole_model(); w != nullptr && o.point >= 0)
    w->confirm_point(o.point);
  // A rollback: every member goes back to the checkpoint of this step, or to the point in
  // memory, its own error memory included (docs/compression.md, "A killed worker").
  if (o.restore >= 0) {
    if (o.restore_parts.empty())
      restore(o);
    else
      restore_from_memory(o, t);
  }
  // The donor's state is everyone's after the transfer, counters included: a donor that
  // does not hold this step must not hand out an older one as if it did.
  if (o.donor_rank == rank && next_step_ != o.step)
    refuse("named the donor of step " + std::to_string(o.step) + ", but this worker holds " +
           "the state of step " + std::to_string(next_step_));
  if (train::trainer* z = seat_->sharded()) {
    try {
      reshard(*z, o, t);  // the donor's part too: each member holds only its shards
    } catch (const train::shard_lost&) {
      v.lost_state = true;  // only a checkpoint holds it: the coordinator rolls back
      throw;
    } catch (const comm::comm_error&) {
      throw;
    } catch (const std::exception&) {
      v.fatal = true;  // facts that contradict each other: a retry finds the same
      throw;
    }
    // Never a forward pass on parameters a failed gather left partly stale.
    if (!z->whole_params())
      refuse("the parameters of step " + std::to_string(o.step) +
             " are not whole here after the re-cut");
  } else if (o.donor_rank >= 0)
    receive_state(o.donor_rank, o.step, t);
  if (next_step_ != o.step)
    refuse("this worker holds the state of step " + std::to_string(next_step_) + ", not " +
           std::to_string(o.step));
  const auto t1 = io_.now();
  t.setup_us = micros(t1 - t0);
  // The micro-batches this rank computes: the coordinator's shares (train.balance) or the
  // round robin; shares that do not fit the step are refused before any collective.
  std::vector<int> micro;
  try {
    micro = micro_batches_of(o.shares, seat_->micro_batches(), o.replicas, rank);
  } catch (const std::exception& e) {
    refuse(e.what());
  }
  take_point(o, v, t);  // its own figure (point_us), not the step's setup
  seat_->begin_step();
  comm::bucket_engine& engine = *links_.engine;
  if (engine.type() == comm::grad_type::f32) engine.set_wire(seat_->wire(o.replicas, rank));
  train::trainer* const shards = sum_to_holders(engine, o.replicas);
  const comm::comm_traffic before = links_.traffic();
  void* buf = seat_->reduction_buffer();
  if (seat_->reduction_type() == comm::grad_type::i64)
    engine.begin(static_cast<int64_t*>(buf));
  else
    engine.begin(static_cast<float*>(buf));

  last_micro_ = static_cast<int>(micro.size());
  seat_->begin(o.generation, o.step, rank, [&engine] { engine.abort(); });
  double loss_rows = 0;
  // Backward is over when it hands over its last gradients: after that the compute
  // thread only returns (and may not even be scheduled while the buckets go out). Its
  // window is on the engine's clock (its collectives carry steady_clock stamps).
  const clock_type::time_point b0 = clock_type::now();
  clock_type::time_point t_backward_end = b0;
  // Sharded parameters: the blocks' gathers, for this step only (its links may go after it).
  struct params_lease {
    train::trainer* z;
    ~params_lease() {
      if (z != nullptr) z->set_params_comm(nullptr);
    }
  } lease{lend_params(o)};
  // Expert parallelism: the EP group's exchanges, for this step only, likewise.
  struct experts_lease {
    train::trainer* w;
    ~experts_lease() {
      if (w == nullptr) return;
      w->set_experts_comm(nullptr, 0);
      w->set_expert_places({});
    }
  } experts{lend_experts(o, rank)};
  train::trainer* const whole = seat_->whole_model();
  if (whole != nullptr) (void)whole->take_moe_counters();  // an earlier, failed try's
  try {
    loss_rows = seat_->compute_gradients(o.step, micro, [&](std::size_t off, std::size_t n) {
      t_backward_end = clock_type::now();  // these gradients are final now
      engine.mark_ready(off, n);
      // Sharded gradients: backward waits while two summed buckets are not yet given back,
      // so that what this member does not hold never piles up (FSDP limits its gathers so).
      if (shards != nullptr) engine.wait_pending(pending_sums);
    });
  } catch (const comm::comm_error&) {
    throw;
  } catch (const std::exception&) {
    engine.abort();  // peers must not wait for buckets that will never come
    v.fatal = true;  // arithmetic or data trouble, not a peer: a retry would fail the same
    throw;
  }
  const auto t2 = io_.now();
  if (whole != nullptr) count_moe(*whole, t);
  const comm::bucket_timing bt = engine.wait_all();
  if (shards != nullptr)
    shards->finish_sharded_sum(*links_.comm, o.step);  // the norm, from every member's part
  try {
    seat_->finish_gradients(o.step);
  } catch (const comm::comm_error&) {
    throw;
  } catch (const std::exception&) {
    v.fatal = true;  // a diverged sum: every member holds the same one, a retry too
    throw;
  }
  // As `cohort train` does: a loss that is not finite ends the run (after the sum, so that
  // no peer waits for a bucket).
  if (seat_->speaks_for_loss() && !std::isfinite(loss_rows)) {
    v.fatal = true;
    throw cohort::error("step " + std::to_string(o.step) + ": loss is not finite (lower train.lr)");
  }
  t.compute_us = micros(t2 - t1);
  t.comm_wait_us = micros(io_.now() - t2);
  t.allreduce_us = static_cast<uint64_t>(bt.allreduce_s * 1e6);
  const comm::comm_traffic now = links_.traffic();
  if (now.measured) {  // a backend that cannot count: 0, never an estimate
    t.bytes_sent = now.sent - before.sent;
    t.bytes_recv = now.received - before.received;
  }
  // Backward's window: from the start of compute_gradients to the last range handed over.
  // Its earlier work adds nothing to the intersection: no bucket goes out before the last
  // micro-batch's backward marks its first range ready. A group of one runs no collective:
  // nothing to hide.
  if (links_.size > 1) {
    collective_s_ += comm::covered_seconds(bt.collectives);
    hidden_s_ += comm::overlap_seconds(bt.collectives, {{b0, t_backward_end}});
  }
  if (seat_->speaks_for_loss()) {
    v.loss_rows = loss_rows;
    for (int i : micro)
      v.rows += micro_batch_rows(i, cfg_->train.micro_batch, cfg_->train.global_batch);
  }
}

void replica_step::on_next(const net::step_open& o, uint64_t member, int rank) {
  if (protocol_.continues(o.generation, o.step)) on_open(o, member, rank);
}

void replica_step::on_open(const net::step_open& o, uint64_t member, int rank) {
  begin_handler();
  member_id_ = member;
  if (o.end > 0) end_ = o.end;
  const worker_step::open_plan plan = protocol_.on_open(o.generation, o.step, o.through);
  if (plan.resend_vote) {
    io_.send(*last_vote_);
    end_handler();
    return;
  }
  if (plan.commit_first) commit(*plan.commit_first);
  net::step_vote v;
  v.member_id = member_id_;
  v.generation = o.generation;
  v.step = o.step;
  net::step_timing t;
  try {
    if (!cfg_) refuse("no job loaded yet");
    if (rank < 0 || rank >= o.replicas)
      refuse("this worker has no rank in generation " + std::to_string(o.generation));
    run_step(o, rank, v, t);
    v.ok = true;
    if (links_.engine && !links_.engine->wire().compressed.empty()) {
      ++compressed_steps_;
      compressed_bytes_sent_ += t.bytes_sent;
    }
  } catch (const std::exception& e) {
    v.ok = false;
    v.reason = e.what();
    const auto* ce = dynamic_cast<const comm::comm_error*>(&e);
    v.unreachable = ce != nullptr && ce->kind() == comm::comm_failure::unreachable;
    spdlog::warn("dp group: step {} of generation {} failed here: {}", o.step, o.generation,
                 e.what());
    // The communicator is dead after any collective error; drop it now so that nothing
    // of this generation lingers.
    links_.drop(*shared_);
  }
  t.idle_us = idle_before_us_;  // this step's wait for its open (total_.idle_us has it too)
  v.timing = t;
  add(total_, t);
  const pending_step p{o.generation, o.step, rank, member_id_};
  if (v.ok && o.through >= o.step) {
    // A window: the complete DP sum is every member's vote; commit before voting.
    commit(p);
    v.applied = true;
    protocol_.applied(o.generation, o.step);
  } else {
    protocol_.voted(o.generation, o.step, v.ok, p);
  }
  last_vote_ = v;
  io_.send(v);
  tell(o.generation, o.step);
  if (const auto next = protocol_.next_in_window()) {
    net::step_open n = o;
    n.step = *next;
    n.donor_rank = -1;
    n.restore = -1;  // a rollback loads once, at the window's first step
    io_.continue_window(n, member_id_, rank);
  }
  end_handler();
}

void replica_step::on_result(const net::step_result& r) {
  begin_handler();
  switch (protocol_.on_result(r.generation, r.step, r.commit,
                              last_report_ ? last_report_->next_step : -1)) {
    case worker_step::result_action::ignore:
      break;
    case worker_step::result_action::resend_report:
      // Under this member's current id: after a leader change (ha) it registered anew.
      last_report_->member_id = member_id_;
      last_report_->generation = r.generation;
      io_.send(*last_report_);
      break;
    case worker_step::result_action::commit:
      commit(protocol_.take_pending());
      break;
    case worker_step::result_action::aborted:
      io_.send(net::worker_ready{member_id_, r.generation, next_step_});
      break;
  }
  end_handler();
}

// Rank 0 writes the same checkpoints `cohort train` writes (so either can resume them), and
// with error feedback every rank its memory beside them: the state is copied now and written
// in the background; the last one is waited for.
std::string replica_step::checkpoint(int64_t step) {
  if (!writer_)
    writer_ = std::make_unique<train::checkpoint_writer>(
        expand_user(cfg_->fault_tolerance.checkpoint_dir), cfg_->fault_tolerance.keep);
  trace::span traced("checkpoint", "checkpoint", trace::track::compute,
                     trace::args({{"step", step}}));
  seat_->save(*writer_, step, job_id_);
  return step == end_step() ? writer_->wait() : std::string();
}

// Like `cohort train`: a held-out evaluation now and then, by replica 0 (every stage of it
// together: the split runs through its pipeline); the others wait for it at the next step.
void replica_step::evaluate(int64_t step) {
  try {
    trace::span traced("eval", "compute", trace::track::compute, trace::args({{"step", step}}));
    const train::evaluation e = seat_->evaluate(step);
    if (e.count > 0) {
      std::fprintf(stderr, "\neval at step %lld: loss %.4f, accuracy %.4f\n",
                   static_cast<long long>(step), e.loss, e.accuracy);
      eval_to_tell_.emplace();
      eval_to_tell_->eval_step = step;
      eval_to_tell_->eval_loss = e.loss;
      eval_to_tell_->eval_accuracy = cfg_->model.kind == "gpt" ? -1.0 : e.accuracy;
    }
  } catch (const std::exception& e) {
    spdlog::warn("dp group: evaluation at step {} failed: {}", step, e.what());
  }
}

// Every commit comes here, whoever decided it (a window's complete sum, the coordinator's
// result, an open that says the result was lost): applies step P, then checkpoints,
// evaluates and reports as the step number says.
void replica_step::commit(const pending_step& p) {
  const auto t0 = io_.now();
  try {
    seat_->apply_step(p.step);
  } catch (const std::exception& e) {
    io_.fatal(std::string("applying step ") + std::to_string(p.step) + ": " + e.what());
    return;
  }
  next_step_ = p.step + 1;
  ++steps_computed_;
  expert_tokens_applied();
  // Sharded state: each member applied its own shards; the parameters travel now.
  bool whole = true;
  const auto g0 = io_.now();
  train::trainer* const z = seat_->sharded();
  if (z != nullptr) whole = gather(*z, p);  // its time: comm wait
  const auto gathered = io_.now() - g0;
  const int64_t every = cfg_->fault_tolerance.checkpoint_every;
  std::string ckpt;
  try {
    if (!whole) {
      if (next_step_ == end_step() || (every > 0 && next_step_ % every == 0))
        spdlog::warn("dp group: no checkpoint at step {}: its parameters' gather failed",
                     next_step_);
    } else if ((p.rank == 0 || seat_->saves_every_rank()) &&
        (next_step_ == end_step() || (every > 0 && next_step_ % every == 0)))
      ckpt = checkpoint(next_step_);
  } catch (const std::exception& e) {
    spdlog::error("dp group: checkpoint at step {} failed: {}", next_step_, e.what());
  }
  total_.compute_us += micros(io_.now() - t0 - gathered);
  const int64_t eval_every = cfg_->train.eval_every;
  if (whole && p.rank == 0 && eval_every > 0 && next_step_ % eval_every == 0 &&
      next_step_ < end_step())
    evaluate(next_step_);
  // Sharded parameters: what this member does not hold goes back (the checkpoint copied what
  // it writes); a no-op otherwise.
  if (z != nullptr && next_step_ < end_step()) z->release_params();
  if (next_step_ == end_step()) {
    if (!whole) {
      io_.fatal("the parameters' gather after the last step failed (a member was lost in it): "
                "the final parameters are not whole here; resume from the last checkpoint");
      return;
    }
    report(p, ckpt);
  }
}

// Telemetry after a vote (and before the final report): an evaluation not yet told, and with
// --trace the spans recorded since the last one, in chunks the coordinator takes in one frame
// each. Nothing to say: nothing sent.
void replica_step::tell(uint64_t generation, int64_t step, bool now) {
  // Spans wait in the recorder for up to telemetry_period (an evaluation or the final report
  // sends at once): one frame per step would cost the coordinator, whose actor every step
  // passes through, more than the spans themselves.
  const auto t_now = io_.now();
  if (!now && !eval_to_tell_ && t_now < next_tell_) return;
  // Spans wait for the first clock probe's answer: without an offset, another host's spans
  // would land as far off as the two machines' uptimes differ.
  if (!now && io_.clock && io_.clock().error_ns < 0) return;
  next_tell_ = t_now + telemetry_period;
  std::vector<trace::event> spans = trace::take();
  if (spans.empty() && !eval_to_tell_) return;
  net::telemetry m = eval_to_tell_ ? *eval_to_tell_ : net::telemetry{};
  eval_to_tell_.reset();
  m.member_id = member_id_;
  m.generation = generation;
  m.step = step;
  if (io_.clock) {
    const clock_sync::estimate c = io_.clock();
    m.clock_offset_ns = c.offset_ns;
    m.clock_error_ns = c.error_ns;
  }
  m.dropped_spans = trace::dropped();
  if (seat_) m.peak_pool_bytes = seat_->peak_pool_bytes();
  if (seat_)
    if (train::trainer* z = seat_->sharded()) m.model_state_bytes = z->state_bytes().total();
  constexpr std::size_t chunk = 4096;
  std::size_t at = 0;
  do {
    net::telemetry part = m;
    if (at > 0) part.eval_step = -1;  // the evaluation travels once
    for (std::size_t end = std::min(spans.size(), at + chunk); at < end; ++at) {
      trace::event& e = spans[at];
      part.spans.push_back(net::trace_span{std::move(e.name), std::move(e.cat),
                                           static_cast<uint8_t>(e.ph), e.ts_ns, e.dur_ns, e.tid,
                                           std::move(e.args)});
    }
    io_.send(part);
  } while (at < spans.size());
}

void replica_step::report(const pending_step& p, const std::string& ckpt) {
  tell(p.generation, p.step, true);
  net::train_report rep;
  rep.member_id = p.member_id;
  rep.generation = p.generation;
  rep.next_step = next_step_;
  const train::seat_report s = seat_->report();
  rep.params_sha256 = s.params_sha256;
  // A run stopping early (a preemption) skips the final evaluation: its grace time is for
  // the checkpoint, and the resumed run evaluates at its end.
  if (p.rank == 0 && end_step() == cfg_->train.steps) {
    try {
      const train::evaluation e = seat_->evaluate(next_step_ + 1);
      if (e.count > 0) {
        rep.has_eval = true;
        rep.eval_loss = e.loss;
        rep.eval_accuracy = e.accuracy;
        rep.eval_count = e.count;
      }
    } catch (const std::exception& e) {
      spdlog::warn("dp group: final evaluation failed: {}", e.what());
    }
  }
  if (s.staged) {
    rep.param_digests = train::format_param_digests(s.param_digests);
    net::stage_stats& x = rep.stage;
    x.stage = s.stage;
    x.tp_rank = s.tp_rank;
    x.replica = p.rank;
    x.schedule_us = s.timing.schedule_us;
    x.compute_us = s.timing.compute_us;
    x.forward_us = s.timing.forward_us;
    x.forwards = s.timing.forwards;
    x.wait_us = s.timing.wait_us;
    x.p2p_bytes = s.timing.p2p_bytes;
    x.tp_us = s.timing.tp_us;
    x.activation_bytes = s.activation_bytes;
    x.peak_held = s.peak_held;
    x.micro_batches = last_micro_;
  }
  rep.steps_computed = steps_computed_;
  rep.compressed_steps = compressed_steps_;
  rep.compressed_bytes_sent = compressed_bytes_sent_;
  // Measured from the collectives' and backward's timestamps; 0 when no collective ran.
  rep.overlap = collective_s_ > 0 ? hidden_s_ / collective_s_ : 0.0;
  rep.peak_pool_bytes = s.peak_pool_bytes;
  rep.state_params = s.state.params;
  rep.state_grads = s.state.grads;
  rep.state_optimizer = s.state.optimizer;
  rep.state_replica = s.state.replica;
  rep.reshards = reshards_;
  if (train::trainer* w = seat_->whole_model()) rep.point_held_bytes = w->point_bytes();
  rep.checkpoint = ckpt;
  rep.cpus = cpus_;
  rep.num_params = s.model_params;
  rep.timing = total_;
  rep.moe_expert_tokens = moe_expert_tokens_;
  last_report_ = rep;
  io_.send(rep);
}

}  // namespace cohort::step
