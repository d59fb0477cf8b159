#include "runtime/step/dp_links.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>

#include "gpu/nccl_comm.hpp"
#include "runtime/comm/buckets.hpp"
#include "runtime/comm/build_abort.hpp"
#include "runtime/comm/factory.hpp"
#include "runtime/comm/group_devices.hpp"
#include "runtime/comm/p2p.hpp"
#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/net/kv_store.hpp"
#include "runtime/step/remote_kv.hpp"
#include "runtime/train/seat.hpp"

namespace cohort::step {

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
  if (c != nullptr && generation < floor_) c->interrupt();
}

void dp_group_shared::install_extra(std::function<void()> abort,
                                    std::function<void()> interrupt) {
  std::lock_guard<std::mutex> lock(mu_);
  if (generation_ < floor_) (interrupt ? interrupt : abort)();
  extra_.push_back(extra{std::move(abort), std::move(interrupt)});
}

void dp_group_shared::abort_locked(const std::string& why, bool interrupt) {
  if (build_) build_->abort(why);
  if (comm_ != nullptr) {
    if (interrupt)
      comm_->interrupt();
    else
      comm_->abort();
  }
  for (auto& f : extra_) (interrupt && f.interrupt ? f.interrupt : f.abort)();
}

void dp_group_shared::abort_below(uint64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  floor_ = std::max(floor_, generation);
  if (generation_ < generation)
    abort_locked("generation " + std::to_string(generation_) + " is over (the roster is at " +
                     std::to_string(generation) + ")",
                 true);
}

bool dp_group_shared::take_rejoined() {
  std::lock_guard<std::mutex> lock(mu_);
  const bool r = rejoined_;
  rejoined_ = false;
  return r;
}

void dp_group_shared::abort_all() {
  std::lock_guard<std::mutex> lock(mu_);
  rejoined_ = true;
  floor_ = std::max(floor_, generation_ + 1);
  abort_locked("generation " + std::to_string(generation_) + " is over (this worker rejoins)",
               false);
}

void dp_group_shared::shut() {
  std::lock_guard<std::mutex> lock(mu_);
  floor_ = std::numeric_limits<uint64_t>::max();
  abort_locked("the worker is exiting", false);
}

std::string link_device(comm_backend backend, const std::string& seat_device) {
  // The trainer stages a GPU's buckets through host memory for every backend but NCCL.
  return backend == comm_backend::nccl ? seat_device : "cpu";
}

int collective_timeout_ms(int fault_timeout_ms) {
  // 20 detection timeouts, at least 10 s, and never past what the rendezvous store accepts
  // (a longer wait is refused there, and every build of the group would fail).
  const int64_t ms = std::max<int64_t>(10000, 20 * int64_t{fault_timeout_ms});
  return static_cast<int>(std::min<int64_t>(ms, net::kv::longest_wait.count()));
}

dp_links::dp_links() = default;
dp_links::~dp_links() = default;

bool dp_links::current(const net::step_open& o, int r) const {
  return comm && !comm->dead() && !(p2p && p2p->dead()) && !(tp_comm && tp_comm->dead()) &&
         !(params && params->dead()) && !(experts && experts->dead()) &&
         generation == o.generation && rank == r && size == o.replicas;
}

namespace {

std::mutex stuck_mu;
std::function<void(const std::string&)> stuck_handler;

// The default: a thread stuck in NCCL holds the device, so nothing in this process can be
// trusted with it again; leave now, as a dead member, before anything waits on that thread.
[[noreturn]] void leave_as_dead(const std::string& text) {
  spdlog::critical("{}: exiting with status {} so that the group goes on without this worker",
                   text, static_cast<int>(exit_device_stuck));
  spdlog::default_logger()->flush();
  std::fflush(nullptr);
  std::_Exit(exit_device_stuck);
}

}  // namespace

void set_stuck_handler(std::function<void(const std::string& text)> handler) {
  std::lock_guard<std::mutex> l(stuck_mu);
  stuck_handler = std::move(handler);
}

std::vector<std::string> dp_links::stuck() const {
  std::vector<std::string> out;
  auto check = [&](const comm::communicator* c, const std::string& name) {
    if (c != nullptr && c->stuck()) out.push_back(name + " (" + c->backend() + ")");
  };
  check(comm.get(), "the DP group");
  for (std::size_t k = 0; k < lanes.size(); ++k)
    check(lanes[k].get(), "the DP group's lane " + std::to_string(k + 1));
  check(tp_comm.get(), "the TP group");
  check(params.get(), "the sharded parameters' group");
  check(experts.get(), "the EP group");
  return out;
}

