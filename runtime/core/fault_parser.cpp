// The fault spec parser: a loop over space-separated words, the kind first, then
// `key=value` fields, the word `coordinator` (the victim of a kill or partition) and the
// prepositions at / from / to, each of which takes a following `step=N`. Every refusal
// names the column and how to fix the spec (docs/faults.md).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>

#include "runtime/core/config.hpp"
#include "runtime/core/faults.hpp"

namespace cohort::faults {
namespace {

struct token {
  std::string text;
  int col = 0;  // 1-based column of its first character
};

std::vector<token> tokenize(const std::string& s) {
  std::vector<token> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
    if (i >= s.size()) break;
    const size_t start = i;
    while (i < s.size() && s[i] != ' ' && s[i] != '\t') ++i;
    out.push_back({s.substr(start, i - start), static_cast<int>(start) + 1});
  }
  return out;
}

// The fields a spec can hold; `at`, `from` and `to_step` are written "at step=N" etc.
enum field { f_worker, f_at, f_from, f_to_step, f_for, f_factor, f_p, f_seed, f_to, f_mtbf };

const char* field_text(field f) {
  switch (f) {
    case f_worker:
      return "worker=";
    case f_at:
      return "at step=";
    case f_from:
      return "from step=";
    case f_to_step:
      return "to step=";
    case f_for:
      return "for=";
    case f_factor:
      return "factor=";
    case f_p:
      return "p=";
    case f_seed:
      return "seed=";
    case f_to:
      return "to=";
    case f_mtbf:
      return "mtbf=";
  }
  return "";
}

struct kind_rules {
  fault_kind kind;
  const char* synopsis;  // what a complete spec looks like, for messages
  std::vector<field> required;
  std::vector<field> optional;
};

const std::vector<kind_rules>& rules() {
  static const std::vector<kind_rules> r = {
      {fault_kind::kill, "kill worker=NAME|rank=N at step=N", {f_worker, f_at}, {}},
      {fault_kind::hang, "hang worker=NAME|rank=N at step=N for=3s", {f_worker, f_at, f_for}, {}},
      {fault_kind::slow,
       "slow worker=NAME|rank=N factor=F from step=A to step=B",
       {f_worker, f_factor, f_from, f_to_step},
       {}},
      {fault_kind::drop_control, "drop control p=P seed=S", {f_p}, {f_seed}},
      {fault_kind::partition,
       "partition worker=NAME|rank=N at step=N for=2s",
       {f_worker, f_at, f_for},
       {}},
      {fault_kind::scale, "scale to=N at step=N", {f_to, f_at}, {}},
      {fault_kind::random_kill, "random kill mtbf=15steps seed=S", {f_mtbf, f_seed}, {}},
  };
  return r;
}

const kind_rules& rules_of(fault_kind k) {
  for (const kind_rules& r : rules()) {
    if (r.kind == k) return r;
  }
  COHORT_CHECK(false);
  return rules().front();
}

bool allows(const kind_rules& r, field f) {
  for (field g : r.required) {
    if (g == f) return true;
  }
  for (field g : r.optional) {
    if (g == f) return true;
  }
  return false;
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char ch : s) {
    if (!std::isdigit(static_cast<unsigned char>(ch))) return false;
  }
  return true;
}

bool name_char(char ch) {
  return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' || ch == '.' ||
         ch == ':' || ch == '@';
}

class parser {
 public:
  explicit parser(const std::string& text) : text_(text), tokens_(tokenize(text)) {
    spec_.text = text;
  }

  fault_spec run() {
    if (tokens_.empty()) {
      fail(1, "empty fault spec (write one such as kill rank=2 at step=30; see docs/faults.md)");
    }
    size_t i = read_kind();
    const kind_rules& r = rules_of(spec_.kind);
    while (i < tokens_.size()) i = read_field(r, i);
    for (field f : r.required) {
      if (!seen_.count(f)) {
        const std::string what =
            f == f_worker ? "worker=NAME or rank=N" : field_text(f) + placeholder(f);
        const std::string also =
            f == f_worker && takes_coordinator() ? ", or " + coordinator_form() : "";
        fail(end_col(), std::string(kind_name(spec_.kind)) + " needs " + what + " (write " +
                            r.synopsis + also + ")");
      }
    }
    check_whole(r);
    return spec_;
  }

 private:
  [[noreturn]] void fail(int col, const std::string& reason) const {
    throw fault_parse_error(text_, col, reason);
  }

