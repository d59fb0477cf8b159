// Which of the job's faults act when a step opens, and on whom.
#include "runtime/step/fault_schedule.hpp"

#include <algorithm>
#include <string>

#include "runtime/core/error.hpp"

namespace cohort::step {

void require_supported(const std::vector<faults::fault_spec>& specs, int standbys) {
  int drops = 0;
  for (const auto& x : specs) {
    if (x.coordinator && standbys < 1)
      throw usage_error("fault '" + faults::to_string(x) + "': " + faults::kind_name(x.kind) +
                        " coordinator needs ha.standbys >= 1: without a standby to take over, "
                        "the run would end with its coordinator (docs/faults.md)");
    if (x.kind == faults::fault_kind::drop_control && ++drops > 1)
      throw usage_error("fault '" + faults::to_string(x) +
                        "': a second drop control; one probability applies to every control "
                        "frame, so keep one");
  }
}

void fault_schedule::set(std::vector<faults::fault_spec> f, int standbys) {
  standbys_ = standbys;
  require_supported(f, standbys_);
  faults_ = std::move(f);
  fired_.assign(faults_.size(), false);
  for (const auto& x : faults_)
    if (x.kind == faults::fault_kind::drop_control) drop_ = x;
}

void fault_schedule::check(const faults::fault_spec& f, int64_t next_step,
                           int64_t first_unopened) const {
  require_supported({f}, standbys_);
  const int64_t first = f.kind == faults::fault_kind::slow ? f.to_step : f.at_step;
  // Open steps have already had their faults ordered: the first step left is the next.
  const int64_t earliest = first_unopened;
  const bool always = f.kind == faults::fault_kind::random_kill ||
                      f.kind == faults::fault_kind::drop_control;  // no step of their own
  if (!always && first < earliest)
    throw usage_error("fault '" + f.text + "': step " + std::to_string(first) +
                      " has already opened (the job is at step " + std::to_string(next_step) +
                      "); name step " + std::to_string(earliest) + " or later");
  if (f.kind == faults::fault_kind::drop_control && drop_)
    throw usage_error("fault '" + f.text + "': the job already drops control frames ('" +
                      drop_->text + "')");
}

int64_t fault_schedule::next_acting_step(int64_t from, int64_t limit) const {
  int64_t first = limit + 1;
  for (std::size_t i = 0; i < faults_.size(); ++i) {
    const faults::fault_spec& f = faults_[i];
    switch (f.kind) {
      case faults::fault_kind::kill:
      case faults::fault_kind::hang:
      case faults::fault_kind::partition:
      case faults::fault_kind::scale:
        if (!fired_[i] && f.at_step >= from) first = std::min(first, f.at_step);
        break;
      case faults::fault_kind::slow:
        if (f.to_step >= from) first = std::min(first, std::max(from, f.from_step));
        break;
      case faults::fault_kind::random_kill:
        for (int64_t s = from; s < first; ++s)
          if (faults::random_kill_fires(f, s) && random_fired_.count({i, s}) == 0) {
            first = s;
            break;
          }
        break;
      default:
        break;
    }
  }
  return first;
}

void fault_schedule::inject_due(const mb::roster& r, int64_t s, double now_s, job_actions& out,
                                run_report& report) {
  for (std::size_t i = 0; i < faults_.size(); ++i) {
    const faults::fault_spec& f = faults_[i];
    net::fault_order order{r.generation, s, net::fault_action::kill, 0, 1.0};
    int rank = f.worker.rank;
    std::string name = f.worker.name;
    bool first = true;  // the first step a (ranged) fault acts: it makes an event
    switch (f.kind) {
      case faults::fault_kind::kill:
      case faults::fault_kind::hang:
      case faults::fault_kind::partition:
        if (fired_[i] || f.at_step != s) continue;
        fired_[i] = true;
        if (f.coordinator) {  // carried out by the leader on itself (one per step opening)
          out.coordinator_fault = f;
          out.coordinator_fault_index = i;
          out.notes.push_back("injecting '" + f.text + "' at step " + std::to_string(s));
          report.fault_ordered(faults::kind_name(f.kind), "coordinator", f.text,
                               job_moment{s, r.generation, now_s});
          continue;
        }
        if (f.kind != faults::fault_kind::kill) {
          order.action = f.kind == faults::fault_kind::hang ? net::fault_action::hang
                                                            : net::fault_action::partition;
          order.duration_ms = static_cast<uint32_t>(f.duration_ms);
        }
        break;
      case faults::fault_kind::scale:
        if (fired_[i] || f.at_step != s) continue;
        fired_[i] = true;
        out.fired_faults.push_back({i, -1});
        out.scale_to = f.to_workers;
        out.scale_spec = f.text;
        out.notes.push_back("injecting '" + f.text + "' at step " + std::to_string(s));
        continue;
      case faults::fault_kind::slow:
        if (s < f.from_step || s > f.to_step) continue;
        order.action = net::fault_action::slow;
        order.factor = f.factor;
        first = s == f.from_step || !fired_[i];
        fired_[i] = true;
        break;
      case faults::fault_kind::random_kill:
        // Retries of an aborted step must not draw again: once per step.
        if (!faults::random_kill_fires(f, s) || random_fired_.count({i, s}) != 0) continue;
        random_fired_.insert({i, s});
        out.fired_faults.push_back({i, s});
        rank = faults::random_kill_victim(f, s, static_cast<int>(r.members.size()));
        name.clear();
        break;
      default:
        continue;
    }
    const mb::member* target = nullptr;
    for (const auto& m : r.members)
      if ((rank >= 0 && m.rank == rank) || (rank < 0 && m.name == name)) target = &m;
    if (target == nullptr) {
      out.notes.push_back("fault '" + f.text + "': no such worker in generation " +
                          std::to_string(r.generation) + "; skipped");
      continue;
    }
    out.sends.push_back({target->id, order});
    if (f.kind != faults::fault_kind::slow && f.kind != faults::fault_kind::random_kill)
      out.fired_faults.push_back({i, -1});
    if (!first) continue;
    const char* kind = order.action == net::fault_action::slow        ? "slow"
                       : order.action == net::fault_action::kill      ? "kill"
                       : order.action == net::fault_action::partition ? "partition"
                                                                      : "hang";
    report.fault_ordered(kind, target->name, f.text, job_moment{s, r.generation, now_s});
    out.notes.push_back("injecting '" + f.text + "' into " + target->name + " at step " +
                        std::to_string(s));
  }
}

}  // namespace cohort::step
