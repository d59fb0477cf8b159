// The agreement of regroup.hpp. Rank 0 decides and publishes, every other rank reads: the
// same pattern as the device check and the transport plan, so no member can reach another
// plan than its peers, whatever it knows of the roster.
#include "runtime/comm/regroup.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <sstream>

#include "runtime/comm/comm_error.hpp"
#include "runtime/core/error.hpp"

namespace cohort::comm {
namespace {

std::vector<char> bytes(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }
std::string text(const std::vector<char>& v) { return std::string(v.begin(), v.end()); }

struct held {
  bool any = false;
  std::uint64_t generation = 0;
  int rank = -1, size = 0;
};

held parse_record(const std::string& r) {
  held h;
  if (r == "none") return h;
  std::istringstream in(r);
  if (!(in >> h.generation >> h.rank >> h.size) || h.size < 1 || h.rank < 0 || h.rank >= h.size)
    return held{};  // unreadable: counts as holding nothing (the cautious path)
  h.any = true;
  return h;
}

std::string new_init(const std::string& reason) { return "new_init\n" + reason; }

std::string ranks_text(const std::vector<int>& v) {
  std::string s;
  for (int r : v) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

}  // namespace

bool prior_group::holds() const {
  if (comms.empty()) return false;
  for (const auto& c : comms)
    if (!c || !c->can_shrink()) return false;
  return true;
}

std::string prior_record(const prior_group& prior, std::size_t count) {
  if (!prior.holds() || prior.comms.size() != count) return "none";
  return std::to_string(prior.generation) + " " + std::to_string(prior.rank) + " " +
         std::to_string(prior.size);
}

std::string plan_regroup(const std::vector<std::string>& records, std::uint64_t generation,
                         int nccl_version) {
  if (records.empty()) return new_init("an empty group");
  std::vector<held> h;
  for (const std::string& r : records) h.push_back(parse_record(r));
  for (std::size_t r = 0; r < h.size(); ++r)
    if (!h[r].any)
      return new_init("rank " + std::to_string(r) + " holds no communicator it can shrink " +
                      "(a new member, or one whose communicator was aborted or failed)");
  const held& first = h[0];
  for (std::size_t r = 1; r < h.size(); ++r)
    if (h[r].generation != first.generation || h[r].size != first.size)
      return new_init("the members hold communicators of different generations (rank 0: " +
                      std::to_string(first.generation) + ", rank " + std::to_string(r) + ": " +
                      std::to_string(h[r].generation) + ")");
  // plan_nccl_rebuild over names that say only the old rank: the survivors are who they were.
  nccl_rebuild_input in;
  in.old_gen.generation = first.generation;
  for (int r = 0; r < first.size; ++r) in.old_gen.members.push_back("rank " + std::to_string(r));
  in.new_gen.generation = generation;
  for (const held& x : h) in.new_gen.members.push_back("rank " + std::to_string(x.rank));
  in.self = in.new_gen.members[0];
  in.nccl_version = nccl_version;
  nccl_rebuild_plan p;
  try {
    p = plan_nccl_rebuild(in);
  } catch (const usage_error& e) {  // two members on one old rank, a generation going back
    return new_init(e.what());
  }
  if (p.path != nccl_rebuild_path::shrink)
    return new_init(p.path == nccl_rebuild_path::keep
                        ? "generation " + std::to_string(generation) +
                              " again: an interrupted communicator is not kept as it is"
                        : p.reason);
  return "shrink " + std::string(p.abort_parent ? "1" : "0") + " " + ranks_text(p.excluded) +
         "\n" + p.reason;
}

regroup_result regroup(
    kv_client& kv, std::uint64_t generation, const std::string& group, int rank, int size,
    prior_group prior, std::size_t count, int nccl_version, int shrink_timeout_ms,
    std::chrono::milliseconds timeout, std::chrono::milliseconds longest_wait,
    const std::function<std::unique_ptr<communicator>(std::size_t k, const std::string& tag)>&
        make_new) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto key = [&](const std::string& k) {
    return generation_key(generation, group + "/regroup/" + k);
  };
  const std::string what = "regroup of group '" + group + "'";
  // 1. The plan: rank 0 reads what every member holds.
  std::string plan;
  const std::string mine = prior_record(prior, count);
  if (rank == 0) {
    std::vector<std::string> records{mine};
    for (int r = 1; r < size; ++r) records.push_back(text(kv.get(key("held/" + std::to_string(r)), timeout)));
    plan = plan_regroup(records, generation, nccl_version);
    kv.set(key("plan"), bytes(plan));
  } else {
    kv.set(key("held/" + std::to_string(rank)), bytes(mine));
    plan = text(kv.get(key("plan"), timeout));
  }
  regroup_result out;
  const std::size_t nl = plan.find('\n');
  const std::string head = plan.substr(0, nl);
  out.reason = nl == std::string::npos ? "" : plan.substr(nl + 1);
  if (head.rfind("shrink ", 0) == 0) {
    bool abort_parent = false;
    {
      std::istringstream in(head.substr(7));
      int a = 0;
      std::string list;
      if (!(in >> a >> list))
        throw comm_error(comm_failure::invalid, what, "rank 0's plan is not a plan: '" + head + "'");
      abort_parent = a != 0;
      std::istringstream l(list);
      for (std::string r; std::getline(l, r, ',');) out.excluded.push_back(std::stoi(r));
    }
    // 2. Every member shrinks what it holds; 3. rank 0 hears how each went.
    std::vector<std::unique_ptr<communicator>> shrunk;
    std::string failed;
    try {
      if (mine == "none")
        throw comm_error(comm_failure::invalid, what, "this member holds nothing to shrink");
      for (auto& c : prior.comms) {
        std::unique_ptr<communicator> s = c->shrink(out.excluded, abort_parent, shrink_timeout_ms);
        if (!s) throw comm_error(comm_failure::invalid, what, "the backend cannot shrink");
        if (s->rank() != rank || s->size() != size)
          throw comm_error(comm_failure::invalid, what,
                           "the shrink gave rank " + std::to_string(s->rank()) + " of " +
                               std::to_string(s->size()) + ", the generation says " +
                               std::to_string(rank) + " of " + std::to_string(size));
        shrunk.push_back(std::move(s));
      }
    } catch (const std::exception& e) {
      failed = e.what();
      shrunk.clear();
    }
    // Every member's shrinks may take their whole bound before it reports: the waits for the
    // reports and the verdict cover that on top of the store's own timeout.
    const std::chrono::milliseconds after = std::min(
        longest_wait,
        timeout + std::chrono::milliseconds(static_cast<std::int64_t>(shrink_timeout_ms) *
                                            static_cast<std::int64_t>(count)));
    std::string verdict;
    if (rank == 0) {
      std::string why = failed.empty() ? "" : "rank 0: " + failed;
      for (int r = 1; r < size; ++r) {
        const std::string v = text(kv.get(key("shrunk/" + std::to_string(r)), after));
        if (v != "ok" && why.empty()) why = "rank " + std::to_string(r) + ": " + v;
      }
      verdict = why.empty() ? "ok" : "retry\n" + why;
      kv.set(key("verdict"), bytes(verdict));
    } else {
      kv.set(key("shrunk/" + std::to_string(rank)), bytes(failed.empty() ? "ok" : failed));
      verdict = text(kv.get(key("verdict"), after));
    }
    if (verdict == "ok") {
      out.comms = std::move(shrunk);
      out.path = nccl_rebuild_path::shrink;
      out.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                   .count();
      return out;  // prior's communicators go with it (aborted: the shrink made them spare)
    }
    shrunk.clear();
    out.fell_back = true;
    const std::size_t vn = verdict.find('\n');
    out.reason += "; the shrink failed (" +
                  (vn == std::string::npos ? verdict : verdict.substr(vn + 1)) +
                  "), so every member builds a new communicator";
    out.excluded.clear();
  }
  // 4. A new init: the old communicators go first (they hold device memory and threads).
  prior.comms.clear();
  out.path = nccl_rebuild_path::new_init;
  for (std::size_t k = 0; k < count; ++k) out.comms.push_back(make_new(k, out.fell_back ? "retry" : ""));
  out.ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace cohort::comm