  // Only a kill or a partition can have the coordinator as its victim.
  bool takes_coordinator() const {
    return spec_.kind == fault_kind::kill || spec_.kind == fault_kind::partition;
  }
  std::string coordinator_form() const {
    return spec_.kind == fault_kind::kill ? "kill coordinator at step=N"
                                          : "partition coordinator at step=N for=2s";
  }

  int end_col() const {
    // One past the last non-blank character: where a missing field would go.
    size_t end = text_.find_last_not_of(" \t");
    return end == std::string::npos ? 1 : static_cast<int>(end) + 2;
  }

  static std::string placeholder(field f) {
    switch (f) {
      case f_worker:
        return "NAME";
      case f_at:
      case f_from:
      case f_to_step:
      case f_to:
        return "N";
      case f_for:
        return "DURATION";
      case f_factor:
        return "F";
      case f_p:
        return "P";
      case f_seed:
        return "S";
      case f_mtbf:
        return "Msteps";
    }
    return "";
  }

  // ---- the kind: one word, or two for "drop control" and "random kill" ----

  size_t read_kind() {
    const token& t = tokens_[0];
    static const std::vector<std::string> words = {"kill",      "hang",  "slow",  "drop",
                                                   "partition", "scale", "random"};
    const std::string list = "kill, hang, slow, drop control, partition, scale, random kill";
    if (t.text.find('=') != std::string::npos) {
      fail(t.col, "a spec starts with the fault's kind, got '" + t.text + "' (kinds: " + list +
                      "; e.g. kill rank=2 at step=30)");
    }
    if (t.text == "kill") return set_kind(fault_kind::kill, 1);
    if (t.text == "hang") return set_kind(fault_kind::hang, 1);
    if (t.text == "slow") return set_kind(fault_kind::slow, 1);
    if (t.text == "partition") return set_kind(fault_kind::partition, 1);
    if (t.text == "scale") return set_kind(fault_kind::scale, 1);
    if (t.text == "drop" || t.text == "random") {
      const bool drop = t.text == "drop";
      const std::string second = drop ? "control" : "kill";
      const std::string why = drop ? "drop acts on the control plane: drop control p=0.05"
                                   : "the random fault is a kill: random kill mtbf=15steps seed=1";
      if (tokens_.size() < 2)
        fail(end_col(), "expected '" + second + "' after " + t.text + " (" + why + ")");
      if (tokens_[1].text != second) {
        fail(tokens_[1].col, "expected '" + second + "' after " + t.text + ", got '" +
                                 tokens_[1].text + "' (" + why + ")");
      }
      return set_kind(drop ? fault_kind::drop_control : fault_kind::random_kill, 2);
    }
    const std::string guess = closest_name(t.text, words);
    std::string hint = "kinds: " + list;
    if (!guess.empty()) {
      hint = "did you mean " +
             (guess == "drop"     ? std::string("drop control")
              : guess == "random" ? std::string("random kill")
                                  : guess) +
             "?";
    }
    fail(t.col, "unknown fault '" + t.text + "' (" + hint + ")");
  }

  size_t set_kind(fault_kind k, size_t next) {
    spec_.kind = k;
    return next;
  }

  // ---- one field; returns the index of the next token ----

