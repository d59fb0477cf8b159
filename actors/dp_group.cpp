// The allreduce_group: one training step as seen by one DP replica (docs/protocol.md,
// "Training"). The same step for the whole model and for a pipeline stage (train::seat):
// gradients of the step's last micro-batch are handed to the bucket engine range by range
// while backward goes on below them; the vote goes out only once every bucket is reduced,
// and the optimizer runs only when the step is committed: by the coordinator's result, or
// in a commit window as soon as the DP sum is complete here (it completes only once every
// member's gradients are in: every member computed the step, which is the vote).
#include "actors/dp_group.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "runtime/step/remote_kv.hpp"
#include "runtime/step/step_faults.hpp"
#include "runtime/step/worker_step.hpp"
#include "runtime/comm/buckets.hpp"
#include "runtime/ckpt/checkpoint_dir.hpp"
#include "runtime/comm/comm_error.hpp"
#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/paths.hpp"
#include "runtime/core/trace.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/net/host_address.hpp"
#include "runtime/train/checkpoint_writer.hpp"
#include "runtime/train/param_stats.hpp"
#include "runtime/train/seat.hpp"

namespace cohort::actors {

using step::fault_hooks;
using step::fault_seat;
using step::link_context;
using step::remote_kv;
using step::worker_step;

namespace {

using clock_type = std::chrono::steady_clock;

uint64_t micros(clock_type::duration d) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(d).count());
}

void add(net::step_timing& a, const net::step_timing& b) {
  a.compute_us += b.compute_us;
  a.comm_wait_us += b.comm_wait_us;
  a.allreduce_us += b.allreduce_us;
  a.setup_us += b.setup_us;
  a.bytes_sent += b.bytes_sent;
  a.bytes_recv += b.bytes_recv;
}

[[noreturn]] void refuse(const std::string& why) {
  throw comm::comm_error(comm::comm_failure::invalid, "step", why);
}

/// The group's state; lives on the group's own thread only.
struct group {
  dp_group_io io;
  std::shared_ptr<dp_group_shared> shared;
  /// Queues the window's next step behind whatever the mailbox holds (an abort first).
  std::function<void(const net::step_open&, uint64_t member_id, int rank)> continue_window;
  uint64_t member_id = 0;
  std::unique_ptr<config> cfg;
  /// pp * tp > 1: the seat is a pipeline stage / TP shard, built at the first step_open
  /// (which names it); otherwise the whole model, built with the job.
  bool staged = false;
  std::unique_ptr<fault_seat> seat;
  std::optional<net::fault_order> early_fault;  ///< armed before the seat exists
  std::string resume;                           ///< checkpoint a stage loads once built
  uint64_t job_id = 0;  ///< the run's id (job_spec), written into each shard
  int last_micro = 0;   ///< micro-batches of this replica in the last step
  dp_links links;       ///< of the current generation
  /// Rank 0's checkpoints, written in the background (training does not wait for disk).
  std::unique_ptr<train::checkpoint_writer> writer;
  /// Where this worker's Gloo pairs and p2p channel listen, and what they advertise.
  std::string data_host;
  int64_t next_step = 0;  ///< first step whose update the parameters lack

  using pending_step = worker_step::pending_step;
  worker_step protocol;  ///< which open / result to act on, and how (pure)
  /// The last vote and the final report, sent again when the coordinator repeats the
  /// message they answer (a frame was lost: drop control, or a socket).
  std::optional<net::step_vote> last_vote;
  std::optional<net::train_report> last_report;

