// The rules of nccl_elastic.hpp. Every group-wide choice reads only the two memberships
// and the NCCL version (the same on every member of one build), so the members agree
// without a message; only `rank` and the leave cases depend on who asks.
#include "runtime/comm/nccl_elastic.hpp"

#include <algorithm>
#include <set>

#include "runtime/core/error.hpp"

namespace cohort::comm {

namespace {

std::string version_text(int v) {
  return std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." +
         std::to_string(v % 100);
}

void check_members(const nccl_membership& m, const char* which) {
  std::set<std::string> seen;
  for (std::size_t r = 0; r < m.members.size(); ++r) {
    const std::string& name = m.members[r];
    const std::string where = std::string(which) + " generation " + std::to_string(m.generation);
    if (name.empty())
      throw usage_error("nccl rebuild: rank " + std::to_string(r) + " of the " + where +
                        " has an empty member name; every rank needs the roster's name");
    if (!seen.insert(name).second)
      throw usage_error("nccl rebuild: member '" + name + "' holds two ranks in the " + where +
                        "; one member, one rank");
  }
}

int index_of(const std::vector<std::string>& v, const std::string& name) {
  const auto it = std::find(v.begin(), v.end(), name);
  return it == v.end() ? -1 : static_cast<int>(it - v.begin());
}

std::string names(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& n : v) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

const char* to_string(nccl_rebuild_path p) {
  switch (p) {
    case nccl_rebuild_path::keep:
      return "keep";
    case nccl_rebuild_path::shrink:
      return "shrink";
    case nccl_rebuild_path::new_init:
      return "new init";
    case nccl_rebuild_path::leave:
      return "leave";
  }
  return "?";
}

nccl_rebuild_plan plan_nccl_rebuild(const nccl_rebuild_input& in) {
  if (in.self.empty())
    throw usage_error("nccl rebuild: this worker's member name is empty; pass its roster name");
  check_members(in.old_gen, "old");
  check_members(in.new_gen, "new");
  const auto& before = in.old_gen.members;
  const auto& after = in.new_gen.members;
  const std::string gens = "generation " + std::to_string(in.old_gen.generation) + " -> " +
                           std::to_string(in.new_gen.generation);
  nccl_rebuild_plan plan;
  if (!before.empty() && in.new_gen.generation == in.old_gen.generation) {
    if (before != after)
      throw usage_error("nccl rebuild: generation " + std::to_string(in.new_gen.generation) +
                        " has two memberships ([" + names(before) + "] and [" + names(after) +
                        "]); a membership change needs a new generation");
    plan.path = nccl_rebuild_path::keep;
    plan.size = static_cast<int>(after.size());
    plan.rank = index_of(after, in.self);
    for (std::size_t r = 0; r < before.size(); ++r) plan.new_rank.push_back(static_cast<int>(r));
    plan.reason = "generation " + std::to_string(in.new_gen.generation) + " unchanged";
    return plan;
  }
  if (!before.empty() && in.new_gen.generation < in.old_gen.generation)
    throw usage_error("nccl rebuild: " + gens + " goes backwards; a generation only grows");

  plan.size = static_cast<int>(after.size());
  plan.rank = index_of(after, in.self);
  std::vector<std::string> survivors;
  for (std::size_t r = 0; r < before.size(); ++r) {
    const int to = index_of(after, before[r]);
    plan.new_rank.push_back(to);
    if (to < 0) {
      plan.excluded.push_back(static_cast<int>(r));
      const auto why = in.departed.find(before[r]);
      if (why == in.departed.end() || why->second != departure_kind::left) plan.abort_parent = true;
    } else {
      survivors.push_back(before[r]);
    }
  }
  std::vector<std::string> joiners;
  for (const std::string& n : after)
    if (index_of(before, n) < 0) joiners.push_back(n);

  if (plan.rank < 0) {
    plan.path = nccl_rebuild_path::leave;
    plan.reason = gens + ": '" + in.self + "' is not a member of the new generation";
    return plan;
  }
  plan.path = nccl_rebuild_path::new_init;
  if (!joiners.empty()) {
    plan.reason =
        gens + ": joiners [" + names(joiners) + "] need a new communicator (NCCL cannot grow one)";
  } else if (plan.excluded.empty()) {
    plan.reason = gens + ": same members; the new generation retires the old communicator";
  } else if (survivors != after) {
    plan.reason = gens + ": the new generation reorders the survivors [" + names(after) +
                  "]; ncclCommShrink keeps the old order";
  } else if (in.nccl_version < nccl_shrink_min_version) {
    plan.reason = gens + ": " +
                  (in.nccl_version == 0 ? std::string("NCCL is not compiled in")
                                        : "NCCL " + version_text(in.nccl_version)) +
                  " has no ncclCommShrink (2.27 or later)";
  } else if (!in.holds_old) {
    // The others shrink, a collective this worker cannot join: it leaves and comes back as
    // a joiner, which makes the following generation a new init for everyone.
    plan.path = nccl_rebuild_path::leave;
    plan.rank = -1;
    plan.reason = gens + ": the group shrinks but '" + in.self + "' holds no communicator of " +
                  "generation " + std::to_string(in.old_gen.generation) +
                  "; it leaves and rejoins as new";
  } else {
    plan.path = nccl_rebuild_path::shrink;
    plan.reason = gens + ": " + std::to_string(plan.excluded.size()) + " of " +
                  std::to_string(before.size()) + " ranks left, none joined: ncclCommShrink" +
                  (plan.abort_parent ? " with NCCL_SHRINK_ABORT (a member died or hung)" : "");
  }
  if (plan.path == nccl_rebuild_path::new_init && !joiners.empty() && before.empty())
    plan.reason = gens + ": this worker is new: a new communicator from the unique id";
  return plan;
}

}  // namespace cohort::comm
