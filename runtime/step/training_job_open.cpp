// Who steps, and on how many micro-batches each (docs/data_parallel.md, "A join" and "Workers
// of different speeds"): the last step's members going on over their links while joiners
// load the job, and train.balance's shares in every step_open of a whole-model DP job. The
// rest of the step protocol is training_job.cpp's.
#include "runtime/step/training_job.hpp"

namespace cohort::step {

std::optional<mb::roster> training_job::stepping_without_joiners(const mb::roster& r) const {
  if (seat_size_ != 1 || resync_ || rollback_ || stepped_.generation == 0 ||
      static_cast<int>(stepped_.ranks.size()) < min_workers())
    return std::nullopt;
  mb::roster s = r;
  s.generation = stepped_.generation;
  s.members.clear();
  for (const auto& m : r.members) {
    const auto it = stepped_.ranks.find(m.id);
    const auto at = ready_.find(m.id);
    if (it == stepped_.ranks.end()) {
      if (at != ready_.end()) return std::nullopt;  // a ready joiner: it enters now
      continue;
    }
    // The last step's members, each on its rank and at the job's step, or no step at all.
    if (m.rank != it->second || m.state != mb::member_state::alive || at == ready_.end() ||
        at->second != next_step_)
      return std::nullopt;
    s.members.push_back(m);
  }
  if (s.members.size() != stepped_.ranks.size()) return std::nullopt;  // one of them is gone
  return s;
}

job_actions training_job::open_step_on(const mb::roster& r, const mb::roster& s, double now_s) {
  // Over the last step's links (its generation and ranks): no rebuild, no donor, and the
  // faults due pick their victims among those stepping.
  job_actions out;
  settle_end();
  waiting_.noted = false;
  waiting_.paused_since_s = -1;
  track_membership(r, now_s, out);
  faults_.inject_due(s, next_step_, now_s, out, report_);
  open_state o;
  o.generation = s.generation;
  o.step = next_step_;
  for (const auto& m : s.members) o.votes[m.id] = false;
  replicas_ = static_cast<int>(s.members.size());
  o.sent_s = now_s;
  o.through = window_end();
  const std::vector<int32_t> shares = shares_for_step(s, now_s, out);
  for (const auto& m : s.members) {
    o.sent[m.id] = net::step_open{s.generation, next_step_, replicas_, -1, m.rank};
    o.sent[m.id].through = o.through;
    o.sent[m.id].shares = shares;
    o.sent[m.id].point = point_.step;
    o.sent[m.id].end = steps_;
    out.sends.push_back({m.id, o.sent[m.id]});
  }
  report_.step_opened(replicas_, now_s);
  report_.step_members(names_of(s, o.votes), now_s);
  open_ = std::move(o);
  return out;
}

bool training_job::can_stop_early() const {
  if (early_.asked || finished_ || next_step_ >= steps_) return false;
  // A window or step open now may already run to the end: nothing to shorten.
  return !(open_ && first_unopened() >= steps_);
}

bool training_job::stop_early(const std::string& by, double now_s) {
  if (!can_stop_early()) return false;
  early_ = {true, by, now_s};
  report_.stop_asked(by, progress(), now_s);
  return true;
}

void training_job::settle_end() {
  if (!early_.asked || steps_ <= next_step_ + 1) return;
  steps_ = next_step_ + 1;
  report_.stop_settled(steps_);
}

std::vector<int32_t> training_job::shares_for_step(const mb::roster& s, double now_s,
                                                   job_actions& out) {
  std::vector<std::pair<uint64_t, std::string>> by_rank(s.members.size());
  for (const auto& m : s.members) {
    if (m.rank < 0 || m.rank >= static_cast<int>(by_rank.size())) return {};  // not dense
    by_rank[m.rank] = {m.id, m.name};
  }
  std::string note;
  std::vector<int32_t> shares = balance_.plan(by_rank, &note);
  if (report_.watched()) report_.balance_seen(balance_.json());  // metrics and trace only
  if (!note.empty()) {
    report_.decided("balance", "", note, moment(s, now_s));
    out.notes.push_back("step " + std::to_string(next_step_) + ": " + note);
  }
  // A straggler leaves, unless that would take the job below elastic.min_workers.
  if (const auto slow = balance_.take_straggler();
      slow && static_cast<int>(s.members.size()) > min_workers()) {
    if (const mb::member* m = s.find(slow->first)) {
      report_.decided("straggler", m->name, slow->second, moment(s, now_s));
      out.notes.push_back("step " + std::to_string(next_step_) + ": draining straggler " +
                          slow->second);
      out.drain.push_back(slow->first);
    }
  }
  return shares;
}

void training_job::measure(const net::step_vote& v) {
  if (!open_) return;
  const auto it = open_->sent.find(v.member_id);
  if (it == open_->sent.end()) return;
  balance_.measured(v.member_id, static_cast<double>(v.timing.compute_us) / 1e6,
                    micro_count(it->second, balance_.micro_batches()));
}

}  // namespace cohort::step
