// Pipeline schedules: per-stage op orders (each pass once, forward before backward, 1F1B's
// warm-up), the simulated makespan and bubble against the closed forms, peak held
// activations, the simulation's own timing rules, and argument checks.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/train/pipeline_schedule.hpp"

namespace {

using cohort::train::parse_schedule;
using cohort::train::peak_held_activations;
using cohort::train::pipe_op;
using cohort::train::pipe_timeline;
using cohort::train::schedule_kind;
using cohort::train::simulate;
using cohort::train::stage_ops;
using cohort::train::theoretical_bubble;

const schedule_kind both[] = {schedule_kind::gpipe, schedule_kind::one_f_one_b};

std::string text(const std::vector<pipe_op>& ops) {
  std::string out;
  for (const pipe_op& op : ops) out += (out.empty() ? "" : " ") + cohort::train::to_string(op);
  return out;
}

}  // namespace

TEST_CASE("schedule names parse and print, and typos are refused with a suggestion") {
  CHECK(parse_schedule("gpipe") == schedule_kind::gpipe);
  CHECK(parse_schedule("1f1b") == schedule_kind::one_f_one_b);
  CHECK(std::string(cohort::train::schedule_name(schedule_kind::gpipe)) == "gpipe");
  CHECK(std::string(cohort::train::schedule_name(schedule_kind::one_f_one_b)) == "1f1b");
  for (schedule_kind k : both) CHECK(parse_schedule(cohort::train::schedule_name(k)) == k);
  try {
    parse_schedule("1fb1");
    FAIL("1fb1 was accepted");
  } catch (const cohort::usage_error& e) {
    const std::string msg = e.what();
    CHECK_MESSAGE(msg.find("did you mean 1f1b?") != std::string::npos, msg);
    CHECK_MESSAGE(msg.find("expected gpipe or 1f1b") != std::string::npos, msg);
  }
  CHECK_THROWS_AS(parse_schedule("GPipe-ish schedule"), cohort::usage_error);
  CHECK_THROWS_AS(parse_schedule(""), cohort::usage_error);
}

TEST_CASE("every stage runs each forward and backward exactly once, forward first") {
  for (schedule_kind k : both) {
    for (int P = 1; P <= 8; ++P) {
      for (int M = 1; M <= 12; ++M) {
        for (int s = 0; s < P; ++s) {
          const std::vector<pipe_op> ops = stage_ops(k, P, M, s);
          CAPTURE(cohort::train::schedule_name(k));
          CAPTURE(P);
          CAPTURE(M);
          CAPTURE(s);
          REQUIRE(ops.size() == 2 * static_cast<size_t>(M));
          std::vector<int> fwd_at(M, -1), bwd_at(M, -1);
          for (size_t i = 0; i < ops.size(); ++i) {
            REQUIRE(ops[i].micro >= 0);
            REQUIRE(ops[i].micro < M);
            int& slot = ops[i].k == pipe_op::forward ? fwd_at[ops[i].micro] : bwd_at[ops[i].micro];
            CHECK(slot == -1);  // not seen before
            slot = static_cast<int>(i);
          }
          for (int m = 0; m < M; ++m) {
            CHECK(fwd_at[m] >= 0);
            CHECK(bwd_at[m] >= 0);
            CHECK(fwd_at[m] < bwd_at[m]);
            // Forwards, and backwards, each in ascending micro-batch order.
            if (m > 0) CHECK(fwd_at[m - 1] < fwd_at[m]);
            if (m > 0) CHECK(bwd_at[m - 1] < bwd_at[m]);
          }
        }
      }
    }
  }
}

TEST_CASE("GPipe: all forwards, then all backwards") {
  CHECK(text(stage_ops(schedule_kind::gpipe, 4, 3, 0)) == "F0 F1 F2 B0 B1 B2");
  CHECK(text(stage_ops(schedule_kind::gpipe, 4, 3, 3)) == "F0 F1 F2 B0 B1 B2");
  CHECK(text(stage_ops(schedule_kind::gpipe, 1, 1, 0)) == "F0 B0");
}