  net::step_timing total;  ///< whole run
  int64_t steps_computed = 0;
  // Steps whose DP sum travelled compressed (computed without error) and their bytes sent.
  int64_t compressed_steps = 0;
  uint64_t compressed_bytes_sent = 0;
  /// Whole run, DP collectives only: seconds the DP group's collectives ran, and the part
  /// of them that fell inside the steps' backward windows: the overlap's terms.
  double collective_s = 0, hidden_s = 0;
  std::optional<clock_type::time_point> last_end;  ///< end of the last handler (idle clock)
  uint64_t idle_before_us = 0;  ///< idle time before the current handler (the vote's)
  /// A held-out evaluation not yet told to the coordinator (telemetry after the next vote).
  std::optional<net::telemetry> eval_to_tell;
  static constexpr std::chrono::milliseconds telemetry_period{250};
  clock_type::time_point next_tell{};  ///< spans go out with the first vote after this

  ~group() { links.drop(*shared); }

  // Time between handlers is time spent waiting for the coordinator.
  void begin_handler() {
    idle_before_us = last_end ? micros(clock_type::now() - *last_end) : 0;
    total.idle_us += idle_before_us;
  }
  void end_handler() { last_end = clock_type::now(); }

  void make_seat(std::unique_ptr<train::seat> s) {
    fault_hooks h{io.mute_heartbeats, io.cut_off};
    seat = std::make_unique<fault_seat>(std::move(s), std::move(h));
    if (early_fault) seat->arm(*early_fault);
    early_fault.reset();
  }

  void on_fault(const net::fault_order& f) {
    if (seat)
      seat->arm(f);
    else
      early_fault = f;
  }

  void on_job(const net::job_spec& spec, uint64_t member, uint64_t generation) {
    member_id = member;
    if (!cfg) {
      try {
        cfg =
            std::make_unique<config>(load_config_text(spec.config_yaml, "<job from coordinator>"));
        staged = cfg->parallel.pp * cfg->parallel.tp > 1;
        job_id = spec.job_id;
        data_host = cfg->comm.interface == "auto" ? io.data_host
                                                  : net::resolve_interface(cfg->comm.interface);
        spdlog::info("dp group: data plane on {} (comm.interface {})", data_host,
                     cfg->comm.interface);
        if (staged) {
          // The stage is built once the coordinator seats this worker (first step_open).
          if (!spec.resume_checkpoint.empty()) {
            resume = spec.resume_checkpoint;
            next_step = read_checkpoint_metadata(resume).step;
          }
          spdlog::info(
              "dp group: pipeline / tensor-parallel job (pp {} x tp {}, {}), waiting "
              "for a seat",
              cfg->parallel.pp, cfg->parallel.tp, cfg->parallel.schedule);
        } else {
          make_seat(train::make_whole_seat(*cfg));
          if (!spec.resume_checkpoint.empty()) {
            next_step = seat->load_checkpoint(spec.resume_checkpoint);
            spdlog::info("dp group: resumed from {} at step {}", spec.resume_checkpoint, next_step);
          }
          spdlog::info("dp group: model {} with {} parameters, {} micro-batches per step",
                       cfg->model.kind, seat->elements(), seat->micro_batches());
        }
      } catch (const std::exception& e) {
        io.fatal(std::string("cannot build the job: ") + e.what());
        return;
      }
    }
    protocol.forget_window();
    io.send(net::worker_ready{member_id, generation, next_step});
  }

  // A pipeline stage's seat, built at its first step_open; V.fatal when it cannot be.
  void seat_stage(const net::step_open& o, net::step_vote& v) {
    if (!seat) {
      try {
        make_seat(train::make_stage_seat(*cfg, o.stage, o.tp_rank));
        if (!resume.empty()) next_step = seat->load_checkpoint(resume);
      } catch (const std::exception&) {
        seat.reset();
        v.fatal = true;
        throw;
      }
      spdlog::info("dp group: seated at stage {} / TP rank {}: {} parameters ({})", o.stage,
                   o.tp_rank, seat->elements(), cfg->parallel.schedule);
    }
    const auto [stage, tp_rank] = seat->position();
    if (stage != o.stage || tp_rank != o.tp_rank)
      refuse("this worker holds stage " + std::to_string(stage) + " / TP rank " +
             std::to_string(tp_rank) + ", but was seated at stage " + std::to_string(o.stage) +
             " / TP rank " + std::to_string(o.tp_rank));
  }

