// The fault spec language: good specs and the fields they give, the canonical text and
// its round trip (a table and seeded random specs), bad specs and the column and message
// of each mistake, and the pure scheduling helpers (due_at, random kills).
#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "runtime/core/faults.hpp"
#include "runtime/core/rng.hpp"

namespace {

using cohort::faults::fault_kind;
using cohort::faults::fault_parse_error;
using cohort::faults::fault_spec;
using cohort::faults::parse_fault;

struct good_case {
  const char* text;
  fault_spec want;        // text left empty; compared with ==, which ignores it
  const char* canonical;  // to_string of the parsed spec
};

fault_spec make(fault_kind k) {
  fault_spec s;
  s.kind = k;
  return s;
}

fault_spec kill(int rank, int64_t at) {
  fault_spec s = make(fault_kind::kill);
  s.worker.rank = rank;
  s.at_step = at;
  return s;
}

fault_spec with_name(fault_spec s, const char* name) {
  s.worker.rank = -1;
  s.worker.name = name;
  return s;
}

fault_spec timed(fault_kind k, int rank, int64_t at, int64_t ms) {
  fault_spec s = make(k);
  s.worker.rank = rank;
  s.at_step = at;
  s.duration_ms = ms;
  return s;
}

fault_spec coordinator(fault_spec s) {
  s.worker = {};
  s.coordinator = true;
  return s;
}

fault_spec slow(int rank, double factor, int64_t from, int64_t to) {
  fault_spec s = make(fault_kind::slow);
  s.worker.rank = rank;
  s.factor = factor;
  s.from_step = from;
  s.to_step = to;
  return s;
}

fault_spec drop(double p, uint64_t seed) {
  fault_spec s = make(fault_kind::drop_control);
  s.p = p;
  s.seed = seed;
  return s;
}

fault_spec scale(int to, int64_t at) {
  fault_spec s = make(fault_kind::scale);
  s.to_workers = to;
  s.at_step = at;
  return s;
}

fault_spec random_kill(double mtbf, uint64_t seed) {
  fault_spec s = make(fault_kind::random_kill);
  s.mtbf_steps = mtbf;
  s.seed = seed;
  return s;
}

const std::vector<good_case> good = {
    // The examples, which are already canonical.
    {"kill rank=2 at step=30", kill(2, 30), "kill rank=2 at step=30"},
    {"hang rank=1 at step=10 for=3s", timed(fault_kind::hang, 1, 10, 3000),
     "hang rank=1 at step=10 for=3s"},
    {"slow rank=0 factor=3 from step=5 to step=15", slow(0, 3, 5, 15),
     "slow rank=0 factor=3 from step=5 to step=15"},
    {"drop control p=0.05 seed=7", drop(0.05, 7), "drop control p=0.05 seed=7"},
    {"partition rank=3 at step=12 for=2s", timed(fault_kind::partition, 3, 12, 2000),
     "partition rank=3 at step=12 for=2s"},
    {"scale to=6 at step=20", scale(6, 20), "scale to=6 at step=20"},
    {"random kill mtbf=15steps seed=1", random_kill(15, 1), "random kill mtbf=15steps seed=1"},
    // Names, field order, spacing, units and number forms.
    {"kill worker=worker-2 at step=0", with_name(kill(0, 0), "worker-2"),
     "kill worker=worker-2 at step=0"},
    {"kill at step=7 rank=3", kill(3, 7), "kill rank=3 at step=7"},
    {"  kill\trank=2   at  step=30 ", kill(2, 30), "kill rank=2 at step=30"},
    {"kill rank=007 at step=1", kill(7, 1), "kill rank=7 at step=1"},
    {"kill worker=n1.host:2@x at step=1", with_name(kill(0, 1), "n1.host:2@x"),
     "kill worker=n1.host:2@x at step=1"},
    {"hang rank=1 at step=1 for=1.5s", timed(fault_kind::hang, 1, 1, 1500),
     "hang rank=1 at step=1 for=1500ms"},
    {"hang for=500ms at step=4 worker=w", with_name(timed(fault_kind::hang, 0, 4, 500), "w"),
     "hang worker=w at step=4 for=500ms"},
    {"partition rank=0 at step=2 for=2000ms", timed(fault_kind::partition, 0, 2, 2000),
     "partition rank=0 at step=2 for=2s"},
    {"slow rank=2 factor=1.25 from step=3 to step=3", slow(2, 1.25, 3, 3),
     "slow rank=2 factor=1.25 from step=3 to step=3"},
    {"slow to step=9 from step=1 factor=1 worker=a", with_name(slow(0, 1, 1, 9), "a"),
     "slow worker=a factor=1 from step=1 to step=9"},
    {"drop control p=1", drop(1, 0), "drop control p=1 seed=0"},
    {"drop control seed=3 p=5e-2", drop(0.05, 3), "drop control p=0.05 seed=3"},
    {"scale at step=0 to=1", scale(1, 0), "scale to=1 at step=0"},
    {"random kill seed=18446744073709551615 mtbf=2.5steps",
     random_kill(2.5, 18446744073709551615ull),
     "random kill mtbf=2.5steps seed=18446744073709551615"},
    {"random kill mtbf=1steps seed=0", random_kill(1, 0), "random kill mtbf=1steps seed=0"},
    // The coordinator as the victim (kill and partition only).
    {"kill coordinator at step=30", coordinator(kill(0, 30)), "kill coordinator at step=30"},
    {"partition coordinator at step=30 for=2s",
     coordinator(timed(fault_kind::partition, 0, 30, 2000)),
     "partition coordinator at step=30 for=2s"},
    {"kill at step=5  coordinator", coordinator(kill(0, 5)), "kill coordinator at step=5"},
    {"partition for=1500ms coordinator at step=0",
     coordinator(timed(fault_kind::partition, 0, 0, 1500)),
     "partition coordinator at step=0 for=1500ms"},
};

struct bad_case {
  const char* text;
  int column;
  const char* message;  // substring of reason()
};

const std::vector<bad_case> bad = {
    // The kind
    {"", 1, "empty fault spec"},
    {"   ", 1, "empty fault spec"},
    {"kil rank=2 at step=30", 1, "unknown fault 'kil' (did you mean kill?)"},
    {"Kill rank=2 at step=3", 1, "did you mean kill?"},
    {"  kil rank=2", 3, "unknown fault 'kil'"},
    {"partiton rank=3 at step=12 for=2s", 1, "did you mean partition?"},
    {"explode rank=1", 1,
     "unknown fault 'explode' (kinds: kill, hang, slow, drop control, partition, scale, random "
     "kill)"},
    {"rank=2 kill", 1, "a spec starts with the fault's kind"},
    {"drop p=0.1", 6, "expected 'control' after drop, got 'p=0.1'"},
    {"drop", 5, "expected 'control' after drop"},
    {"random hang mtbf=3steps seed=1", 8, "expected 'kill' after random, got 'hang'"},
    // Missing fields: the column is one past the end
    {"kill rank=2", 12, "kill needs at step=N (write kill worker=NAME|rank=N at step=N)"},
    {"kill at step=3", 15,
     "kill needs worker=NAME or rank=N (write kill worker=NAME|rank=N at step=N, or kill "
     "coordinator at step=N)"},
    {"partition at step=3 for=1s", 27,
     "partition needs worker=NAME or rank=N (write partition worker=NAME|rank=N at step=N "
     "for=2s, or partition coordinator at step=N for=2s)"},
    {"hang at step=3 for=1s", 22,
     "hang needs worker=NAME or rank=N (write hang worker=NAME|rank=N at step=N for=3s)"},
    {"hang rank=1 at step=10", 23, "hang needs for=DURATION"},
    {"slow rank=0 factor=3 from step=5", 33, "slow needs to step=N"},
    {"slow rank=0 from step=5 to step=15", 35, "slow needs factor=F"},
    {"drop control", 13, "drop control needs p=P"},
    {"drop control seed=1  ", 20, "drop control needs p=P"},
    {"partition rank=3 at step=12", 28, "partition needs for=DURATION"},
    {"scale at step=20", 17, "scale needs to=N"},
    {"scale to=3", 11, "scale needs at step=N"},
    {"random kill seed=1", 19, "random kill needs mtbf=Msteps"},
    {"random kill mtbf=15steps", 25, "random kill needs seed=S"},
    // Words and fields
    {"kill rank=2 at stp=30", 16, "unknown word 'stp' (expected step=N)"},
    {"kill rank=2 at 30", 16, "unknown word '30' (expected step=N)"},
    {"kill rank=2 at step 30", 16, "got 'step' alone"},
    {"kill rank=2 at", 15, "expected step=N after 'at'"},
    {"kill rank=2 step=30", 13, "step=N needs a word before it (write at step=N)"},
    {"slow rank=2 factor=2 step=3", 22, "write from step=A to step=B"},
    {"kill wroker=2 at step=30", 6, "unknown field 'wroker' (did you mean worker=?)"},
    {"kill rank=2 at step=30 xyz=1", 24,
     "unknown field 'xyz' (write kill worker=NAME|rank=N at step=N)"},
    {"kill rank=2 ta step=3", 13, "unknown word 'ta' (did you mean at?)"},
    {"kill rank=2 from step=3", 13, "'from' does not apply to kill"},
    {"scale to step=6 at step=20", 7, "the worker count is written to=N"},
    {"kill rank=2 at step=30 for=2s", 24, "for= does not apply to kill"},
    {"drop control rank=1 p=0.5", 14, "rank= does not apply to drop control"},
    // Trailing garbage
    {"kill rank=2 at step=30 now", 24, "unexpected 'now' after a complete spec"},
    {"random kill mtbf=15steps seed=1 please", 33, "unexpected 'please' after a complete spec"},
    // Duplicates
    {"kill rank=2 rank=3 at step=1", 13,
     "a spec names one victim, with worker= or rank= (first at column 6"},
    {"kill rank=2 at step=1 at step=2", 23, "duplicate field at step= (first at column 13"},
    {"drop control p=0.1 p=0.2", 20, "duplicate field p="},
    // Numbers
    {"kill rank=2 at step=x3", 21, "bad number 'x3' for step="},
    {"kill rank=2 at step=3.5", 21, "bad number '3.5' for step="},
    {"kill rank=2 at step=-3", 21, "'-3' for step= is negative"},
    {"kill rank=2 at step=99999999999999999999", 21, "too large for step="},
    {"kill rank=2 at step=", 21, "step= has no value"},
    {"kill worker=-1 at step=3", 13, "a rank is a whole number >= 0, got -1"},
    {"kill rank=99999999999 at step=3", 11, "rank '99999999999' is too large"},
    {"kill worker=a,b at step=3", 14, "bad character ',' in worker name 'a,b'"},
    {"kill worker= at step=3", 13, "worker= has no value"},
    {"drop control p=abc", 16, "bad number 'abc' for p="},
    {"drop control p=nan", 16, "bad number 'nan' for p="},
    {"drop control p=0", 16, "p must be in (0, 1], got 0"},
    {"drop control p=1.5", 16, "p must be in (0, 1], got 1.5"},
    {"drop control p=0.1 seed=-1", 25, "bad number '-1' for seed="},
    {"drop control p=0.1 seed=18446744073709551616", 25, "too large for seed="},
    {"scale to=0 at step=20", 10, "to must be >= 1, got 0"},
    {"scale to=x at step=20", 10, "bad number 'x' for to="},
    {"slow rank=0 factor=0.5 from step=1 to step=2", 20, "factor must be >= 1, got 0.5"},
    {"slow rank=0 factor=fast from step=1 to step=2", 20, "bad number 'fast' for factor="},
    {"slow rank=0 factor=inf from step=1 to step=2", 20, "bad number 'inf' for factor="},
    // Durations
    {"hang rank=1 at step=10 for=3", 29, "duration '3' has no unit (write 3s or 3ms)"},
    {"hang rank=1 at step=10 for=3min", 29, "bad duration unit 'min' (use ms or s"},
    {"hang rank=1 at step=10 for=2h", 29, "bad duration unit 'h'"},
    {"hang rank=1 at step=10 for=s", 28, "bad duration 's'"},
    {"hang rank=1 at step=10 for=-3s", 28, "bad duration '-3s'"},
    {"hang rank=1 at step=10 for=0s", 28, "duration must be > 0"},
    {"hang rank=1 at step=10 for=0.5ms", 28, "not a whole number of milliseconds"},
    {"partition rank=1 at step=1 for=1.0001s", 32, "not a whole number of milliseconds"},
    // mtbf
    {"random kill mtbf=15 seed=1", 20, "mtbf needs a unit"},
    {"random kill mtbf=15s seed=1", 20, "bad mtbf unit 's'"},
    {"random kill mtbf=0.5steps seed=1", 18, "mtbf must be >= 1 step, got 0.5"},
    {"random kill mtbf=steps seed=1", 18, "bad number 'steps' for mtbf="},
    // The coordinator: kill and partition only, one victim, no value
    {"hang coordinator at step=3 for=2s", 6,
     "'coordinator' does not apply to hang (only kill and partition target the coordinator; "
     "write hang worker=NAME|rank=N at step=N for=3s)"},
    {"slow coordinator factor=2 from step=1 to step=2", 6, "'coordinator' does not apply to slow"},
    {"drop control coordinator p=0.1", 14, "'coordinator' does not apply to drop control"},
    {"scale coordinator to=2 at step=1", 7, "'coordinator' does not apply to scale"},
    {"random kill coordinator mtbf=2steps seed=1", 13,
     "'coordinator' does not apply to random kill"},
    {"kill coordinator rank=2 at step=3", 18,
     "a spec names one victim, the coordinator or a worker (first at column 6; keep one)"},
    {"kill rank=2 coordinator at step=3", 13,
     "a spec names one victim, the coordinator or a worker (first at column 6; keep one)"},
    {"partition worker=w coordinator at step=3 for=1s", 20,
     "a spec names one victim, the coordinator or a worker (first at column 11"},
    {"kill coordinator coordinator at step=3", 18, "a spec names one victim, the coordinator"},
    {"kill coordinator", 17, "kill needs at step=N"},
    {"partition coordinator at step=3", 32, "partition needs for=DURATION"},
    {"kill coordinator=1 at step=3", 6,
     "coordinator takes no value: it names the leader coordinator (write kill coordinator at "
     "step=N)"},
    {"partition coordinator=yes at step=3 for=1s", 11,
     "coordinator takes no value: it names the leader coordinator (write partition coordinator "
     "at step=N for=2s)"},
    {"hang coordinator=1 at step=3 for=1s", 6, "'coordinator' does not apply to hang"},
    {"kill coordnator at step=3", 6, "unknown word 'coordnator' (did you mean coordinator?)"},
    {"kill coordinator at step=3 now", 28, "unexpected 'now' after a complete spec"},
    // Ranges across fields
    {"slow rank=0 factor=3 from step=15 to step=5", 38, "to step=5 is before from step=15"},
};

fault_parse_error error_of(const std::string& text) {
  try {
    parse_fault(text);
  } catch (const fault_parse_error& e) {
    return e;
  }
  FAIL("no error for '" << text << "'");
  return fault_parse_error(text, 0, "");
}

}  // namespace