  size_t read_field(const kind_rules& r, size_t i) {
    const token& t = tokens_[i];
    const size_t eq = t.text.find('=');
    if (eq == std::string::npos) {
      if (t.text == "at") return read_step(r, f_at, i);
      if (t.text == "from") return read_step(r, f_from, i);
      if (t.text == "to") return read_step(r, f_to_step, i);
      if (t.text == "coordinator") return read_coordinator(r, i);
      unknown_word(r, t, i);
    }
    const std::string key = t.text.substr(0, eq);
    const std::string value = t.text.substr(eq + 1);
    const int vcol = t.col + static_cast<int>(eq) + 1;
    static const std::map<std::string, field> keys = {
        {"worker", f_worker}, {"rank", f_worker}, {"for", f_for}, {"factor", f_factor},
        {"p", f_p},           {"seed", f_seed},   {"to", f_to},   {"mtbf", f_mtbf}};
    if (key == "coordinator" && takes_coordinator()) {
      fail(t.col, "coordinator takes no value: it names the leader coordinator (write " +
                      coordinator_form() + ")");
    }
    if (key == "coordinator") read_coordinator(r, i);  // refuses it for this kind
    if (key == "step") {
      const bool range = spec_.kind == fault_kind::slow;
      fail(t.col, std::string("step=N needs a word before it (write ") +
                      (range ? "from step=A to step=B" : "at step=N") + ")");
    }
    auto it = keys.find(key);
    if (it == keys.end()) {
      std::vector<std::string> names;
      for (const auto& [name, f] : keys) {
        if (allows(r, f)) names.push_back(name);
      }
      const std::string guess = closest_name(key, names);
      fail(t.col, "unknown field '" + key + "' (" +
                      (guess.empty() ? std::string("write ") + r.synopsis
                                     : "did you mean " + guess + "=?") +
                      ")");
    }
    const field f = it->second;
    if (!allows(r, f)) {
      fail(t.col,
           key + "= does not apply to " + kind_name(spec_.kind) + " (write " + r.synopsis + ")");
    }
    note(f, t.col);
    if (value.empty()) {
      fail(vcol, key + "= has no value (write " + r.synopsis + ")");
    }
    switch (f) {
      case f_worker:
        if (key == "rank") {
          read_rank(value, vcol);
        } else {
          read_worker(value, vcol);
        }
        break;
      case f_for:
        spec_.duration_ms = read_duration(value, vcol);
        break;
      case f_factor:
        spec_.factor = read_real(value, vcol, "factor");
        if (!(spec_.factor >= 1)) {
          fail(vcol, "factor must be >= 1, got " + value +
                         " (compute takes factor times as long: factor=3 is three times slower)");
        }
        break;
      case f_p:
        spec_.p = read_real(value, vcol, "p");
        if (!(spec_.p > 0 && spec_.p <= 1)) {
          fail(vcol, "p must be in (0, 1], got " + value +
                         " (the probability of dropping each control frame, e.g. p=0.05)");
        }
        break;
      case f_seed:
        spec_.seed = read_seed(value, vcol);
        break;
      case f_to: {
        const int64_t n = read_count(value, vcol, "to", "to=6");
        if (n < 1 || n > std::numeric_limits<int>::max()) {
          fail(vcol, "to must be >= 1, got " + value +
                         " (scale to=N sets the number of workers, e.g. to=6)");
        }
        spec_.to_workers = static_cast<int>(n);
        break;
      }
      case f_mtbf:
        spec_.mtbf_steps = read_mtbf(value, vcol);
        break;
      default:
        COHORT_CHECK(false);
    }
    return i + 1;
  }

  void note(field f, int col) {
    auto [it, fresh] = seen_.emplace(f, col);
    if (!fresh && f == f_worker) {
      fail(col,
           std::string(spec_.coordinator ? "a spec names one victim, the coordinator or a worker"
                                         : "a spec names one victim, with worker= or rank=") +
               " (first at column " + std::to_string(it->second) + "; keep one)");
    }
    if (!fresh) {
      fail(col, std::string("duplicate field ") + field_text(f) + " (first at column " +
                    std::to_string(it->second) + "; keep one)");
    }
  }

  [[noreturn]] void unknown_word(const kind_rules& r, const token& t, size_t i) {
    bool complete = true;
    for (field f : r.required) complete = complete && seen_.count(f);
    if (complete && i + 1 == tokens_.size()) {
      fail(t.col, "unexpected '" + t.text + "' after a complete spec (remove it; " + r.synopsis +
                      " is the whole form)");
    }
    std::vector<std::string> words;
    for (field f : {f_at, f_from, f_to_step}) {
      if (allows(r, f)) words.push_back(f == f_at ? "at" : f == f_from ? "from" : "to");
    }
    if (takes_coordinator()) words.push_back("coordinator");
    const std::string guess = closest_name(t.text, words);
    fail(t.col,
         "unknown word '" + t.text + "' (" +
             (guess.empty() ? std::string("write ") + r.synopsis : "did you mean " + guess + "?") +
             ")");
  }

  // `coordinator`: the victim is the leader coordinator, not a worker (kill, partition).
  size_t read_coordinator(const kind_rules& r, size_t i) {
    const token& t = tokens_[i];
    if (!takes_coordinator()) {
      fail(t.col, std::string("'coordinator' does not apply to ") + kind_name(spec_.kind) +
                      " (only kill and partition target the coordinator; write " + r.synopsis +
                      ")");
    }
    spec_.coordinator = true;
    note(f_worker, t.col);  // the one victim
    return i + 1;
  }