  // Every member of the DP group takes the donor's parameters, optimizer state and step
  // counters; a member that was behind reports how long that took in T.
  void receive_state(int donor, int64_t step, net::step_timing& t) {
    const auto ts = clock_type::now();
    const bool behind = next_step != step;  // the joiner's figure is the one reported
    uint64_t bytes = 0;
    for (auto& [ptr, n] : seat->state_buffers()) {
      links.comm->broadcast(ptr, n * sizeof(float), donor);
      bytes += n * sizeof(float);
    }
    int64_t counters[2] = {seat->optimizer_steps(), step};
    links.comm->broadcast(counters, sizeof counters, donor);
    seat->set_optimizer_steps(counters[0]);
    next_step = counters[1];
    if (behind) {
      t.state_bytes = bytes + sizeof counters;
      t.state_us = std::max<uint64_t>(1, micros(clock_type::now() - ts));
    }
    trace::complete(behind ? "state received" : "state sent", "state", trace::ns(ts),
                    trace::now_ns(), trace::track::control,
                    trace::args({{"donor", donor},
                                 {"step", step},
                                 {"bytes", static_cast<int64_t>(bytes + sizeof counters)}}));
  }

  void restore(const net::step_open& o) {
    const std::string dir =
        checkpoint_path(expand_user(cfg->fault_tolerance.checkpoint_dir), o.restore);
    try {
      next_step = seat->load_checkpoint(dir);
    } catch (const std::exception& e) {
      refuse("cannot roll back to " + dir + ": " + e.what());
    }
    spdlog::info("dp group: rolled back to {} (step {})", dir, next_step);
  }

