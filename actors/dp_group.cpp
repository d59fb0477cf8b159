// The allreduce_group actor: the thread and mailbox around one replica's step
// (runtime/step/replica_step.hpp), which holds the step's logic. This file only wires the
// step to the worker process: the coordinator's connection, the rendezvous store, the real
// seats, the data plane's address, the clock and the fault hooks.
#include "actors/dp_group.hpp"

#include "runtime/core/config.hpp"
#include "runtime/net/host_address.hpp"
#include "runtime/step/remote_kv.hpp"
#include "runtime/step/replica_step.hpp"
#include "runtime/train/seat.hpp"

namespace cohort::actors {

caf::behavior dp_group_actor(caf::event_based_actor* self, dp_group_io io,
                             std::shared_ptr<dp_group_shared> shared) {
  step::replica_io r;
  r.send = io.send;
  r.fatal = io.fatal;
  r.clock = io.clock;
  r.faults = step::fault_hooks{io.mute_heartbeats, io.cut_off};
  r.now = [] { return std::chrono::steady_clock::now(); };
  r.make_seat = [](const config& c, bool staged, int stage, int tp_rank) {
    return staged ? train::make_stage_seat(c, stage, tp_rank) : train::make_whole_seat(c);
  };
  r.data_host = [host = io.data_host](const config& c) {
    return c.comm.interface == "auto" ? host : net::resolve_interface(c.comm.interface);
  };
  r.build_links = [kv_call = io.kv_call, keys = io.keys, shared](step::dp_links& l,
                                                                 const step::link_request& q) {
    step::remote_kv kv(kv_call, q.open.generation);
    const std::string member = "member " + std::to_string(q.member_id) + " (" + q.data_host + ")";
    step::build_links(l, step::link_context{q.cfg, q.data_host, kv, *shared, keys, member}, q.open,
                      q.rank, q.seat, q.staged);
  };
  r.continue_window = [self](const net::step_open& o, uint64_t member, int rank) {
    self->send(self, co_next_atom::value, o, member, static_cast<int32_t>(rank));
  };
  // The step dies with the behavior (the actor's end), aborting any communicator first.
  auto g = std::make_shared<step::replica_step>(std::move(r), std::move(shared));
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
