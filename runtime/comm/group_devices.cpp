#include "runtime/comm/group_devices.hpp"

#include <map>

#include "runtime/comm/comm_error.hpp"
#include "runtime/core/error.hpp"

namespace cohort::comm {
namespace {

// A worker's device kind: what decides whether replicas can hold the same bits (a GPU's
// kernels and the CPU's do not give the same results, so their parameters would drift).
std::string kind_of(const std::string& device) {
  return device.rfind("cuda", 0) == 0 ? "cuda" : device;
}

// The records: "<device>\n<worker>" from each rank; the verdict "ok" or "refused\n<text>".
std::vector<char> bytes(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }
const std::string kRefused = "refused\n";

}  // namespace

std::string mixed_devices_text(const std::string& group, const std::vector<group_member>& members) {
  std::map<std::string, std::vector<std::size_t>> by_kind;
  for (std::size_t r = 0; r < members.size(); ++r) by_kind[kind_of(members[r].device)].push_back(r);
  if (by_kind.size() <= 1) return "";
  constexpr std::size_t kNamed = 8;
  std::string text = "group '" + group + "' mixes devices:";
  for (const auto& [kind, ranks] : by_kind) {
    text += " on " + kind + ":";
    for (std::size_t i = 0; i < ranks.size() && i < kNamed; ++i) {
      const group_member& m = members[ranks[i]];
      text += std::string(i ? ", " : " ") + m.worker + " (rank " + std::to_string(ranks[i]) + ", " +
              m.device + ")";
    }
    if (ranks.size() > kNamed) text += " and " + std::to_string(ranks.size() - kNamed) + " more";
    text += ";";
  }
  return text +
         " replicas on different devices compute different bits and would drift apart. Give "
         "every worker of the job the same kind of device: train.device: cuda where every host "
         "has a GPU, train.device: cpu otherwise (auto resolves per host)";
}

void check_group_devices(kv_client& kv, std::uint64_t generation, const std::string& group,
                         int rank, int size, const group_member& me,
                         std::chrono::milliseconds timeout) {
  const auto key = [&](const std::string& k) {
    return generation_key(generation, group + "/devices/" + k);
  };
  if (rank != 0) {
    kv.set(key(std::to_string(rank)), bytes(me.device + "\n" + me.worker));
    const std::vector<char> v = kv.get(key("verdict"), timeout);
    const std::string verdict(v.begin(), v.end());
    if (verdict == "ok") return;
    if (verdict.rfind(kRefused, 0) == 0) throw usage_error(verdict.substr(kRefused.size()));
    throw comm_error(comm_failure::invalid, "device check of group '" + group + "'",
                     "rank 0's verdict is not a verdict (" + std::to_string(v.size()) + " bytes)");
  }
  std::vector<group_member> members{me};
  for (int r = 1; r < size; ++r) {
    const std::vector<char> v = kv.get(key(std::to_string(r)), timeout);
    const std::string record(v.begin(), v.end());
    const std::size_t nl = record.find('\n');
    if (nl == std::string::npos)
      throw comm_error(comm_failure::invalid, "device check of group '" + group + "'",
                       "rank " + std::to_string(r) + "'s record has no device line");
    members.push_back(group_member{record.substr(nl + 1), record.substr(0, nl)});
  }
  const std::string text = mixed_devices_text(group, members);
  kv.set(key("verdict"), bytes(text.empty() ? "ok" : kRefused + text));
  if (!text.empty()) throw usage_error(text);
}

}  // namespace cohort::comm