  // One step of this replica's seat: links of the generation, state from a donor, the
  // gradients (bucketed while backward runs), the DP sum, and what the vote says.
  void run_step(const net::step_open& o, int rank, net::step_vote& v, net::step_timing& t) {
    const auto t0 = clock_type::now();
    if (staged) seat_stage(o, v);
    if (!links.current(o, rank)) {
      remote_kv kv(io.kv_call, o.generation);
      build_links(links, link_context{*cfg, data_host, kv, *shared, io.keys}, o, rank, *seat, staged);
    }
    // A rollback: every member goes back to the checkpoint of this step, its own error
    // memory included (docs/compression.md, "A killed worker").
    if (o.restore >= 0) restore(o);
    // The donor's state is everyone's after the transfer, counters included: a donor that
    // does not hold this step must not hand out an older one as if it did.
    if (o.donor_rank == rank && next_step != o.step)
      refuse("named the donor of step " + std::to_string(o.step) + ", but this worker holds " +
             "the state of step " + std::to_string(next_step));
    if (o.donor_rank >= 0) receive_state(o.donor_rank, o.step, t);
    const auto t1 = clock_type::now();
    t.setup_us = micros(t1 - t0);
    if (next_step != o.step)
      refuse("this worker holds the state of step " + std::to_string(next_step) + ", not " +
             std::to_string(o.step));
    seat->begin_step();
    comm::bucket_engine& engine = *links.engine;
    if (engine.type() == comm::grad_type::f32) engine.set_wire(seat->wire(o.replicas, rank));
    const comm::comm_traffic before = links.traffic();
    void* buf = seat->reduction_buffer();
    if (seat->reduction_type() == comm::grad_type::i64)
      engine.begin(static_cast<int64_t*>(buf));
    else
      engine.begin(static_cast<float*>(buf));
    const std::vector<int> micro =
        train::replica_micro_batches(seat->micro_batches(), o.replicas, rank);
    last_micro = static_cast<int>(micro.size());
    seat->begin(o.generation, o.step, rank, [&engine] { engine.abort(); });
    double loss_rows = 0;
    // Backward is over when it hands over its last gradients: after that the compute
    // thread only returns (and may not even be scheduled while the buckets go out).
    clock_type::time_point t_backward_end = t1;
    try {
      loss_rows = seat->compute_gradients(o.step, micro, [&](std::size_t off, std::size_t n) {
        t_backward_end = clock_type::now();  // these gradients are final now
        engine.mark_ready(off, n);
      });
    } catch (const comm::comm_error&) {
      throw;
    } catch (const std::exception&) {
      engine.abort();  // peers must not wait for buckets that will never come
      v.fatal = true;  // arithmetic or data trouble, not a peer: a retry would fail the same
      throw;
    }
    const auto t2 = clock_type::now();
    const comm::bucket_timing bt = engine.wait_all();
    try {
      seat->finish_gradients(o.step);
    } catch (const comm::comm_error&) {
      throw;
    } catch (const std::exception&) {
      v.fatal = true;  // a diverged sum: every member holds the same one, a retry too
      throw;
    }
    // As `cohort train` does: a loss that is not finite ends the run (after the sum, so that
    // no peer waits for a bucket).
    if (seat->speaks_for_loss() && !std::isfinite(loss_rows)) {
      v.fatal = true;
      throw cohort::error("step " + std::to_string(o.step) +
                          ": loss is not finite (lower train.lr)");
    }
    t.compute_us = micros(t2 - t1);
    t.comm_wait_us = micros(clock_type::now() - t2);
    t.allreduce_us = static_cast<uint64_t>(bt.allreduce_s * 1e6);
    const comm::comm_traffic now = links.traffic();
    if (now.measured) {  // a backend that cannot count: 0, never an estimate
      t.bytes_sent = now.sent - before.sent;
      t.bytes_recv = now.received - before.received;
    }
    // Backward's window: from the start of compute_gradients to the last range handed
    // over. Its earlier work adds nothing to the intersection: no bucket goes out before
    // the last micro-batch's backward marks its first range ready. A group of one runs no
    // collective: nothing to hide.
    if (links.size > 1) {
      collective_s += comm::covered_seconds(bt.collectives);
      hidden_s += comm::overlap_seconds(bt.collectives, {{t1, t_backward_end}});
    }
    if (seat->speaks_for_loss()) {
      v.loss_rows = loss_rows;
      for (int i : micro)
        v.rows += micro_batch_rows(i, cfg->train.micro_batch, cfg->train.global_batch);
    }
  }

  // The window's next step, queued by the last one: run unless an abort came between.
  void on_next(const net::step_open& o, uint64_t member, int rank) {
    if (protocol.continues(o.generation, o.step)) on_open(o, member, rank);
  }

