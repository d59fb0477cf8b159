// What the coordinator must do after one event of the training job: the messages to send,
// the lines for the operator, and the coordinator's own moves (new generation, leave,
// scale, stop). Only the shape; the decisions are runtime/step/training_job.cpp's.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/faults.hpp"
#include "runtime/net/membership.hpp"
#include "runtime/net/protocol.hpp"

namespace cohort::step {

namespace mb = net::membership;

/// One message for one member.
struct job_send {
  mb::member_id to = 0;
  net::message m;
};

/// What the coordinator must do after an event.
struct job_actions {
  std::vector<job_send> sends;
  /// Non-empty: a step was aborted; bump the generation with this reason (survivors
  /// rebuild their communicators and run the step again).
  std::string bump;
  std::vector<std::string> notes;  ///< lines for the operator (aborts, waits, donors)
  bool committed = false;          ///< a step committed: step / loss / rate below are set
  int64_t step = 0;                ///< the committed step + 1 (steps done)
  double loss = 0;                 ///< its mean loss over the global batch
  double rate = 0;                 ///< samples (or tokens) per second since the first step
  bool finished = false;           ///< every report is in: write the summary and stop
  std::string failed;              ///< non-empty: the job cannot go on (why); stop, exit 1
  /// Drained members at a step boundary: send each `stop` and take it out of the roster
  /// (one new generation); the next step opens without them, nothing aborted.
  std::vector<mb::member_id> leave;
  /// Members the job asks to drain (a straggler past elastic.straggler_factor): each leaves
  /// at a step boundary as by `ctl drain`.
  std::vector<mb::member_id> drain;
  /// > 0: a `scale` fault is due: reach this many members (docs/faults.md).
  int scale_to = 0;
  std::string scale_spec;  ///< the fault's text, for the scale request
  /// A coordinator fault is due (`kill coordinator`, `partition coordinator`): the leader
  /// records it as fired (etcd) and carries it out on itself before sending anything else.
  std::optional<faults::fault_spec> coordinator_fault;
  std::size_t coordinator_fault_index = 0;  ///< its place in the job's fault list
  /// Worker faults that act at this opening (orders in sends): ha records them, fenced,
  /// before the orders go out, so that a later leader re-running the step does not carry
  /// them out a second time.
  std::vector<faults::fault_fired> fired_faults;
};

}  // namespace cohort::step