  // "at step=N", "from step=N", "to step=N"
  size_t read_step(const kind_rules& r, field f, size_t i) {
    const token& t = tokens_[i];
    if (!allows(r, f)) {
      const std::string extra =
          f == f_to_step && allows(r, f_to) ? "; the worker count is written to=N" : "";
      fail(t.col, "'" + t.text + "' does not apply to " + kind_name(spec_.kind) + " (write " +
                      r.synopsis + extra + ")");
    }
    note(f, t.col);
    if (i + 1 >= tokens_.size()) {
      fail(end_col(), "expected step=N after '" + t.text + "' (e.g. " + t.text + " step=30)");
    }
    const token& s = tokens_[i + 1];
    if (s.text.rfind("step=", 0) != 0) {
      const size_t eq = s.text.find('=');
      const std::string word = eq == std::string::npos ? s.text : s.text.substr(0, eq);
      if (word == "step") {
        fail(s.col, "expected step=N, got 'step' alone (write step=30 with no space around '=')");
      }
      fail(s.col, "unknown word '" + word + "' (expected step=N)");
    }
    const std::string value = s.text.substr(5);
    const int vcol = s.col + 5;
    if (value.empty()) fail(vcol, "step= has no value (write " + t.text + " step=30)");
    const int64_t n = read_count(value, vcol, "step", t.text + " step=30");
    if (f == f_at) spec_.at_step = n;
    if (f == f_from) spec_.from_step = n;
    if (f == f_to_step) {
      spec_.to_step = n;
      to_col_ = s.col;
    }
    return i + 2;
  }

  // ---- values ----

  int64_t read_count(const std::string& v, int col, const std::string& what,
                     const std::string& example) const {
    if (!all_digits(v)) {
      const bool negative = v[0] == '-' && all_digits(v.substr(1));
      fail(col, std::string(negative ? "" : "bad number ") + "'" + v + "' for " + what + "= " +
                    (negative ? "is negative " : "") + "(write a whole number >= 0, e.g. " +
                    example + ")");
    }
    errno = 0;
    const unsigned long long u = std::strtoull(v.c_str(), nullptr, 10);
    if (errno == ERANGE ||
        u > static_cast<unsigned long long>(std::numeric_limits<int64_t>::max())) {
      fail(col, "'" + v + "' is too large for " + what + "= (use a value below 2^63)");
    }
    return static_cast<int64_t>(u);
  }

  uint64_t read_seed(const std::string& v, int col) const {
    if (!all_digits(v)) {
      fail(col, "bad number '" + v + "' for seed= (write a whole number >= 0, e.g. seed=7)");
    }
    errno = 0;
    const unsigned long long u = std::strtoull(v.c_str(), nullptr, 10);
    if (errno == ERANGE) fail(col, "'" + v + "' is too large for seed= (use a value below 2^64)");
    return u;
  }

  double read_real(const std::string& v, int col, const std::string& what) const {
    if (!looks_real(v)) {
      fail(col, "bad number '" + v + "' for " + what + "= (write a decimal number such as " +
                    (what == "p" ? "0.05" : "3") + ")");
    }
    const double d = std::strtod(v.c_str(), nullptr);
    if (!std::isfinite(d))
      fail(col, "'" + v + "' is too large for " + what + "= (use a finite number)");
    return d;
  }

  // rank=N: the worker at rank N of the run when the fault acts.
  void read_rank(const std::string& v, int col) {
    if (!all_digits(v)) {
      fail(col,
           "a rank is a whole number >= 0, got '" + v +
               "' (write rank=N for the worker at rank N, or worker=NAME for a worker's name)");
    }
    errno = 0;
    const unsigned long long u = std::strtoull(v.c_str(), nullptr, 10);
    if (errno == ERANGE || u > static_cast<unsigned long long>(std::numeric_limits<int>::max())) {
      fail(col, "rank '" + v + "' is too large (rank=N names a rank from 0 to workers - 1)");
    }
    spec_.worker.rank = static_cast<int>(u);
  }

  // worker=NAME: the worker of that name (`cohort ctl status` lists them). Digits alone are
  // refused: worker=1 read as a rank killed the process named worker-3 (issue #12).
  void read_worker(const std::string& v, int col) {
    if (all_digits(v)) {
      fail(col, "worker=" + v + " is ambiguous: write rank=" + v + " for the worker at rank " + v +
                    ", or worker=worker-" + v + " for the worker named worker-" + v);
    }
    if ((v[0] == '-' || v[0] == '+') && all_digits(v.substr(1))) {
      fail(col, "a rank is a whole number >= 0, got " + v +
                    " (write rank=N for a rank or worker=NAME for a worker's name)");
    }
    for (size_t k = 0; k < v.size(); ++k) {
      if (!name_char(v[k])) {
        fail(col + static_cast<int>(k),
             "bad character '" + std::string(1, v[k]) + "' in worker name '" + v +
                 "' (names use letters, digits and _ - . : @, e.g. worker=worker-2)");
      }
    }
    spec_.worker.name = v;
  }