TEST_CASE("good specs give their fields and canonical text") {
  for (const good_case& g : good) {
    const std::string text = g.text;
    CAPTURE(text);
    fault_spec s;
    REQUIRE_NOTHROW(s = parse_fault(text));
    CHECK(s == g.want);
    CHECK(s.kind == g.want.kind);
    CHECK(s.worker == g.want.worker);
    CHECK(s.coordinator == g.want.coordinator);
    CHECK(s.at_step == g.want.at_step);
    CHECK(s.from_step == g.want.from_step);
    CHECK(s.to_step == g.want.to_step);
    CHECK(s.duration_ms == g.want.duration_ms);
    CHECK(s.factor == g.want.factor);
    CHECK(s.p == g.want.p);
    CHECK(s.seed == g.want.seed);
    CHECK(s.to_workers == g.want.to_workers);
    CHECK(s.mtbf_steps == g.want.mtbf_steps);
    CHECK(s.text == text);  // the spelling the user wrote, kept for messages
    const std::string canon = cohort::faults::to_string(s);
    CHECK(canon == g.canonical);
    const fault_spec back = parse_fault(canon);
    CHECK(back == s);
    CHECK(cohort::faults::to_string(back) == canon);
  }
}

TEST_CASE("rank= names a rank, worker= a name, and worker= with digits alone is refused") {
  const fault_spec r = parse_fault("kill rank=12 at step=1");
  CHECK(r.worker.by_rank());
  CHECK(r.worker.rank == 12);
  CHECK(r.worker.name.empty());
  CHECK(r.worker.text() == "rank=12");
  const fault_spec n = parse_fault("kill worker=12a at step=1");
  CHECK_FALSE(n.worker.by_rank());
  CHECK(n.worker.set());
  CHECK(n.worker.name == "12a");
  CHECK(n.worker.text() == "worker=12a");
  CHECK_FALSE(parse_fault("drop control p=0.5").worker.set());
  // The quickstart's old `kill worker=1` killed the process named worker-3 (issue #12):
  // digits after worker= are neither unmistakably a rank nor a name.
  const fault_parse_error e = error_of("kill worker=1 at step=1500");
  CHECK(e.column() == 13);
  CHECK(e.reason() ==
        "worker=1 is ambiguous: write rank=1 for the worker at rank 1, or worker=worker-1 for the "
        "worker named worker-1");
  CHECK_THROWS_AS(parse_fault("kill rank=w1 at step=1"), fault_parse_error);
  CHECK_THROWS_AS(parse_fault("kill rank=1 worker=w1 at step=1"), fault_parse_error);
}