  void on_open(const net::step_open& o, uint64_t member, int rank) {
    begin_handler();
    member_id = member;
    const worker_step::open_plan plan = protocol.on_open(o.generation, o.step, o.through);
    if (plan.resend_vote) {
      io.send(*last_vote);
      end_handler();
      return;
    }
    if (plan.commit_first) commit(*plan.commit_first);
    net::step_vote v;
    v.member_id = member_id;
    v.generation = o.generation;
    v.step = o.step;
    net::step_timing t;
    try {
      if (!cfg) refuse("no job loaded yet");
      if (rank < 0 || rank >= o.replicas)
        refuse("this worker has no rank in generation " + std::to_string(o.generation));
      run_step(o, rank, v, t);
      v.ok = true;
      if (links.engine && !links.engine->wire().compressed.empty()) {
        ++compressed_steps;
        compressed_bytes_sent += t.bytes_sent;
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
      links.drop(*shared);
    }
    t.idle_us = idle_before_us;  // this step's wait for its open (total.idle_us has it too)
    v.timing = t;
    add(total, t);
    const pending_step p{o.generation, o.step, rank, member_id};
    if (v.ok && o.through >= o.step) {
      commit(p);
      v.applied = true;
      protocol.applied(o.generation, o.step);
    } else {
      protocol.voted(o.generation, o.step, v.ok, p);
    }
    last_vote = v;
    io.send(v);
    tell(o.generation, o.step);
    if (const auto next = protocol.next_in_window()) {
      net::step_open n = o;
      n.step = *next;
      n.donor_rank = -1;
      n.restore = -1;  // a rollback loads once, at the window's first step
      continue_window(n, member_id, rank);
    }
    end_handler();
  }

  // Rank 0 writes the same checkpoints `cohort train` writes (so either can resume them),
  // and with error feedback every rank its memory beside them: the state is copied now and
  // written in the background; the last one is waited for.
  std::string checkpoint(int64_t step) {
    if (!writer)
      writer = std::make_unique<train::checkpoint_writer>(
          expand_user(cfg->fault_tolerance.checkpoint_dir), cfg->fault_tolerance.keep);
    trace::span traced("checkpoint", "checkpoint", trace::track::compute,
                       trace::args({{"step", step}}));
    seat->save(*writer, step, job_id);
    return step == cfg->train.steps ? writer->wait() : std::string();
  }

  void on_result(const net::step_result& r) {
    begin_handler();
    switch (protocol.on_result(r.generation, r.step, r.commit,
                               last_report ? last_report->next_step : -1)) {
      case worker_step::result_action::ignore:
        break;
      case worker_step::result_action::resend_report:
        // Under this member's current id: after a leader change (ha) it registered anew.
        last_report->member_id = member_id;
        last_report->generation = r.generation;
        io.send(*last_report);
        break;
      case worker_step::result_action::commit:
        commit(protocol.take_pending());
        break;
      case worker_step::result_action::aborted:
        io.send(net::worker_ready{member_id, r.generation, next_step});
        break;
    }
    end_handler();
  }

  // Applies the step P voted for (the coordinator committed it), then checkpoints,
  // evaluates and reports as the step number says.
  void commit(const pending_step& p) {
    const auto t0 = clock_type::now();
    try {
      seat->apply_step(p.step);
    } catch (const std::exception& e) {
      io.fatal(std::string("applying step ") + std::to_string(p.step) + ": " + e.what());
      return;
    }
    next_step = p.step + 1;
    ++steps_computed;
    const int64_t every = cfg->fault_tolerance.checkpoint_every;
    std::string ckpt;
    try {
      if ((p.rank == 0 || seat->saves_every_rank()) &&
          (next_step == cfg->train.steps || (every > 0 && next_step % every == 0)))
        ckpt = checkpoint(next_step);
    } catch (const std::exception& e) {
      spdlog::error("dp group: checkpoint at step {} failed: {}", next_step, e.what());
    }
    total.compute_us += micros(clock_type::now() - t0);
    const int64_t eval_every = cfg->train.eval_every;
    if (p.rank == 0 && eval_every > 0 && next_step % eval_every == 0 &&
        next_step < cfg->train.steps) {
      // Like `cohort train`: a held-out evaluation now and then, by replica 0 (every stage
      // of it together: the split runs through its pipeline); the others wait for it at the
      // next step.
      try {
        trace::span traced("eval", "compute", trace::track::compute,
                           trace::args({{"step", next_step}}));
        const train::evaluation e = seat->evaluate(next_step);
        if (e.count > 0) {
          std::fprintf(stderr, "\neval at step %lld: loss %.4f, accuracy %.4f\n",
                       static_cast<long long>(next_step), e.loss, e.accuracy);
          eval_to_tell.emplace();
          eval_to_tell->eval_step = next_step;
          eval_to_tell->eval_loss = e.loss;
          eval_to_tell->eval_accuracy = cfg->model.kind == "gpt" ? -1.0 : e.accuracy;
        }
      } catch (const std::exception& e) {
        spdlog::warn("dp group: evaluation at step {} failed: {}", next_step, e.what());
      }
    }
    if (next_step == cfg->train.steps) report(p, ckpt);
  }

  // Telemetry after a vote (and before the final report): an evaluation not yet told, and
  // with --trace the spans recorded since the last one, in chunks the coordinator takes in
  // one frame each. Nothing to say: nothing sent.
  void tell(uint64_t generation, int64_t step, bool now = false) {
    // Spans wait in the recorder for up to telemetry_period (an evaluation or the final
    // report sends at once): one frame per step would cost the coordinator, whose actor every
    // step passes through, more than the spans themselves.
    const auto t_now = clock_type::now();
    if (!now && !eval_to_tell && t_now < next_tell) return;
    // Spans wait for the first clock probe's answer: without an offset, another host's spans
    // would land as far off as the two machines' uptimes differ.
    if (!now && io.clock && io.clock().error_ns < 0) return;
    next_tell = t_now + telemetry_period;
    std::vector<trace::event> spans = trace::take();
    if (spans.empty() && !eval_to_tell) return;
    net::telemetry m = eval_to_tell ? *eval_to_tell : net::telemetry{};
    eval_to_tell.reset();
    m.member_id = member_id;
    m.generation = generation;
    m.step = step;
    if (io.clock) {
      const clock_sync::estimate c = io.clock();
      m.clock_offset_ns = c.offset_ns;
      m.clock_error_ns = c.error_ns;
    }
    m.dropped_spans = trace::dropped();
    if (seat) m.peak_pool_bytes = seat->peak_pool_bytes();
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
      io.send(part);
    } while (at < spans.size());
  }

