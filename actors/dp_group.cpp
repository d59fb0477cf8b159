// The allreduce_group: one training step as seen by one DP replica (docs/protocol.md,
// "Training"). Gradients of the step's last micro-batch are handed to the bucket engine
// block by block while backward goes on below them; the vote goes out only once every
// bucket is reduced, and the optimizer runs only when the coordinator commits.
#include "actors/dp_group.hpp"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <thread>

#include "actors/remote_kv.hpp"
#include "runtime/comm/buckets.hpp"
#include "runtime/comm/build_abort.hpp"
#include "runtime/comm/comm_error.hpp"
#include "runtime/comm/factory.hpp"
#include "runtime/comm/p2p.hpp"
#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/paths.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/net/host_address.hpp"
#include "runtime/train/checkpoint_writer.hpp"
#include "runtime/train/param_stats.hpp"
#include "runtime/train/stage_trainer.hpp"
#include "runtime/train/trainer.hpp"

namespace cohort::actors {

std::shared_ptr<comm::build_abort> dp_group_shared::begin_build(uint64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  build_ = std::make_shared<comm::build_abort>();
  generation_ = generation;
  if (generation < floor_)
    build_->abort("generation " + std::to_string(generation) + " is over (the roster is at " +
                  std::to_string(floor_) + ")");
  return build_;
}

void dp_group_shared::install(comm::communicator* c, uint64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  comm_ = c;
  extra_.clear();
  generation_ = generation;
  if (c != nullptr && generation < floor_) c->abort();
}

void dp_group_shared::install_extra(std::function<void()> abort) {
  std::lock_guard<std::mutex> lock(mu_);
  if (generation_ < floor_) abort();
  extra_.push_back(std::move(abort));
}

void dp_group_shared::abort_locked(const std::string& why) {
  if (build_) build_->abort(why);
  if (comm_ != nullptr) comm_->abort();
  for (auto& f : extra_) f();
}

void dp_group_shared::abort_below(uint64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  floor_ = std::max(floor_, generation);
  if (generation_ < generation)
    abort_locked("generation " + std::to_string(generation_) + " is over (the roster is at " +
                 std::to_string(generation) + ")");
}

void dp_group_shared::abort_all() {
  std::lock_guard<std::mutex> lock(mu_);
  floor_ = std::max(floor_, generation_ + 1);
  abort_locked("generation " + std::to_string(generation_) + " is over (this worker rejoins)");
}

void dp_group_shared::shut() {
  std::lock_guard<std::mutex> lock(mu_);
  floor_ = std::numeric_limits<uint64_t>::max();
  abort_locked("the worker is exiting");
}

int collective_timeout_ms(int fault_timeout_ms) { return std::max(10000, 20 * fault_timeout_ms); }

namespace {

using clock_type = std::chrono::steady_clock;

// COHORT_TEST_ABORT_COMM=STEP:RANK (a test aid, docs/data_parallel.md): the worker of that
// DP rank aborts its own communicator in the middle of that step's backward, once per
// process, so tests can prove that every worker then aborts the step.
struct comm_abort_injection {
  int64_t step = -1;
  int rank = -1;
  bool done = false;
};

comm_abort_injection injection_from_env() {
  comm_abort_injection in;
  const char* v = std::getenv("COHORT_TEST_ABORT_COMM");
  if (v == nullptr) return in;
  long long step = -1;
  int rank = -1;
  if (std::sscanf(v, "%lld:%d", &step, &rank) == 2) {
    in.step = step;
    in.rank = rank;
    spdlog::warn("dp group: COHORT_TEST_ABORT_COMM: rank {} aborts its communicator in step {}",
                 rank, step);
  }
  return in;
}

uint64_t micros(clock_type::duration d) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(d).count());
}