TEST_CASE("== compares meaning, not spelling") {
  CHECK(parse_fault("kill rank=2 at step=30") == parse_fault("kill  at step=30 rank=2"));
  CHECK(parse_fault("hang rank=1 at step=1 for=1s") ==
        parse_fault("hang rank=1 at step=1 for=1000ms"));
  CHECK(parse_fault("kill rank=2 at step=30") != parse_fault("kill rank=2 at step=31"));
  CHECK(parse_fault("kill rank=2 at step=30") != parse_fault("kill worker=w2 at step=30"));
  CHECK(parse_fault("drop control p=0.5 seed=1") != parse_fault("drop control p=0.5 seed=2"));
  // The coordinator is a victim of its own: not rank 0, not a worker named coordinator.
  const fault_spec c = parse_fault("kill coordinator at step=30");
  CHECK(c.coordinator);
  CHECK_FALSE(c.worker.set());
  CHECK(c == parse_fault("kill  at step=30 coordinator"));
  CHECK(c != parse_fault("kill rank=0 at step=30"));
  CHECK(c != parse_fault("kill worker=coordinator at step=30"));
  CHECK_FALSE(parse_fault("kill worker=coordinator at step=30").coordinator);
  CHECK(c != parse_fault("partition coordinator at step=30 for=1s"));
  fault_spec no_victim = c;
  no_victim.coordinator = false;
  CHECK(c != no_victim);
}