  int64_t read_duration(const std::string& v, int col) const {
    size_t n = 0;
    while (n < v.size() && (std::isdigit(static_cast<unsigned char>(v[n])) || v[n] == '.')) ++n;
    const std::string number = v.substr(0, n), unit = v.substr(n);
    if (number.empty() || !looks_real(number)) {
      fail(col, "bad duration '" + v + "' (write a number and a unit, e.g. for=3s or for=500ms)");
    }
    const int ucol = col + static_cast<int>(n);
    if (unit.empty()) {
      fail(ucol, "duration '" + v + "' has no unit (write " + number + "s or " + number + "ms)");
    }
    if (unit != "ms" && unit != "s") {
      fail(ucol, "bad duration unit '" + unit + "' (use ms or s, e.g. for=3s or for=500ms)");
    }
    const double ms = std::strtod(number.c_str(), nullptr) * (unit == "s" ? 1000.0 : 1.0);
    if (!(ms < 9.2e18)) fail(col, "duration '" + v + "' is too long (use at most days)");
    // Durations are whole milliseconds; 1.5s is 1500 ms, 0.3ms is not representable.
    const double whole = std::round(ms);
    if (std::fabs(ms - whole) > 1e-6 * std::max(1.0, ms)) {
      fail(col, "duration '" + v +
                    "' is not a whole number of milliseconds (use ms precision, e.g. " +
                    number_text(std::max(1.0, whole)) + "ms)");
    }
    if (whole <= 0) fail(col, "duration must be > 0, got '" + v + "' (e.g. for=3s)");
    return static_cast<int64_t>(whole);
  }

  double read_mtbf(const std::string& v, int col) const {
    size_t n = 0;
    while (n < v.size() && (std::isdigit(static_cast<unsigned char>(v[n])) || v[n] == '.')) ++n;
    const std::string number = v.substr(0, n), unit = v.substr(n);
    if (number.empty() || !looks_real(number)) {
      fail(col, "bad number '" + v +
                    "' for mtbf= (write the mean steps between kills, e.g. mtbf=15steps)");
    }
    const int ucol = col + static_cast<int>(n);
    if (unit != "steps") {
      fail(ucol, (unit.empty() ? "mtbf needs a unit" : "bad mtbf unit '" + unit + "'") +
                     std::string(" (the mean time between kills is counted in steps: write mtbf=") +
                     number + "steps)");
    }
    const double m = std::strtod(number.c_str(), nullptr);
    if (!(m >= 1) || !std::isfinite(m)) {
      fail(col,
           "mtbf must be >= 1 step, got " + number +
               " (a kill fires with probability 1/mtbf per step; mtbf=1steps kills every step)");
    }
    return m;
  }

  // ---- checks across fields ----

  void check_whole(const kind_rules&) const {
    if (spec_.kind == fault_kind::slow && spec_.to_step < spec_.from_step) {
      fail(to_col_,
           "to step=" + std::to_string(spec_.to_step) +
               " is before from step=" + std::to_string(spec_.from_step) +
               " (the range is inclusive; write from step=" + std::to_string(spec_.to_step) +
               " to step=" + std::to_string(spec_.from_step) + " if they are swapped)");
    }
  }

  const std::string& text_;
  std::vector<token> tokens_;
  fault_spec spec_;
  std::map<field, int> seen_;  // field -> column where it was written
  int to_col_ = 0;
};

std::string caret_display(const std::string& spec, int column) {
  std::string shown = spec;
  for (char& ch : shown) {
    if (ch == '\t') ch = ' ';  // so the caret lines up
  }
  return "  " + shown + "\n  " + std::string(static_cast<size_t>(std::max(column, 1) - 1), ' ') +
         "^";
}

}  // namespace

fault_parse_error::fault_parse_error(std::string spec, int column, std::string reason)
    : usage_error("column " + std::to_string(column) + ": " + reason + "\n" +
                  caret_display(spec, column)),
      spec_(std::move(spec)),
      column_(column),
      reason_(std::move(reason)) {}

fault_spec parse_fault(const std::string& text) { return parser(text).run(); }

}  // namespace cohort::faults