void dp_links::drop(dp_group_shared& shared) {
  // An NCCL DP group a newer generation interrupted (dead, yet still shrinkable) is kept for
  // a shrink; the links are of one group only if all of them can be. A group dropped for a
  // failure of this worker's own (not interrupted) is aborted, so that its peers' calls fail.
  const auto kept = [](const std::unique_ptr<comm::communicator>& c) {
    return c->dead() && c->can_shrink();
  };
  bool keep = comm && kept(comm) && (!params || kept(params));
  for (auto& c : lanes) keep = keep && kept(c);
  auto end = [keep](comm::communicator& c) {
    if (keep)
      c.interrupt();
    else
      c.abort();
  };
  if (comm) end(*comm);
  for (auto& c : lanes) end(*c);
  if (params) end(*params);
  if (tp_comm) tp_comm->abort();
  if (p2p) p2p->abort();
  if (experts) experts->abort();
  // An abort that did not return (it may have been the worker actor's, at the roster's
  // news): this worker cannot build again.
  if (const std::vector<std::string> s = stuck(); !s.empty()) {
    std::string text = "generation " + std::to_string(generation) + ": the abort of ";
    for (std::size_t i = 0; i < s.size(); ++i) text += (i ? ", " : "") + s[i];
    text += " did not return by its deadline (NCCL's ncclCommAbort can hang: NVIDIA/nccl "
            "issues 549, 1013, 1317, 1777); a thread is left inside the library holding the "
            "device";
    std::function<void(const std::string&)> h;
    {
      std::lock_guard<std::mutex> l(stuck_mu);
      h = stuck_handler;
    }
    if (h)
      h(text);
    else
      leave_as_dead(text);
  }
  engine.reset();  // joins the communication threads (prompt after abort or interrupt)
  shared.install(nullptr, 0);
  // Links dropped before (a failed step) left their prior already: it stays for the build.
  if (comm) prior = comm::prior_group{};
  if (keep) {
    prior.generation = generation;
    prior.rank = rank;
    prior.size = size;
    prior.comms.push_back(std::move(comm));
    for (auto& c : lanes) prior.comms.push_back(std::move(c));
    if (params) prior.comms.push_back(std::move(params));
  }
  comm.reset();
  lanes.clear();
  tp_comm.reset();
  p2p.reset();
  params.reset();
  experts.reset();
  generation = 0;
}

comm::comm_traffic dp_links::traffic() const {
  comm::comm_traffic t = comm->traffic();
  std::vector<const comm::communicator*> more;
  for (const auto& c : lanes) more.push_back(c.get());
  if (params) more.push_back(params.get());
  for (const comm::communicator* c : more) {
    const comm::comm_traffic l = c->traffic();
    t.sent += l.sent;
    t.received += l.received;
    t.measured = t.measured && l.measured;
  }
  return t;
}