TEST_CASE("kind names") {
  using cohort::faults::kind_name;
  CHECK(std::string(kind_name(fault_kind::kill)) == "kill");
  CHECK(std::string(kind_name(fault_kind::drop_control)) == "drop control");
  CHECK(std::string(kind_name(fault_kind::random_kill)) == "random kill");
  // Every kind's name starts a spec of that kind.
  for (const good_case& g : good) {
    const std::string canon = g.canonical;
    CHECK(canon.rfind(std::string(kind_name(g.want.kind)) + " ", 0) == 0);
  }
}

TEST_CASE("seeded random specs survive to_string and back") {
  // Values drawn over each field's whole range, including awkward doubles, so the
  // canonical printer must keep every bit.
  cohort::rng r(20240601);
  const char* names[] = {"a", "worker-7", "n.x:1@b", "_z"};
  for (int i = 0; i < 3000; ++i) {
    fault_spec s;
    s.kind = static_cast<fault_kind>(r.below(7));
    auto worker = [&] {
      if (r.below(2)) {
        s.worker.rank = static_cast<int>(r.below(1000000));
      } else {
        s.worker.name = names[r.below(4)];
      }
    };
    // kill and partition: the coordinator a third of the time.
    auto victim = [&] {
      if (r.below(3) == 0) {
        s.coordinator = true;
      } else {
        worker();
      }
    };
    const int64_t step = static_cast<int64_t>(r.next_u64() >> (1 + r.below(63)));
    switch (s.kind) {
      case fault_kind::kill:
        victim();
        s.at_step = step;
        break;
      case fault_kind::hang:
      case fault_kind::partition:
        if (s.kind == fault_kind::hang) {
          worker();
        } else {
          victim();
        }
        s.at_step = step;
        s.duration_ms = 1 + static_cast<int64_t>(r.below(10000000));
        break;
      case fault_kind::slow:
        worker();
        s.factor = 1 + r.uniform() * 100.0 + r.below(2) * 1e-9;
        s.from_step = step / 2;
        s.to_step = step;
        break;
      case fault_kind::drop_control:
        s.p = (r.next_u64() >> 11) * (1.0 / 9007199254740992.0);
        if (s.p == 0) s.p = 1;
        s.seed = r.next_u64();
        break;
      case fault_kind::scale:
        s.to_workers = 1 + static_cast<int>(r.below(4096));
        s.at_step = step;
        break;
      case fault_kind::random_kill:
        s.mtbf_steps = 1 + (r.next_u64() >> 11) * (1000.0 / 9007199254740992.0);
        s.seed = r.next_u64();
        break;
    }
    const std::string text = cohort::faults::to_string(s);
    CAPTURE(text);
    fault_spec back;
    REQUIRE_NOTHROW(back = parse_fault(text));
    CHECK(back == s);
  }
}

