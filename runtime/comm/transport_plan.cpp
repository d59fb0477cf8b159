#include "runtime/comm/transport_plan.hpp"

#include <algorithm>
#include <sstream>

#include "runtime/comm/comm_error.hpp"

namespace cohort::comm {

namespace {

constexpr const char* magic = "cohort.plan";
constexpr std::size_t longest_record = 64 << 10;  // a layout of ~10k ranks; more is not a plan

}  // namespace

const char* to_string(plan_kind k) {
  switch (k) {
    case plan_kind::gloo:
      return "gloo";
    case plan_kind::shm:
      return "shm";
    case plan_kind::hier:
      return "hier";
  }
  return "?";
}

std::vector<char> encode_plan(const transport_plan& p) {
  std::string s =
      std::string(magic) + " " + std::to_string(transport_plan::version) + " " + to_string(p.kind);
  if (p.kind == plan_kind::hier) s += " " + p.layout.to_text();
  return {s.begin(), s.end()};
}

transport_plan decode_plan(const std::vector<char>& record, int size) {
  const std::string text(record.begin(), record.begin() + std::min(record.size(), longest_record));
  // What the message shows of the record: its start, with bytes a terminal or a C string
  // would mangle (a NUL ends what() early) shown as '?'.
  std::string shown = text.substr(0, 64);
  for (char& ch : shown)
    if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) >= 0x7f) ch = '?';
  const auto bad = [&](const std::string& why) {
    return comm_error(comm_failure::invalid, "transport plan '" + shown + "'",
                      why +
                          " (rank 0 of the group writes it; every worker of a job must run "
                          "the same cohort build)");
  };
  if (record.size() > longest_record)
    throw bad("the record is " + std::to_string(record.size()) + " bytes, more than any plan");
  std::istringstream in(text);
  std::string word, version, kind, layout, extra;
  in >> word >> version >> kind >> layout >> extra;
  if (word != magic) throw bad("it does not start with '" + std::string(magic) + "'");
  if (version != std::to_string(transport_plan::version))
    throw bad("its version is '" + version.substr(0, 16) + "', this build reads version " +
              std::to_string(transport_plan::version) + " only");
  transport_plan p;
  if (kind == to_string(plan_kind::gloo))
    p.kind = plan_kind::gloo;
  else if (kind == to_string(plan_kind::shm))
    p.kind = plan_kind::shm;
  else if (kind == to_string(plan_kind::hier))
    p.kind = plan_kind::hier;
  else
    throw bad("its kind '" + kind.substr(0, 16) + "' is not one of gloo, shm, hier");
  if (p.kind == plan_kind::hier) {
    if (layout.empty()) throw bad("a hier plan needs the host of every rank");
    p.layout = host_layout::parse(layout, size);  // throws comm_error(invalid) on its own
  } else if (!layout.empty()) {
    throw bad("a " + kind + " plan carries nothing after its kind");
  }
  if (!extra.empty()) throw bad("it has words after the layout");
  return p;
}

}  // namespace cohort::comm