namespace {

// How this worker's groups reach their peers (comm.*), for group GROUP.
comm::transport_options transport_for(const link_context& ctx, const std::string& group,
                                      const std::shared_ptr<comm::build_abort>& cancel) {
  comm::transport_options t;
  t.group = group;
  t.hostname = ctx.data_host;
  t.transport = ctx.cfg.comm.transport;
  t.hierarchy = ctx.cfg.comm.hierarchy;
  t.host_id = ctx.cfg.comm.host_id == "auto" ? "" : ctx.cfg.comm.host_id;
  t.cancel = cancel;
  return t;
}

// A stage's TP group and point-to-point channel, handed to the seat. The neighbours'
// endpoints go through the coordinator's store, keyed by the generation.
void build_stage_links(dp_links& l, const link_context& ctx, const net::step_open& o, int rank,
                       train::seat& seat, int timeout,
                       const std::shared_ptr<comm::build_abort>& cancel) {
  const config& cfg = ctx.cfg;
  const int T = cfg.parallel.tp, P = cfg.parallel.pp;
  // The TP group sums the stage's device memory over NCCL; host memory (staged by the
  // stage) over every other backend.
  const std::string tp_device = link_device(cfg.comm.backend, seat.device_name());
  if (T > 1) {
    comm::transport_options tp = transport_for(
        ctx, "tp.r" + std::to_string(rank) + ".s" + std::to_string(o.stage), cancel);
    tp.member = comm::group_member{ctx.member, seat.device_name()};
    l.tp_comm = comm::make_communicator(cfg.comm.backend, tp_device, ctx.kv, o.tp_rank, T,
                                        o.generation, timeout, tp);
    ctx.shared.install_extra([c = l.tp_comm.get()] { c->abort(); });
  }
  if (P > 1) {
    // The largest tensor a neighbour sends is one micro-batch's activation or its gradient,
    // [micro_batch * context, d_model] floats; at most every micro-batch of a step (both
    // kinds) can arrive before the schedule asks for it.
    comm::p2p_limits lim;
    lim.max_message_bytes = static_cast<std::size_t>(cfg.train.micro_batch) *
                            static_cast<std::size_t>(cfg.model.context) *
                            static_cast<std::size_t>(cfg.model.d_model) * sizeof(float);
    const std::size_t micro = static_cast<std::size_t>(
        (cfg.train.global_batch + cfg.train.micro_batch - 1) / cfg.train.micro_batch);
    lim.max_stash_frames = 4 * micro + 64;
    lim.max_stash_bytes = lim.max_stash_frames * lim.max_message_bytes;
    l.p2p = std::make_unique<comm::p2p_channel>(ctx.data_host, o.stage, o.generation, timeout,
                                                lim, ctx.keys.get(),
                                                comm::parse_p2p_security(cfg.comm.p2p_security));
    ctx.shared.install_extra([c = l.p2p.get()] { c->abort(); });
    auto key = [&](int stage) {
      return "p2p.r" + std::to_string(rank) + ".t" + std::to_string(o.tp_rank) + ".s" +
             std::to_string(stage);
    };
    const std::string& ep = l.p2p->endpoint();
    ctx.kv.set(key(o.stage), std::vector<char>(ep.begin(), ep.end()));
    for (int nb : {o.stage - 1, o.stage + 1}) {
      if (nb < 0 || nb >= P) continue;
      const std::vector<char> v = ctx.kv.get(key(nb), std::chrono::milliseconds(timeout));
      l.p2p->connect(nb, std::string(v.begin(), v.end()));
    }
  }
  train::stage_links s;
  comm::p2p_channel* ch = l.p2p.get();
  comm::communicator* tc = l.tp_comm.get();
  s.send = [ch](int peer, uint64_t tag, const void* d, std::size_t n) {
    ch->send(peer, tag, d, n);
  };
  s.recv = [ch](int peer, uint64_t tag, void* d, std::size_t n) { ch->recv(peer, tag, d, n); };
  s.tp_allreduce = [tc](float* d, int64_t n) { tc->allreduce_sum(d, static_cast<std::size_t>(n)); };
  s.tp_reads_device = tp_device != "cpu";
  s.tp_allreduce_f64 = [tc](double* d, int64_t n) {
    comm::allreduce_sum_rank_order(*tc, d, static_cast<std::size_t>(n));
  };
  seat.set_links(std::move(s));
}

}  // namespace

double bucket_mb_for(const config& cfg, train::seat& seat) {
  double mb = static_cast<double>(cfg.comm.bucket_mb);
  // Sharded gradients give a bucket's pages back once it is summed: buckets of at most an
  // eighth of the buffer, so that most of it can go back while backward still runs (a
  // model smaller than 8 buckets would otherwise hold its whole buffer to the end).
  if (cfg.train.zero >= 2 && cfg.train.zero_release && cfg.parallel.pp * cfg.parallel.tp == 1) {
    const double width = seat.reduction_type() == comm::grad_type::i64 ? 8.0 : 4.0;
    const double eighth = static_cast<double>(seat.elements()) * width / 8.0 / (1 << 20);
    if (eighth > 0) mb = std::min(mb, eighth);
  }
  return mb;
}

