// The config schema's rows for the run's machinery: fault_tolerance, elastic, control, ha
// and the top-level faults list (config.cpp has the others and the table's order).
#include <string>
#include <vector>

#include "runtime/core/config_bounds.hpp"
#include "runtime/core/config_schema.hpp"

namespace cohort::config_schema {

std::vector<key_spec> runtime_keys() {
  return {
      {"fault_tolerance",
       "heartbeat_ms",
       COHORT_FIELD(fault_tolerance.heartbeat_ms),
       at_least(1),
       {},
       nullptr,
       "Interval of worker heartbeats."},
      {"fault_tolerance",
       "timeout_ms",
       COHORT_FIELD(fault_tolerance.timeout_ms),
       from_to(1, 3600000),
       {},
       nullptr,
       "A worker silent this long is declared dead; must exceed heartbeat_ms. At most one "
       "hour."},
      {"fault_tolerance",
       "join_window_ms",
       COHORT_FIELD(fault_tolerance.join_window_ms),
       from_to(0, 300),
       {},
       nullptr,
       "Registrations that arrive within this long of each other enter the roster together, "
       "as one generation: a job's workers starting at once form in a few generations, not "
       "one per worker. The window closes after this long without a registration, or 30x "
       "this long after it opened; a joiner waits for its answer meanwhile, so at most 300 "
       "(30 windows stay within a worker's --coordinator-timeout-ms, 10 s). It closes at once "
       "when nobody else could enter with it: the roster is full (elastic.max_workers), or a "
       "scale has the workers it asked for. 0: one generation per registration."},
      {"fault_tolerance",
       "commit_window",
       COHORT_FIELD(fault_tolerance.commit_window),
       at_least(0),
       {},
       nullptr,
       "Steps the workers of a data-parallel job (pp = tp = 1) run and commit among "
       "themselves, the vote travelling with the gradients, before the coordinator opens the "
       "next: no round trip per step. A failure still aborts at once; a joiner, a drain or a "
       "fault waits for the window's end (the coordinator ends windows before a fault's "
       "step). 0: the coordinator commits every step."},
      {"fault_tolerance",
       "checkpoint_every",
       COHORT_FIELD(fault_tolerance.checkpoint_every),
       at_least(0),
       {},
       nullptr,
       "Checkpoint every this many steps; 0: only at the end."},
      {"fault_tolerance",
       "memory_every",
       COHORT_FIELD(fault_tolerance.memory_every),
       at_least(0),
       {},
       nullptr,
       "Bitwise jobs with error-feedback memory (onebit_adam, or comm.compression with "
       "comm.error_feedback): every this many steps each data-parallel worker keeps a "
       "rollback point in memory, its own state and error memory and a copy of its "
       "predecessor's error memory, sent at that step's start. A worker lost with memory only "
       "it had rolls the group back to the point without a checkpoint on disk (the newer of "
       "the point and the last checkpoint is taken); at the same group size the run still "
       "ends on the uninterrupted run's bits (at another, the memory is regrouped). Costs per worker two points' memory (each a copy of the state and two "
       "error memories: 7 floats a parameter with onebit_adam), and each rank's memory "
       "broadcast to the group once per point (docs/compression.md). 0: off."},
      {"fault_tolerance",
       "checkpoint_dir",
       COHORT_FIELD(fault_tolerance.checkpoint_dir),
       unbounded(),
       {},
       nullptr,
       "Directory of checkpoints; ~ is expanded."},
      {"fault_tolerance",
       "on_sigterm",
       COHORT_FIELD(fault_tolerance.on_sigterm),
       unbounded(),
       {"drain", "checkpoint"},
       nullptr,
       "What SIGTERM to a training worker, to the coordinator, to `cohort launch` or to "
       "`cohort train` does. drain: the worker leaves at the next step boundary and the "
       "others go on; the coordinator or launch stops the run; train dies. checkpoint "
       "(preemption, a time limit: docs/slurm.md): the whole run stops at the next step "
       "boundary it can reach with a complete checkpoint of that step and exits 3 (`cohort "
       "ctl stop --checkpoint` does the same); `--resume` goes on from it. A SIGTERM 2 s or "
       "more after the first stops at once (sooner: the same signal from another sender)."},
      {"fault_tolerance",
       "keep",
       COHORT_FIELD(fault_tolerance.keep),
       at_least(1),
       {},
       nullptr,
       "Newest checkpoints kept; older ones are deleted."},
      {"elastic",
       "min_workers",
       COHORT_FIELD(elastic.min_workers),
       at_least(0),
       {},
       "cluster.workers",
       "Below this many workers training pauses and waits for joiners (up to "
       "pause_timeout_ms). 0 or absent: cluster.workers. At most cluster.workers."},
      {"elastic",
       "max_workers",
       COHORT_FIELD(elastic.max_workers),
       at_least(0),
       {},
       "cluster.workers",
       "Joiners beyond this many workers wait as spares. 0 or absent: cluster.workers. At "
       "least cluster.workers."},
      {"elastic",
       "respawn",
       COHORT_FIELD(elastic.respawn),
       unbounded(),
       {},
       nullptr,
       "true: the launcher restarts a local worker that dies, and it rejoins as a joiner. "
       "false: a dead worker stays gone."},
      {"elastic",
       "spares",
       COHORT_FIELD(elastic.spares),
       at_least(0),
       {},
       nullptr,
       "Workers `cohort launch` starts beyond cluster.workers. The world being full "
       "(elastic.max_workers = cluster.workers), they wait as spares with the job loaded, "
       "and one takes a dead member's seat in the rerun of the step the death broke."},
      {"elastic",
       "pause_timeout_ms",
       COHORT_FIELD(elastic.pause_timeout_ms),
       at_least(0),
       {},
       nullptr,
       "How long training waits below min_workers before the run fails; 0: fail at once."},
      {"elastic",
       "straggler_factor",
       COHORT_FIELD(elastic.straggler_factor),
       at_least(0),
       {},
       nullptr,
       "0: off. Above 1: a data-parallel worker whose measured speed stays below the median of "
       "the others' divided by this, at 3 plans in a row (about 3 commit windows) once it has "
       "run 10 measured steps, is drained with a `straggler` event saying why; never below "
       "elastic.min_workers."},
      {"control",
       "bind",
       COHORT_FIELD(control.bind),
       unbounded(),
       {},
       nullptr,
       "Coordinator endpoint (ZeroMQ): tcp://HOST:PORT (port 0: any free port) or "
       "ipc://PATH. An address other hosts reach needs the job's keys (--keys DIR from "
       "`cohort keygen`) or --insecure (docs/security.md)."},
      {"control",
       "max_message_bytes",
       COHORT_FIELD(control.max_message_bytes),
       at_least(1),
       {},
       nullptr,
       "Larger control frames are counted and dropped."},
      {"ha",
       "standbys",
       COHORT_FIELD(ha.standbys),
       at_least(0),
       {},
       nullptr,
       "Standby coordinators beside the leader: the coordinators elect a leader through etcd "
       "(ha.etcd), and when it dies a standby takes the job over and the workers reattach to "
       "it. 0: one coordinator and no etcd. Data-parallel jobs only (parallel.pp = tp = 1)."},
      {"ha",
       "etcd",
       COHORT_FIELD(ha),
       unbounded(),
       {},
       nullptr,
       "Where the coordinators elect their leader (used with standbys >= 1): local = `cohort "
       "launch` starts one etcd for the run, tuned by etcd_heartbeat_ms and etcd_election_ms; "
       "or a list of the client URLs of an etcd you run, https://HOST:PORT (with etcd-ca.crt, "
       "etcd-client.crt and etcd-client.key in the job's key folder) or http://HOST:PORT each."},
      {"ha",
       "lease_ttl_s",
       COHORT_FIELD(ha.lease_ttl_s),
       from_to(1, 60),
       {},
       nullptr,
       "Seconds of the leader's etcd lease: a dead leader's lease runs out this long after its "
       "last renewal, and a standby takes over then. etcd raises a TTL below its minimum (1.5 "
       "election timeouts rounded up to a second: 2 with etcd's default tuning)."},
      {"ha",
       "etcd_heartbeat_ms",
       COHORT_FIELD(ha.etcd_heartbeat_ms),
       at_least(1),
       {},
       nullptr,
       "Raft heartbeat interval of the etcd that `ha.etcd: local` starts (etcd's "
       "--heartbeat-interval), tuned for one machine; etcd's own default is 100."},
      {"ha",
       "etcd_election_ms",
       COHORT_FIELD(ha.etcd_election_ms),
       from_to(1, 50000),
       {},
       nullptr,
       "Raft election timeout of that etcd (--election-timeout); at least 5 x "
       "etcd_heartbeat_ms, or etcd refuses to start. etcd's own default is 1000."},
      {"ha",
       "reattach_ms",
       COHORT_FIELD(ha.reattach_ms),
       at_least(100),
       {},
       nullptr,
       "How long a worker that lost the leader keeps looking for the next one (a standby that "
       "took over) before it gives up and exits 1."},
      {"",
       "faults",
       COHORT_FIELD(faults),
       unbounded(),
       {},
       nullptr,
       "Faults to inject, one spec per entry, e.g. \"kill rank=2 at step=30\" "
       "(docs/faults.md). A top-level list, not a section."},
  };
}

}  // namespace cohort::config_schema