TEST_CASE("1F1B: warm-up of min(P - s - 1, M) forwards, one forward one backward, cool-down") {
  // P = 4, M = 6, written out by hand from the Megatron-LM schedule.
  CHECK(text(stage_ops(schedule_kind::one_f_one_b, 4, 6, 0)) ==
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  CHECK(text(stage_ops(schedule_kind::one_f_one_b, 4, 6, 1)) ==
        "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  CHECK(text(stage_ops(schedule_kind::one_f_one_b, 4, 6, 2)) ==
        "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  CHECK(text(stage_ops(schedule_kind::one_f_one_b, 4, 6, 3)) ==
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  // Fewer micro-batches than stages: the warm-up is cut to M, and there is no steady phase.
  CHECK(text(stage_ops(schedule_kind::one_f_one_b, 4, 2, 0)) == "F0 F1 B0 B1");
  CHECK(text(stage_ops(schedule_kind::one_f_one_b, 4, 2, 2)) == "F0 F1 B0 B1");
  CHECK(text(stage_ops(schedule_kind::one_f_one_b, 4, 2, 3)) == "F0 B0 F1 B1");

  // In general: min(P - s - 1, M) forwards, then F/B pairs while forwards remain, then
  // only backwards.
  for (int P = 1; P <= 8; ++P) {
    for (int M = 1; M <= 12; ++M) {
      for (int s = 0; s < P; ++s) {
        CAPTURE(P);
        CAPTURE(M);
        CAPTURE(s);
        const std::vector<pipe_op> ops = stage_ops(schedule_kind::one_f_one_b, P, M, s);
        const int warmup = std::min(P - s - 1, M);
        const int steady = M - warmup;
        for (int i = 0; i < warmup; ++i) CHECK(ops[i].k == pipe_op::forward);
        for (int i = 0; i < steady; ++i) {
          CHECK(ops[warmup + 2 * i].k == pipe_op::forward);
          CHECK(ops[warmup + 2 * i + 1].k == pipe_op::backward);
        }
        for (size_t i = warmup + 2 * static_cast<size_t>(steady); i < ops.size(); ++i)
          CHECK(ops[i].k == pipe_op::backward);
        // Forwards before the first backward: the warm-up plus the first steady forward.
        const auto first_b = std::find_if(
            ops.begin(), ops.end(), [](const pipe_op& o) { return o.k == pipe_op::backward; });
        CHECK(first_b - ops.begin() == std::min(P - s, M));
      }
    }
  }
}

TEST_CASE("peak held activations: M for GPipe, min(P - s, M) for 1F1B") {
  CHECK(peak_held_activations({}) == 0);
  CHECK(peak_held_activations({{pipe_op::forward, 0}, {pipe_op::backward, 0}}) == 1);
  for (int P = 1; P <= 8; ++P) {
    for (int M = 1; M <= 12; ++M) {
      const pipe_timeline g = simulate(schedule_kind::gpipe, P, M, 1.0, 2.0);
      const pipe_timeline f = simulate(schedule_kind::one_f_one_b, P, M, 1.0, 2.0);
      for (int s = 0; s < P; ++s) {
        CAPTURE(P);
        CAPTURE(M);
        CAPTURE(s);
        CHECK(g.stage[s].peak_held == M);
        CHECK(f.stage[s].peak_held == std::min(P - s, M));
        CHECK(peak_held_activations(stage_ops(schedule_kind::one_f_one_b, P, M, s)) ==
              std::min(P - s, M));
        if (M > P - s) CHECK(f.stage[s].peak_held < g.stage[s].peak_held);
      }
    }
  }
}

TEST_CASE("GPipe with t_bwd = 2 t_fwd: makespan (M + P - 1)(t_fwd + t_bwd), bubble (P-1)/(M+P-1)") {
  const int grid[][2] = {{1, 1}, {1, 8},  {2, 1}, {2, 4}, {2, 8},  {3, 5},
                         {4, 4}, {4, 16}, {5, 3}, {8, 8}, {8, 32}, {16, 64}};
  for (const auto& pm : grid) {
    const int P = pm[0], M = pm[1];
    CAPTURE(P);
    CAPTURE(M);
    const double tf = 1.0, tb = 2.0;
    const pipe_timeline t = simulate(schedule_kind::gpipe, P, M, tf, tb);
    CHECK(t.stages == P);
    CHECK(t.micro_batches == M);
    REQUIRE(t.stage.size() == static_cast<size_t>(P));
    CHECK(t.makespan == (M + P - 1) * (tf + tb));
    CHECK(t.bubble_fraction == theoretical_bubble(P, M));
    CHECK(t.bubble_fraction == double(P - 1) / double(M + P - 1));
    for (int s = 0; s < P; ++s) {
      CHECK(t.stage[s].busy == M * (tf + tb));
      CHECK(t.stage[s].bubble == (P - 1) * (tf + tb));
      CHECK(t.stage[s].ops.size() == 2 * static_cast<size_t>(M));
    }
    // Same with other costs that are exact in binary.
    const pipe_timeline h = simulate(schedule_kind::gpipe, P, M, 0.5, 1.0);
    CHECK(h.makespan == (M + P - 1) * 1.5);
    CHECK(h.bubble_fraction == theoretical_bubble(P, M));
  }
}

TEST_CASE("1F1B: the same makespan and bubble as GPipe under uniform costs") {
  const double costs[][2] = {{1.0, 2.0}, {1.0, 1.0}, {1.0, 3.0}, {2.0, 1.0}, {0.25, 0.75}};
  for (int P = 1; P <= 8; ++P) {
    for (int M = 1; M <= 12; ++M) {
      for (const auto& c : costs) {
        CAPTURE(P);
        CAPTURE(M);
        CAPTURE(c[0]);
        CAPTURE(c[1]);
        const pipe_timeline f = simulate(schedule_kind::one_f_one_b, P, M, c[0], c[1]);
        const pipe_timeline g = simulate(schedule_kind::gpipe, P, M, c[0], c[1]);
        CHECK(f.makespan == (M + P - 1) * (c[0] + c[1]));
        CHECK(f.makespan == g.makespan);
        CHECK(f.bubble_fraction == theoretical_bubble(P, M));
        for (int s = 0; s < P; ++s) CHECK(f.stage[s].bubble == (P - 1) * (c[0] + c[1]));
      }
    }
  }
}

TEST_CASE("one stage has no bubble") {
  for (schedule_kind k : both) {
    for (int M : {1, 2, 7}) {
      const pipe_timeline t = simulate(k, 1, M, 1.0, 2.0, 0.5);  // no neighbour: no transfer
      CHECK(t.makespan == 3.0 * M);
      CHECK(t.stage[0].bubble == 0.0);
      CHECK(t.bubble_fraction == 0.0);
      CHECK(theoretical_bubble(1, M) == 0.0);
    }
  }
}

TEST_CASE("transfers: GPipe pays 2 (P - 1) t_p2p once and 1F1B pays at least that") {
  for (int P = 1; P <= 6; ++P) {
    for (int M = 1; M <= 12; ++M) {
      CAPTURE(P);
      CAPTURE(M);
      const double c = 0.25;
      const pipe_timeline g = simulate(schedule_kind::gpipe, P, M, 1.0, 2.0, c);
      CHECK(g.makespan == (M + P - 1) * 3.0 + 2 * (P - 1) * c);
      const pipe_timeline f = simulate(schedule_kind::one_f_one_b, P, M, 1.0, 2.0, c);
      // A bound for any order: the last stage starts no earlier than (P - 1)(t_fwd + c),
      // then computes M (t_fwd + t_bwd), and the gradient of its last backward still has to
      // cross P - 1 links and backwards to reach stage 0.
      CHECK(f.makespan >= (M + P - 1) * 3.0 + 2 * (P - 1) * c);
    }
  }
}

TEST_CASE("the simulated timeline follows its rules: in order, as soon as inputs exist") {
  for (schedule_kind k : both) {
    for (double c : {0.0, 0.25, 1.5}) {
      for (int P : {1, 2, 3, 5}) {
        for (int M : {1, 2, 4, 9}) {
          CAPTURE(cohort::train::schedule_name(k));
          CAPTURE(c);
          CAPTURE(P);
          CAPTURE(M);
          const double tf = 1.0, tb = 2.5;
          const pipe_timeline t = simulate(k, P, M, tf, tb, c);
          // end of (kind, stage, micro), read back from the timeline itself
          std::vector<double> fe(P * M, -1), be(P * M, -1);
          for (int s = 0; s < P; ++s) {
            for (const auto& o : t.stage[s].ops)
              (o.op.k == pipe_op::forward ? fe : be)[s * M + o.op.micro] = o.end;
          }
          double last_end = 0;
          for (int s = 0; s < P; ++s) {
            const auto& ops = t.stage[s].ops;
            const std::vector<pipe_op> order = stage_ops(k, P, M, s);
            REQUIRE(ops.size() == order.size());
            double free_at = 0, busy = 0;
            for (size_t i = 0; i < ops.size(); ++i) {
              const auto& o = ops[i];
              CHECK(o.op == order[i]);
              double ready = free_at;
              if (o.op.k == pipe_op::forward) {
                if (s > 0) ready = std::max(ready, fe[(s - 1) * M + o.op.micro] + c);
                CHECK(o.end == o.start + tf);
              } else {
                ready = std::max(ready, fe[s * M + o.op.micro]);
                if (s + 1 < P) ready = std::max(ready, be[(s + 1) * M + o.op.micro] + c);
                CHECK(o.end == o.start + tb);
              }
              CHECK(o.start == ready);  // not early (inputs), not late (nothing to wait for)
              busy += o.end - o.start;
              free_at = o.end;
            }
            CHECK(t.stage[s].busy == busy);
            CHECK(t.stage[s].bubble == t.makespan - busy);
            last_end = std::max(last_end, free_at);
          }
          CHECK(t.makespan == last_end);
          double idle = 0;
          for (const auto& st : t.stage) idle += st.bubble;
          CHECK(t.bubble_fraction == doctest::Approx(idle / (P * t.makespan)).epsilon(1e-15));
        }
      }
    }
  }
}

TEST_CASE("theoretical_bubble") {
  CHECK(theoretical_bubble(4, 16) == 3.0 / 19.0);
  CHECK(theoretical_bubble(2, 1) == 0.5);
  CHECK(theoretical_bubble(8, 32) == 7.0 / 39.0);
  // More micro-batches shrink it toward 0; more stages grow it toward 1.
  CHECK(theoretical_bubble(4, 64) < theoretical_bubble(4, 16));
  CHECK(theoretical_bubble(16, 16) > theoretical_bubble(4, 16));
}

TEST_CASE("bad arguments are usage errors") {
  using cohort::usage_error;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (schedule_kind k : both) {
    CHECK_THROWS_AS(stage_ops(k, 0, 4, 0), usage_error);
    CHECK_THROWS_AS(stage_ops(k, -1, 4, 0), usage_error);
    CHECK_THROWS_AS(stage_ops(k, 4, 0, 0), usage_error);
    CHECK_THROWS_AS(stage_ops(k, 4, -3, 0), usage_error);
    CHECK_THROWS_AS(stage_ops(k, 4, 4, -1), usage_error);
    CHECK_THROWS_AS(stage_ops(k, 4, 4, 4), usage_error);
    CHECK_NOTHROW(stage_ops(k, 4, 4, 3));
    CHECK_THROWS_AS(simulate(k, 0, 4, 1, 2), usage_error);
    CHECK_THROWS_AS(simulate(k, 4, 0, 1, 2), usage_error);
    CHECK_THROWS_AS(simulate(k, 4, 4, 0, 2), usage_error);
    CHECK_THROWS_AS(simulate(k, 4, 4, 1, 0), usage_error);
    CHECK_THROWS_AS(simulate(k, 4, 4, -1, 2), usage_error);
    CHECK_THROWS_AS(simulate(k, 4, 4, nan, 2), usage_error);
    CHECK_THROWS_AS(simulate(k, 4, 4, 1, inf), usage_error);
    CHECK_THROWS_AS(simulate(k, 4, 4, 1, 2, -0.5), usage_error);
    CHECK_THROWS_AS(simulate(k, 4, 4, 1, 2, nan), usage_error);
    CHECK_NOTHROW(simulate(k, 4, 4, 1, 2, 0));
  }
  CHECK_THROWS_AS(theoretical_bubble(0, 4), usage_error);
  CHECK_THROWS_AS(theoretical_bubble(4, 0), usage_error);
  try {
    stage_ops(schedule_kind::one_f_one_b, 4, 4, 4);
    FAIL("stage 4 of 4 was accepted");
  } catch (const usage_error& e) {
    CHECK_MESSAGE(std::string(e.what()).find("stage 4 is outside [0, 4)") != std::string::npos,
                  e.what());
  }
}