TEST_CASE("bad specs point at the column of the mistake and say what was expected") {
  CHECK(bad.size() >= 40);
  for (const bad_case& b : bad) {
    const std::string text = b.text;
    CAPTURE(text);
    const fault_parse_error e = error_of(text);
    CAPTURE(e.what());
    CHECK(e.column() == b.column);
    CHECK_MESSAGE(e.reason().find(b.message) != std::string::npos, "want ..." << b.message);
    CHECK(e.spec() == text);
    // Every reason says how to fix it, in parentheses, like the config's issues.
    CHECK(e.reason().find('(') != std::string::npos);
    CHECK(e.reason().find('\n') == std::string::npos);
  }
}

TEST_CASE("the error message shows the spec and a caret under the column") {
  const fault_parse_error e = error_of("kill rank=2 at stp=30");
  CHECK(e.exit_status() == cohort::exit_usage);
  CHECK(std::string(e.what()) ==
        "column 16: unknown word 'stp' (expected step=N)\n"
        "  kill rank=2 at stp=30\n"
        "                 ^");
  // A missing field: the caret stands one past the end.
  const fault_parse_error m = error_of("kill rank=2");
  CHECK(std::string(m.what()) ==
        "column 12: kill needs at step=N (write kill worker=NAME|rank=N at step=N)\n"
        "  kill rank=2\n"
        "             ^");
  // Tabs are shown as spaces so the caret stays under the word.
  const fault_parse_error t = error_of("kill\trank=2\tat stp=3");
  CHECK(t.column() == 16);
  CHECK(std::string(t.what()).find("\n  kill rank=2 at stp=3\n                 ^") !=
        std::string::npos);
  // It is a usage error like every command-line mistake (exit 2).
  try {
    parse_fault("nope");
    FAIL("expected an error");
  } catch (const cohort::usage_error& u) {
    CHECK(u.exit_status() == 2);
  }
}