void build_links(dp_links& l, const link_context& ctx, const net::step_open& o, int rank,
                 train::seat& seat, bool staged) {
  l.drop(ctx.shared);
  const auto cancel = ctx.shared.begin_build(o.generation);
  const config& cfg = ctx.cfg;
  const int timeout = collective_timeout_ms(cfg.fault_tolerance.timeout_ms);
  const std::string group =
      staged ? "dp.s" + std::to_string(o.stage) + ".t" + std::to_string(o.tp_rank) : "dp";
  const std::string device = link_device(cfg.comm.backend, seat.device_name());
  // The group's members introduce themselves first: one on another kind of device ends the
  // build on every member with the same usage_error.
  comm::transport_options dp_transport = transport_for(ctx, group, cancel);
  dp_transport.member = comm::group_member{ctx.member, seat.device_name()};
  comm::prior_group prior = std::move(l.prior);
  l.prior = comm::prior_group{};
  // Declared dead since (abort_all): this worker comes back as a new member, whatever it held.
  if (ctx.shared.take_rejoined()) prior.comms.clear();
  l.regroup_path = 0;
  l.regroup_us = 0;
  const bool sharded_params = cfg.train.zero >= 3 && !staged && o.replicas > 1;
  if (comm::resolve_backend(cfg.comm.backend, device) == comm_backend::nccl) {
    // NCCL: the survivors of a departure shrink the communicators they hold; anyone else, or
    // everyone after a failed shrink, builds new ones (runtime/comm/regroup.hpp). The device
    // check comes first, as in make_communicator.
    comm::check_group_devices(ctx.kv, o.generation, group, rank, o.replicas, dp_transport.member,
                              std::chrono::milliseconds(timeout));
    const int extra = o.replicas > 1 ? cfg.comm.lanes - 1 : 0;
    const std::size_t count = 1 + static_cast<std::size_t>(extra) + (sharded_params ? 1 : 0);
    const auto name_of = [&](std::size_t k) {
      if (k == 0) return group;
      if (k <= static_cast<std::size_t>(extra)) return group + ".l" + std::to_string(k);
      return group + ".p";
    };
    comm::regroup_result r = comm::regroup(
        ctx.kv, o.generation, group, rank, o.replicas, std::move(prior), count,
        gpu::nccl_version(), timeout, std::chrono::milliseconds(timeout), net::kv::longest_wait,
        [&](std::size_t k, const std::string& tag) {
          return comm::make_communicator(
              cfg.comm.backend, device, ctx.kv, rank, o.replicas, o.generation, timeout,
              transport_for(ctx, name_of(k) + (tag.empty() ? "" : "." + tag), cancel));
        });
    l.comm = std::move(r.comms[0]);
    for (int k = 1; k <= extra; ++k) l.lanes.push_back(std::move(r.comms[k]));
    if (sharded_params) l.params = std::move(r.comms.back());
    l.regroup_path = r.path == comm::nccl_rebuild_path::shrink ? 2 : r.fell_back ? 3 : 1;
    l.regroup_us = std::max<uint64_t>(1, static_cast<uint64_t>(r.ms * 1e3));
    spdlog::info("dp group: generation {}: {} communicator(s) of group '{}' by {} in {:.1f} ms: {}",
                 o.generation, count, group,
                 r.path == comm::nccl_rebuild_path::shrink ? "shrink" : "new init", r.ms,
                 r.reason);
  } else {
    prior.comms.clear();
    l.comm = comm::make_communicator(cfg.comm.backend, device, ctx.kv, rank, o.replicas,
                                     o.generation, timeout, dp_transport);
    // More lanes only where a bucket's time is round trips and wire, not memory copies;
    // every rank sees the same backend (rank 0's plan), so all build the same lanes.
    const int extra = l.comm->memory_bound() ? 0 : cfg.comm.lanes - 1;
    for (int k = 1; k <= extra && o.replicas > 1; ++k)
      l.lanes.push_back(comm::make_communicator(
          cfg.comm.backend, device, ctx.kv, rank, o.replicas, o.generation, timeout,
          transport_for(ctx, group + ".l" + std::to_string(k), cancel)));
    if (sharded_params)
      l.params = comm::make_communicator(cfg.comm.backend, device, ctx.kv, rank, o.replicas,
                                         o.generation, timeout,
                                         transport_for(ctx, group + ".p", cancel));
  }
  l.generation = o.generation;
  l.rank = rank;
  l.size = o.replicas;
  ctx.shared.install(l.comm.get(), o.generation);
  spdlog::info("dp group: generation {}: group '{}' of {} over {}", o.generation, group,
               o.replicas, l.comm->backend());
  std::vector<comm::communicator*> all{l.comm.get()};
  for (auto& c : l.lanes) {
    ctx.shared.install_extra([p = c.get()] { p->abort(); }, [p = c.get()] { p->interrupt(); });
    all.push_back(c.get());
  }
  if (l.params)
    ctx.shared.install_extra([p = l.params.get()] { p->abort(); },
                             [p = l.params.get()] { p->interrupt(); });
  // Expert parallelism: this worker's EP group (its own communicator, used by the compute
  // thread while the engine sums on the lanes).
  if (const expert_place ep = expert_group(cfg.parallel.ep, o.replicas, rank); ep.size > 1 && !staged) {
    l.experts = comm::make_communicator(
        cfg.comm.backend, device, ctx.kv, ep.rank, ep.size, o.generation, timeout,
        transport_for(ctx, group + ".e" + std::to_string(ep.group), cancel));
    ctx.shared.install_extra([c = l.experts.get()] { c->abort(); });
  }
  if (staged) build_stage_links(l, ctx, o, rank, seat, timeout, cancel);
  l.engine = std::make_unique<comm::bucket_engine>(all, seat.elements(), seat.reduction_type(),
                                                   bucket_mb_for(cfg, seat), 1.0f);
}

}  // namespace cohort::step