  void report(const pending_step& p, const std::string& ckpt) {
    tell(p.generation, p.step, true);
    net::train_report rep;
    rep.member_id = p.member_id;
    rep.generation = p.generation;
    rep.next_step = next_step;
    const train::seat_report s = seat->report();
    rep.params_sha256 = s.params_sha256;
    if (p.rank == 0) {
      try {
        const train::evaluation e = seat->evaluate(next_step + 1);
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
      x.micro_batches = last_micro;
    }
    rep.steps_computed = steps_computed;
    rep.compressed_steps = compressed_steps;
    rep.compressed_bytes_sent = compressed_bytes_sent;
    // Measured from the collectives' and backward's timestamps; 0 when no collective ran.
    rep.overlap = collective_s > 0 ? hidden_s / collective_s : 0.0;
    rep.peak_pool_bytes = s.peak_pool_bytes;
    rep.checkpoint = ckpt;
    rep.num_params = s.model_params;
    rep.timing = total;
    last_report = rep;
    io.send(rep);
  }
};

}  // namespace

caf::behavior dp_group_actor(caf::event_based_actor* self, dp_group_io io,
                             std::shared_ptr<dp_group_shared> shared) {
  auto g = std::make_shared<group>();
  g->io = std::move(io);
  g->shared = std::move(shared);
  g->continue_window = [self](const net::step_open& o, uint64_t member, int rank) {
    self->send(self, co_next_atom::value, o, member, static_cast<int32_t>(rank));
  };
  // The state dies with the behavior (the actor's end), aborting any communicator first.
  return {
      [g](co_job_atom, const net::job_spec& spec, uint64_t member_id, uint64_t generation) {
        g->on_job(spec, member_id, generation);
      },
      [g](co_open_atom, const net::step_open& o, uint64_t member_id, int32_t rank) {
        g->on_open(o, member_id, rank);
      },
      [g](co_next_atom, const net::step_open& o, uint64_t member_id, int32_t rank) {
        g->on_next(o, member_id, rank);
      },
      [g](co_res_atom, const net::step_result& r) { g->on_result(r); },
      [g](co_fault_atom, const net::fault_order& f) { g->on_fault(f); },
  };
}

}  // namespace cohort::actors