TEST_CASE("due_at: at-step faults on their step, slow over its inclusive range") {
  std::vector<fault_spec> specs;
  for (const char* t : {"kill rank=2 at step=30", "hang rank=1 at step=10 for=3s",
                        "slow rank=0 factor=3 from step=5 to step=15", "drop control p=0.05 seed=7",
                        "partition rank=3 at step=12 for=2s", "scale to=6 at step=20",
                        "random kill mtbf=1steps seed=1", "kill rank=1 at step=10",
                        "kill coordinator at step=25", "partition coordinator at step=25 for=2s"}) {
    specs.push_back(parse_fault(t));
  }
  for (int64_t step = 0; step <= 40; ++step) {
    CAPTURE(step);
    std::set<size_t> want;
    if (step == 30) want.insert(0);
    if (step == 10) want.insert({1, 7});
    if (step >= 5 && step <= 15) want.insert(2);
    if (step == 12) want.insert(4);
    if (step == 20) want.insert(5);
    if (step == 25) want.insert({8, 9});  // coordinator faults are listed like the others
    // drop (3) is always on and random kill (6) has its own test: never listed.
    std::set<size_t> got;
    const auto due = cohort::faults::due_at(specs, step);
    for (const fault_spec* f : due) got.insert(static_cast<size_t>(f - specs.data()));
    CHECK(got == want);
    CHECK(got.size() == due.size());
  }
  // In list order, pointing into the list.
  const auto ten = cohort::faults::due_at(specs, 10);
  REQUIRE(ten.size() == 3);
  CHECK(ten[0] == &specs[1]);
  CHECK(ten[1] == &specs[2]);
  CHECK(ten[2] == &specs[7]);
  CHECK(cohort::faults::due_at({}, 3).empty());
  CHECK(cohort::faults::due_at(specs, -1).empty());
}