/// The group's state; lives on the group's own thread only.
struct group {
  dp_group_io io;
  std::shared_ptr<dp_group_shared> shared;
  std::unique_ptr<config> cfg;
  std::unique_ptr<train::trainer> tr;
  /// pp * tp > 1: this worker's pipeline stage / TP shard instead of the whole model,
  /// built at the first step_open (which names the seat), with its TP communicator and
  /// point-to-point channel of the current generation.
  bool staged = false;
  std::unique_ptr<train::stage_trainer> st;
  std::unique_ptr<comm::communicator> tp_comm;
  std::unique_ptr<comm::p2p_channel> p2p;
  std::string resume;   ///< checkpoint the stage loads once built
  uint64_t job_id = 0;  ///< the run's id (job_spec), written into each shard
  int last_micro = 0;   ///< micro-batches of this replica in the last step
  std::unique_ptr<comm::communicator> comm;
  /// Further communicators of the DP group (comm.lanes), so buckets overlap in flight.
  std::vector<std::unique_ptr<comm::communicator>> lanes;
  std::unique_ptr<comm::bucket_engine> engine;
  /// Rank 0's checkpoints, written in the background (training does not wait for disk).
  std::unique_ptr<train::checkpoint_writer> writer;
  uint64_t comm_generation = 0;
  /// Where this worker's Gloo pairs and p2p channel listen, and what they advertise.
  std::string data_host;
  int comm_rank = -1, comm_size = 0;
  int64_t next_step = 0;  ///< first step whose update the parameters lack

  /// Gradients reduced for (generation, step) and waiting for the coordinator's decision.
  struct pending_step {
    uint64_t generation = 0;
    int64_t step = 0;
    int rank = 0;
    uint64_t member_id = 0;
  };
  std::optional<pending_step> pending;
  /// The last vote and the final report, sent again when the coordinator repeats the
  /// message they answer (a frame was lost: drop control, or a socket).
  std::optional<net::step_vote> last_vote;
  std::optional<net::train_report> last_report;

  net::step_timing total;  ///< whole run
  int64_t steps_computed = 0;
  /// Whole run, DP collectives only: seconds the DP group's collectives ran, and the part
  /// of them that fell inside the steps' backward windows: the overlap's terms.
  double collective_s = 0, hidden_s = 0;
  /// A pipeline stage under an injected `slow`: each forward and backward is stretched to
  /// this many times its duration (1: not slowed). Set per step.
  double slow_factor = 1;
  std::optional<clock_type::time_point> last_end;  ///< end of the last handler (idle clock)
  comm_abort_injection inject = injection_from_env();
  std::optional<net::fault_order> fault;  ///< injected fault for an upcoming step

  // Carries out an injected fault in the middle of the step's backward (docs/faults.md).
  void carry_out(const net::fault_order& f) {
    if (f.action == net::fault_action::kill) {
      spdlog::warn("dp group: injected fault: killing this worker in step {}", f.step);
      std::fflush(nullptr);
      ::kill(::getpid(), SIGKILL);
    } else if (f.action == net::fault_action::hang) {
      spdlog::warn("dp group: injected fault: hanging {} ms in step {}", f.duration_ms, f.step);
      if (io.mute_heartbeats) io.mute_heartbeats(f.duration_ms);
      std::this_thread::sleep_for(std::chrono::milliseconds(f.duration_ms));
    } else if (f.action == net::fault_action::partition) {
      spdlog::warn("dp group: injected fault: cut off from the coordinator for {} ms in step {}",
                   f.duration_ms, f.step);
      if (io.cut_off) io.cut_off(f.duration_ms);
    }
  }

  ~group() { drop_comm(); }

  void drop_comm() {
    if (comm) comm->abort();
    for (auto& c : lanes) c->abort();
    if (tp_comm) tp_comm->abort();
    if (p2p) p2p->abort();
    engine.reset();  // joins the communication threads (prompt after abort)
    shared->install(nullptr, 0);
    comm.reset();
    lanes.clear();
    tp_comm.reset();
    p2p.reset();
    comm_generation = 0;
  }

  // Time between handlers is time spent waiting for the coordinator.
  void begin_handler() {
    if (last_end) total.idle_us += micros(clock_type::now() - *last_end);
  }
  void end_handler() { last_end = clock_type::now(); }

  // Adds one step's DP collectives, run while backward ran during BACKWARD, to the overlap's
  // terms (a group of one runs none: nothing to hide).
  void add_overlap(const std::vector<comm::time_interval>& collectives,
                   const comm::time_interval& backward) {
    collective_s += comm::covered_seconds(collectives);
    hidden_s += comm::overlap_seconds(collectives, {backward});
  }

