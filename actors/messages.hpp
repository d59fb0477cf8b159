// The CAF side of the control-plane vocabulary: atoms the actors match on and the
// permission to carry protocol structs in local mailboxes. Wire structs themselves live in
// runtime/net/protocol.hpp; nothing here crosses a process boundary through CAF.
#pragma once
#include <caf/all.hpp>
#include <cstdint>
#include <vector>

#include "runtime/net/protocol.hpp"
#include "runtime/net/sender.hpp"

namespace cohort::actors {

// Atoms are <= 10 characters and prefixed `co_` so they never collide with CAF's own.
/// Inbound frame: (peer, message) to a worker, (net::sender, message) to the coordinator.
using co_in_atom = caf::atom_constant<caf::atom("co_in")>;
using co_tick_atom = caf::atom_constant<caf::atom("co_tick")>;      ///< coordinator timer
using co_joins_atom = caf::atom_constant<caf::atom("co_joins")>;    ///< coordinator: join window
using co_stop_atom = caf::atom_constant<caf::atom("co_stop")>;      ///< stop (local request)
/// stop with a checkpoint (local request: SIGTERM under fault_tolerance.on_sigterm: checkpoint)
using co_ckstop_atom = caf::atom_constant<caf::atom("co_ckstop")>;
using co_status_atom = caf::atom_constant<caf::atom("co_status")>;  ///< status (local request)
using co_bench_atom = caf::atom_constant<caf::atom("co_bench")>;    ///< ping-pong benchmark
using co_start_atom = caf::atom_constant<caf::atom("co_start")>;    ///< worker: begin registering
using co_leave_atom = caf::atom_constant<caf::atom("co_leave")>;    ///< worker: leave and exit
using co_lost_atom = caf::atom_constant<caf::atom("co_lost")>;      ///< worker: coordinator gone
using co_regto_atom = caf::atom_constant<caf::atom("co_regto")>;    ///< worker: register timeout
using co_retry_atom = caf::atom_constant<caf::atom("co_retry")>;    ///< worker: spare asks again
using co_dleft_atom = caf::atom_constant<caf::atom("co_dleft")>;    ///< worker: drain took too long
using co_version_atom = caf::atom_constant<caf::atom("co_version")>;  ///< worker: other protocol

/// Round-trip times of one benchmark run, nanoseconds, in send order.
struct bench_result {
  std::vector<uint64_t> rtt_ns;
};

}  // namespace cohort::actors

// Protocol structs travel between local actors only (the wire uses codec.hpp), so CAF never
// needs to serialize them: whitelisting is enough.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(cohort::net::message)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(cohort::net::sender)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(cohort::net::status_reply)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(cohort::actors::bench_result)