TEST_CASE("random kill: rate 1/mtbf, uniform victims, a pure function of (seed, step)") {
  const fault_spec s = parse_fault("random kill mtbf=15steps seed=1");
  const int64_t n = 100000;
  int64_t fired = 0;
  int64_t victims[4] = {0, 0, 0, 0};
  int64_t fired_victims[4] = {0, 0, 0, 0};
  for (int64_t step = 0; step < n; ++step) {
    const int v = cohort::faults::random_kill_victim(s, step, 4);
    REQUIRE(v >= 0);
    REQUIRE(v < 4);
    ++victims[v];
    if (cohort::faults::random_kill_fires(s, step)) {
      ++fired;
      ++fired_victims[v];
    }
  }
  // Expected n/15 = 6667 with standard deviation ~79: +-5% is about 4 deviations.
  CHECK(fired > 6333);
  CHECK(fired < 7000);
  // Each rank a quarter of all steps (sd ~137) and of the fired steps (sd ~35).
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    CHECK(victims[r] > 24000);
    CHECK(victims[r] < 26000);
    CHECK(fired_victims[r] > 1450);
    CHECK(fired_victims[r] < 1880);
  }

  // Deterministic: the same (seed, step) gives the same answer, in any order.
  for (int64_t step = 999; step >= 0; --step) {
    const fault_spec again = parse_fault("random kill seed=1 mtbf=15steps");
    CHECK(cohort::faults::random_kill_fires(again, step) ==
          cohort::faults::random_kill_fires(s, step));
    CHECK(cohort::faults::random_kill_victim(again, step, 7) ==
          cohort::faults::random_kill_victim(s, step, 7));
  }
  // Another seed gives another schedule.
  const fault_spec other = parse_fault("random kill mtbf=15steps seed=2");
  int differ = 0;
  for (int64_t step = 0; step < 1000; ++step) {
    differ += cohort::faults::random_kill_fires(other, step) !=
              cohort::faults::random_kill_fires(s, step);
  }
  CHECK(differ > 50);
  // mtbf=1 kills at every step; one worker is always the victim.
  const fault_spec every = parse_fault("random kill mtbf=1steps seed=9");
  for (int64_t step = 0; step < 1000; ++step) {
    CHECK(cohort::faults::random_kill_fires(every, step));
    CHECK(cohort::faults::random_kill_victim(every, step, 1) == 0);
  }
  // A fractional mtbf: 1/2.5 = 0.4 of the steps (sd ~0.005 over 10k).
  const fault_spec frac = parse_fault("random kill mtbf=2.5steps seed=3");
  int64_t k = 0;
  for (int64_t step = 0; step < 10000; ++step) k += cohort::faults::random_kill_fires(frac, step);
  CHECK(k > 3800);
  CHECK(k < 4200);
}