  // The DP communicator's bytes posted to the transport since BEFORE, into T.
  void add_traffic(const comm::comm_traffic& before, net::step_timing& t) const {
    comm::comm_traffic now = comm->traffic();
    for (const auto& c : lanes) {
      const comm::comm_traffic l = c->traffic();
      now.sent += l.sent;
      now.received += l.received;
      now.measured = now.measured && l.measured;
    }
    if (!now.measured) return;  // a backend that cannot count: 0, never an estimate
    t.bytes_sent = now.sent - before.sent;
    t.bytes_recv = now.received - before.received;
  }

  void on_job(const net::job_spec& spec, uint64_t member_id, uint64_t generation) {
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
          io.send(net::worker_ready{member_id, generation, next_step});
          return;
        }
        tr = std::make_unique<train::trainer>(*cfg);
        if (!spec.resume_checkpoint.empty()) {
          next_step = tr->load_checkpoint(spec.resume_checkpoint);
          spdlog::info("dp group: resumed from {} at step {}", spec.resume_checkpoint, next_step);
        }
      } catch (const std::exception& e) {
        io.fatal(std::string("cannot build the job: ") + e.what());
        return;
      }
      spdlog::info("dp group: model {} with {} parameters, {} micro-batches per step",
                   cfg->model.kind, tr->model().num_params(), tr->micro_batches());
    }
    io.send(net::worker_ready{member_id, generation, next_step});
  }

  // Opens the DP communicator GROUP of generation o.generation (this worker's rank RANK of
  // o.replicas), installed for abort; CANCEL (from begin_build) ends the build early.
  // How this worker's groups reach their peers (comm.*), for group GROUP.
  comm::transport_options transport_for(const std::string& group,
                                        const std::shared_ptr<comm::build_abort>& cancel) const {
    comm::transport_options t;
    t.group = group;
    t.hostname = data_host;
    t.transport = cfg->comm.transport;
    t.hierarchy = cfg->comm.hierarchy;
    t.host_id = cfg->comm.host_id == "auto" ? "" : cfg->comm.host_id;
    t.cancel = cancel;
    return t;
  }

  void open_dp(const net::step_open& o, int rank, const std::string& group, remote_kv& kv,
               int timeout, const std::shared_ptr<comm::build_abort>& cancel) {
    comm = comm::make_communicator(cfg->comm.backend, "cpu", kv, rank, o.replicas, o.generation,
                                   timeout, transport_for(group, cancel));
    comm_generation = o.generation;
    comm_rank = rank;
    comm_size = o.replicas;
    shared->install(comm.get(), o.generation);
    spdlog::info("dp group: generation {}: group '{}' of {} over {}", o.generation, group,
                 o.replicas, comm->backend());
  }

  // Drops the old generation's links and builds this one's; a newer roster (the worker
  // actor's abort_below) ends a build that waits for a peer that is gone.
  void rebuild(const net::step_open& o, int rank) {
    drop_comm();
    const auto cancel = shared->begin_build(o.generation);
    remote_kv kv(io.kv_call, o.generation);
    const int timeout = collective_timeout_ms(cfg->fault_tolerance.timeout_ms);
    open_dp(o, rank, "dp", kv, timeout, cancel);
    // More lanes only where a bucket's time is round trips and wire, not memory copies;
    // every rank sees the same backend (rank 0's plan), so all build the same lanes.
    std::vector<comm::communicator*> all{comm.get()};
    const int extra = std::string(comm->backend()) == "shm" ? 0 : cfg->comm.lanes - 1;
    for (int l = 1; l <= extra && o.replicas > 1; ++l) {
      lanes.push_back(comm::make_communicator(cfg->comm.backend, "cpu", kv, rank, o.replicas,
                                              o.generation, timeout,
                                              transport_for("dp.l" + std::to_string(l), cancel)));
      shared->install_extra([c = lanes.back().get()] { c->abort(); });
      all.push_back(lanes.back().get());
    }
    engine = std::make_unique<comm::bucket_engine>(
        all, static_cast<std::size_t>(tr->model().num_params()),
        tr->bitwise() ? comm::grad_type::i64 : comm::grad_type::f32,
        static_cast<double>(cfg->comm.bucket_mb), 1.0f);
  }

  // Every member of the DP group takes the donor's parameters, optimizer state and step
  // counters (the whole model's, or a stage's); a member that was behind reports how long
  // that took in T.
  template <class Trainer>
  void receive_state(Trainer& x, int donor, int64_t step, net::step_timing& t) {
    const auto ts = clock_type::now();
    const bool behind = next_step != step;  // the joiner's figure is the one reported
    uint64_t bytes = 0;
    for (auto& [ptr, n] : x.state_buffers()) {
      comm->broadcast(ptr, n * sizeof(float), donor);
      bytes += n * sizeof(float);
    }
    int64_t counters[2] = {x.optimizer_steps(), step};
    comm->broadcast(counters, sizeof counters, donor);
    x.set_optimizer_steps(counters[0]);
    next_step = counters[1];
    if (behind) {
      t.state_bytes = bytes + sizeof counters;
      t.state_us = std::max<uint64_t>(1, micros(clock_type::now() - ts));
    }
  }

  // The communicators and channel of a pipeline stage for generation o.generation: the DP
  // group of its seat (p, t) across replicas, the TP group of its replica and stage, and
  // the point-to-point channel to stages p - 1 and p + 1 of its replica (endpoints through
  // the coordinator's store, keyed by the generation). Every member sets up the groups in
  // the same order, and none waits on another's later group, so the rendezvous cannot
  // deadlock.
  void rebuild_stage(const net::step_open& o, int rank) {
    drop_comm();
    const auto cancel = shared->begin_build(o.generation);
    remote_kv kv(io.kv_call, o.generation);
    const int timeout = collective_timeout_ms(cfg->fault_tolerance.timeout_ms);
    open_dp(o, rank, "dp.s" + std::to_string(o.stage) + ".t" + std::to_string(o.tp_rank), kv,
            timeout, cancel);
    const int T = cfg->parallel.tp, P = cfg->parallel.pp;
    if (T > 1) {
      tp_comm = comm::make_communicator(
          cfg->comm.backend, "cpu", kv, o.tp_rank, T, o.generation, timeout,
          transport_for("tp.r" + std::to_string(rank) + ".s" + std::to_string(o.stage), cancel));
      shared->install_extra([c = tp_comm.get()] { c->abort(); });
    }
    if (P > 1) {
      p2p = std::make_unique<comm::p2p_channel>(data_host, o.stage, o.generation, timeout);
      shared->install_extra([c = p2p.get()] { c->abort(); });
      auto key = [&](int stage) {
        return "p2p.r" + std::to_string(rank) + ".t" + std::to_string(o.tp_rank) + ".s" +
               std::to_string(stage);
      };
      const std::string& ep = p2p->endpoint();
      kv.set(key(o.stage), std::vector<char>(ep.begin(), ep.end()));
      for (int nb : {o.stage - 1, o.stage + 1}) {
        if (nb < 0 || nb >= P) continue;
        const std::vector<char> v = kv.get(key(nb), std::chrono::milliseconds(timeout));
        p2p->connect(nb, std::string(v.begin(), v.end()));
      }
    }
    train::stage_links l;
    comm::p2p_channel* ch = p2p.get();
    comm::communicator* tc = tp_comm.get();
    l.send = [ch](int peer, uint64_t tag, const void* d, std::size_t n) {
      ch->send(peer, tag, d, n);
    };
    l.recv = [ch](int peer, uint64_t tag, void* d, std::size_t n) { ch->recv(peer, tag, d, n); };
    // An injected `slow` stretches the stage's passes where they run, inside the schedule,
    // so the neighbours wait for it as they would for a slower device.
    l.after_compute = [this](clock_type::duration spent) {
      if (slow_factor > 1)
        std::this_thread::sleep_for(
            std::chrono::duration_cast<clock_type::duration>(spent * (slow_factor - 1)));
    };
    l.tp_allreduce = [tc](float* d, int64_t n) {
      tc->allreduce_sum(d, static_cast<std::size_t>(n));
    };
    l.tp_allreduce_f64 = [tc, T](double* d, int64_t n) {
      // No double allreduce in the communicator: gather every rank's values and add them in
      // rank order, so each rank gets the same bits.
      std::vector<double> all(static_cast<std::size_t>(n) * T);
      tc->allgather(d, all.data(), static_cast<std::size_t>(n) * sizeof(double));
      for (int64_t i = 0; i < n; ++i) {
        double x = 0;
        for (int r = 0; r < T; ++r) x += all[static_cast<std::size_t>(r * n + i)];
        d[i] = x;
      }
    };
    st->set_links(std::move(l));
  }

  // One step of a pipeline stage: the schedule, the DP sum of the stage's gradients, the
  // whole-model gradient norm; fills V and T for the vote.
  void run_stage_step(const net::step_open& o, int rank, net::step_vote& v, net::step_timing& t) {
    const auto t0 = clock_type::now();
    if (!st) {
      try {
        st = std::make_unique<train::stage_trainer>(*cfg, o.stage, o.tp_rank);
        if (!resume.empty()) next_step = st->load_checkpoint(resume);
      } catch (const std::exception&) {
        v.fatal = true;
        throw;
      }
      spdlog::info(
          "dp group: seated at stage {} / TP rank {}: {} parameters, {} activation "
          "bytes per micro-batch in flight ({})",
          o.stage, o.tp_rank, st->model().num_params(), st->model().activation_bytes_per_slot(),
          cfg->parallel.schedule);
    }
    if (st->stage() != o.stage || st->tp_rank() != o.tp_rank)
      throw comm::comm_error(comm::comm_failure::invalid, "step",
                             "this worker holds stage " + std::to_string(st->stage()) +
                                 " / TP rank " + std::to_string(st->tp_rank()) +
                                 ", but was seated at stage " + std::to_string(o.stage) +
                                 " / TP rank " + std::to_string(o.tp_rank));
    if (!comm || comm->dead() || (p2p && p2p->dead()) || (tp_comm && tp_comm->dead()) ||
        comm_generation != o.generation || comm_rank != rank || comm_size != o.replicas)
      rebuild_stage(o, rank);
    if (o.donor_rank >= 0) receive_state(*st, o.donor_rank, o.step, t);
    const auto t1 = clock_type::now();
    t.setup_us = micros(t1 - t0);
    if (next_step != o.step)
      throw comm::comm_error(comm::comm_failure::invalid, "step",
                             "this worker holds the state of step " + std::to_string(next_step) +
                                 ", not " + std::to_string(o.step));
    st->begin_step();
    const std::vector<int> micro =
        train::replica_micro_batches(st->micro_batches(), o.replicas, rank);
    last_micro = static_cast<int>(micro.size());
    std::optional<net::fault_order> f;
    if (fault && fault->generation == o.generation && fault->step == o.step) f.swap(fault);
    // Mid-step for the pipeline: the neighbours are already waiting for this stage.
    if (f && f->action != net::fault_action::slow) carry_out(*f);
    slow_factor = f && f->action == net::fault_action::slow ? f->factor : 1.0;
    double loss_rows = 0;
    try {
      loss_rows = st->compute_gradients(o.step, micro);
      slow_factor = 1;
    } catch (const comm::comm_error&) {
      slow_factor = 1;
      throw;
    } catch (const std::exception&) {
      slow_factor = 1;
      v.fatal = true;  // arithmetic or data trouble, not a peer: a retry would fail the same
      throw;
    }
    const auto t2 = clock_type::now();
    const auto n = static_cast<std::size_t>(st->model().num_params());
    const comm::comm_traffic before = comm->traffic();
    if (comm_size > 1) {
      if (st->bitwise())
        comm->allreduce_sum(static_cast<int64_t*>(st->reduction_buffer()), n);
      else
        comm->allreduce_sum(static_cast<float*>(st->reduction_buffer()), n);
    }
    const auto t3 = clock_type::now();
    add_traffic(before, t);
    // The DP sum runs after the schedule, so none of it is hidden behind backward (the
    // measurement says so rather than assuming it).
    if (comm_size > 1) add_overlap({{t2, t3}}, {t1, t2});
    st->finish_gradients(o.step);
    t.compute_us = micros(t2 - t1);
    t.allreduce_us = micros(t3 - t2);
    t.comm_wait_us = micros(clock_type::now() - t2);
    // The loss is the last stage's (TP rank 0 speaks for its replicas of the loss).
    if (o.stage == cfg->parallel.pp - 1 && o.tp_rank == 0) {
      v.loss_rows = loss_rows;
      for (int i : micro)
        v.rows += micro_batch_rows(i, cfg->train.micro_batch, cfg->train.global_batch);
    }
  }

  void on_open(const net::step_open& o, uint64_t member_id, int rank) {
    begin_handler();
    if (last_vote && last_vote->generation == o.generation && last_vote->step == o.step) {
      io.send(*last_vote);  // a repeat: the vote (or this open) was lost on the way
      end_handler();
      return;
    }
    if (pending && o.step == pending->step + 1) {
      // Step s+1 opens only after step s committed: its step_result was lost.
      const pending_step p = *pending;
      pending.reset();
      commit(p);
    }
    pending.reset();  // o.step == pending's step: that attempt was aborted
    net::step_vote v;
    v.member_id = member_id;
    v.generation = o.generation;
    v.step = o.step;
    net::step_timing t;
    try {
      if (!cfg) throw comm::comm_error(comm::comm_failure::invalid, "step", "no job loaded yet");
      if (rank < 0 || rank >= o.replicas)
        throw comm::comm_error(
            comm::comm_failure::invalid, "step",
            "this worker has no rank in generation " + std::to_string(o.generation));
      if (staged) {
        run_stage_step(o, rank, v, t);
        pending = pending_step{o.generation, o.step, rank, member_id};
        v.ok = true;
      } else {
        const auto t0 = clock_type::now();
        if (!comm || comm->dead() || comm_generation != o.generation || comm_rank != rank ||
            comm_size != o.replicas) {
          rebuild(o, rank);
        }
        if (o.donor_rank >= 0) receive_state(*tr, o.donor_rank, o.step, t);
        const auto t1 = clock_type::now();
        t.setup_us = micros(t1 - t0);
        if (next_step != o.step)
          throw comm::comm_error(comm::comm_failure::invalid, "step",
                                 "this worker holds the state of step " +
                                     std::to_string(next_step) + ", not " + std::to_string(o.step));
        tr->begin_step();
        const comm::comm_traffic before = comm->traffic();
        void* buf = tr->reduction_buffer();
        if (tr->bitwise())
          engine->begin(static_cast<int64_t*>(buf));
        else
          engine->begin(static_cast<float*>(buf));
        const std::vector<int> micro =
            train::replica_micro_batches(tr->micro_batches(), o.replicas, rank);
        double loss_rows = 0;
        // Backward is over when it hands over its last gradients: after that the compute
        // thread only returns (and may not even be scheduled while the buckets go out).
        clock_type::time_point t_backward_end = t1;
        try {
          const bool abort_here = !inject.done && inject.step == o.step && inject.rank == rank;
          std::optional<net::fault_order> f;
          if (fault && fault->generation == o.generation && fault->step == o.step) f.swap(fault);
          const bool mid_step = f && f->action != net::fault_action::slow;
          loss_rows = tr->compute_gradients(
              o.step, micro, [&, this, abort_here](std::size_t off, std::size_t n) {
                t_backward_end = clock_type::now();  // these gradients are final now
                engine->mark_ready(off, n);
                if (abort_here && !inject.done) {
                  inject.done = true;
                  engine->abort();
                }
                if (mid_step && f) {  // once: after the first gradients went out
                  const net::fault_order now = *f;
                  f.reset();
                  carry_out(now);
                }
              });
          if (f && f->action == net::fault_action::slow && f->factor > 1) {
            // Injected slowness: this step's compute takes `factor` times as long.
            const auto spent = clock_type::now() - t1;
            std::this_thread::sleep_for(
                std::chrono::duration_cast<clock_type::duration>(spent * (f->factor - 1)));
          }
        } catch (const comm::comm_error&) {
          throw;
        } catch (const std::exception& e) {
          engine->abort();  // peers must not wait for buckets that will never come
          v.fatal = true;
          throw;
        }
        const auto t2 = clock_type::now();
        const comm::bucket_timing bt = engine->wait_all();
        const auto t3 = clock_type::now();
        t.compute_us = micros(t2 - t1);
        t.comm_wait_us = micros(t3 - t2);
        t.allreduce_us = static_cast<uint64_t>(bt.allreduce_s * 1e6);
        add_traffic(before, t);
        // Backward's window: from the start of compute_gradients to the last range handed
        // over. Its earlier forwards add nothing to the intersection: no bucket goes out
        // before the last micro-batch's backward marks its first range ready.
        if (comm_size > 1) add_overlap(bt.collectives, {t1, t_backward_end});
        v.ok = true;
        v.loss_rows = loss_rows;
        for (int i : micro)
          v.rows += micro_batch_rows(i, cfg->train.micro_batch, cfg->train.global_batch);
        pending = pending_step{o.generation, o.step, rank, member_id};
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
      drop_comm();
    }
    v.timing = t;
    add(total, t);
    last_vote = v;
    io.send(v);
    end_handler();
  }

  static void add(net::step_timing& a, const net::step_timing& b) {
    a.compute_us += b.compute_us;
    a.comm_wait_us += b.comm_wait_us;
    a.allreduce_us += b.allreduce_us;
    a.setup_us += b.setup_us;
    a.bytes_sent += b.bytes_sent;
    a.bytes_recv += b.bytes_recv;
  }

  // Rank 0 writes the same checkpoints `cohort train` writes (so either can resume them):
  // the state is copied now and written in the background; the last one is waited for.
  std::string checkpoint(int64_t step) {
    if (!writer)
      writer = std::make_unique<train::checkpoint_writer>(
          expand_user(cfg->fault_tolerance.checkpoint_dir), cfg->fault_tolerance.keep);
    if (staged) {
      // One shard per seat, written by replica 0's member; the last one in completes it.
      std::vector<std::pair<int, int>> all;
      for (int s = 0; s < cfg->parallel.pp; ++s)
        for (int r = 0; r < cfg->parallel.tp; ++r) all.emplace_back(s, r);
      shard_snapshot snap = st->snapshot(step);
      snap.meta.extra["checkpoint.job"] = std::to_string(job_id);
      writer->save_part(std::move(snap), all);
    } else {
      writer->save(*tr, step);
    }
    return step == cfg->train.steps ? writer->wait() : std::string();
  }

  void on_result(const net::step_result& r) {
    begin_handler();
    if (!pending || pending->generation != r.generation || pending->step != r.step) {
      // The last step's commit again: the report was lost on the way.
      if (last_report && r.commit && r.step + 1 == last_report->next_step) io.send(*last_report);
      end_handler();
      return;
    }
    const pending_step p = *pending;
    pending.reset();
    if (!r.commit) {
      end_handler();
      return;  // gradients are dropped: begin_step clears them before the retry
    }
    commit(p);
    end_handler();
  }

  // Applies the step P voted for (the coordinator committed it), then checkpoints,
  // evaluates and reports as the step number says.
  void commit(const pending_step& p) {
    const auto t0 = clock_type::now();
    try {
      if (staged)
        st->apply_step(p.step);
      else
        tr->apply_step(p.step);
    } catch (const std::exception& e) {
      io.fatal(std::string("applying step ") + std::to_string(p.step) + ": " + e.what());
      return;
    }
    next_step = p.step + 1;
    ++steps_computed;
    const int64_t every = cfg->fault_tolerance.checkpoint_every;
    std::string ckpt;
    try {
      if (p.rank == 0 && (next_step == cfg->train.steps || (every > 0 && next_step % every == 0)))
        ckpt = checkpoint(next_step);
    } catch (const std::exception& e) {
      spdlog::error("dp group: checkpoint at step {} failed: {}", next_step, e.what());
    }
    total.compute_us += micros(clock_type::now() - t0);
    const int64_t eval_every = cfg->train.eval_every;
    if (staged && p.rank == 0 && eval_every > 0 && next_step % eval_every == 0 &&
        next_step < cfg->train.steps) {
      // Every stage of replica 0 runs the held-out split through the pipeline together.
      try {
        const train::evaluation e = st->evaluate(next_step);
        if (e.count > 0 && st->tp_rank() == 0)
          std::fprintf(stderr, "\neval at step %lld: loss %.4f, accuracy %.4f\n",
                       static_cast<long long>(next_step), e.loss, e.accuracy);
      } catch (const std::exception& e) {
        spdlog::warn("dp group: evaluation at step {} failed: {}", next_step, e.what());
      }
    } else if (p.rank == 0 && eval_every > 0 && next_step % eval_every == 0 &&
               next_step < cfg->train.steps) {
      // Like `cohort train`: a held-out evaluation now and then, by one replica (all hold
      // the same parameters); the others wait for it at the next step.
      const train::evaluation e = tr->evaluate();
      std::fprintf(stderr, "\neval at step %lld: loss %.4f, accuracy %.4f\n",
                   static_cast<long long>(next_step), e.loss, e.accuracy);
    }
    if (next_step == cfg->train.steps) report(p, ckpt);
  }

  void report(const pending_step& p, const std::string& ckpt) {
    net::train_report rep;
    rep.member_id = p.member_id;
    rep.generation = p.generation;
    rep.next_step = next_step;
    if (staged) {
      const auto digests = st->param_digests();
      rep.params_sha256 = train::combine_param_digests(digests);
      rep.param_digests = train::format_param_digests(digests);
      if (p.rank == 0) {
        try {
          const train::evaluation e = st->evaluate(next_step + 1);
          if (e.count > 0 && st->tp_rank() == 0) {
            rep.has_eval = true;
            rep.eval_loss = e.loss;
            rep.eval_accuracy = e.accuracy;
            rep.eval_count = e.count;
          }
        } catch (const std::exception& e) {
          spdlog::warn("dp group: final evaluation failed: {}", e.what());
        }
      }
      net::stage_stats& s = rep.stage;
      const train::stage_timing& tm = st->timing();
      s.stage = st->stage();
      s.tp_rank = st->tp_rank();
      s.replica = p.rank;
      s.schedule_us = tm.schedule_us;
      s.compute_us = tm.compute_us;
      s.forward_us = tm.forward_us;
      s.forwards = tm.forwards;
      s.wait_us = tm.wait_us;
      s.p2p_bytes = tm.p2p_bytes;
      s.tp_us = tm.tp_us;
      s.activation_bytes = st->activation_bytes();
      s.peak_held = st->peak_held();
      s.micro_batches = last_micro;
    } else {
      rep.params_sha256 = tr->params_sha256();
    }
    if (!staged && p.rank == 0) {
      const train::evaluation e = tr->evaluate();
      rep.has_eval = true;
      rep.eval_loss = e.loss;
      rep.eval_accuracy = e.accuracy;
      rep.eval_count = e.count;
    }
    rep.steps_computed = steps_computed;
    // Measured from the collectives' and backward's timestamps; 0 when no collective ran.
    rep.overlap = collective_s > 0 ? hidden_s / collective_s : 0.0;
    rep.peak_pool_bytes = staged ? st->peak_pool_bytes() : tr->peak_pool_bytes();
    rep.checkpoint = ckpt;
    rep.num_params = staged ? st->model_params() : tr->model().num_params();
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
  // The state dies with the behavior (the actor's end), aborting any communicator first.
  (void)self;
  return {
      [g](co_job_atom, const net::job_spec& spec, uint64_t member_id, uint64_t generation) {
        g->on_job(spec, member_id, generation);
      },
      [g](co_open_atom, const net::step_open& o, uint64_t member_id, int32_t rank) {
        g->on_open(o, member_id, rank);
      },
      [g](co_res_atom, const net::step_result& r) { g->on_result(r); },
      [g](co_fault_atom, const net::fault_order& f) { g->fault = f; },
  };
}

}  // namespace cohort::actors
