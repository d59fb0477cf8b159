// The arithmetic of sharded optimizer state (runtime/train/zero_shards.hpp) as tables: the
// cut, who holds each shard, and the moves of a re-cut for kills, drains, joins and resumes,
// with the moved elements against their closed forms.
#include <doctest/doctest.h>

#include <set>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/nn/gpt.hpp"
#include "runtime/train/trainer.hpp"
#include "runtime/train/zero_shards.hpp"

using namespace cohort::train;

namespace {

shard_source at(int old_rank) { return {shard_source::layout, old_rank}; }
const shard_source joiner{shard_source::nothing, -1};
const shard_source loader{shard_source::everything, -1};

// After applying MOVES, each new rank holds exactly ranges_held(n, new w, k): what it kept
// (its old ranges) plus what it received, every needed element exactly once from a member
// that held it.
void check_plan_covers(const recut_facts& f, const std::vector<shard_move>& moves) {
  const int w = static_cast<int>(f.members.size());
  for (int k = 0; k < w; ++k) {
    CAPTURE(k);
    std::vector<int> count(static_cast<std::size_t>(f.n), 0);
    const shard_source& s = f.members[static_cast<std::size_t>(k)];
    if (s.kind == shard_source::everything) continue;  // it makes its own
    if (s.kind == shard_source::layout)
      for (const elem_range& r : ranges_held(f.n, f.old_w, s.old_rank))
        for (int64_t i = r.begin; i < r.end; ++i) ++count[static_cast<std::size_t>(i)];
    for (const shard_move& m : moves) {
      if (m.dst != k) continue;
      CHECK(m.src != k);
      const shard_source& src = f.members[static_cast<std::size_t>(m.src)];
      for (int64_t i = m.r.begin; i < m.r.end; ++i) {
        ++count[static_cast<std::size_t>(i)];
        if (src.kind == shard_source::layout) {
          bool held = false;
          for (const elem_range& r : ranges_held(f.n, f.old_w, src.old_rank))
            held = held || (i >= r.begin && i < r.end);
          REQUIRE_MESSAGE(held, "rank " << m.src << " sends " << i << " it does not hold");
        }
      }
    }
    for (const elem_range& r : ranges_held(f.n, w, k))
      for (int64_t i = r.begin; i < r.end; ++i)
        REQUIRE_MESSAGE(count[static_cast<std::size_t>(i)] >= 1, "rank " << k << " lacks " << i);
  }
}

}  // namespace

TEST_CASE("shards are contiguous, in rank order, cut at multiples of 64, sizes within 64") {
  struct row {
    int64_t n;
    int w;
    std::vector<elem_range> cut;
  };
  const std::vector<row> rows = {
      {1000, 1, {{0, 1000}}},
      {1000, 2, {{0, 512}, {512, 1000}}},  // 16 units of 64: 8 + 8, the last one short
      {1000, 3, {{0, 320}, {320, 640}, {640, 1000}}},
      {1000, 4, {{0, 256}, {256, 512}, {512, 768}, {768, 1000}}},
      {64, 2, {{0, 0}, {0, 64}}},  // fewer units than ranks: an empty shard
      {0, 3, {{0, 0}, {0, 0}, {0, 0}}},
  };
  for (const row& r : rows) {
    CAPTURE(r.n);
    CAPTURE(r.w);
    int64_t end = 0;
    for (int k = 0; k < r.w; ++k) {
      const elem_range s = shard_of(r.n, r.w, k);
      CHECK(s == r.cut[static_cast<std::size_t>(k)]);
      CHECK(s.begin == end);
      CHECK(s.begin % shard_align == 0);
      end = s.end;
    }
    CHECK(end == r.n);
  }
  CHECK_THROWS_AS(shard_of(10, 2, 2), cohort::usage_error);
  CHECK_THROWS_AS(shard_of(10, 0, 0), cohort::usage_error);
}

TEST_CASE("each shard has two holders, its owner and the next rank, and each rank holds two") {
  CHECK(holders_of(1, 0) == std::vector<int>{0});
  CHECK(shards_held(1, 0) == std::vector<int>{0});
  CHECK(holders_of(4, 3) == std::vector<int>{3, 0});
  CHECK(shards_held(4, 0) == std::vector<int>{0, 3});
  for (int w = 2; w <= 6; ++w)
    for (int j = 0; j < w; ++j)
      for (int h : holders_of(w, j)) {
        const std::vector<int> held = shards_held(w, h);
        CHECK(std::set<int>(held.begin(), held.end()).count(j) == 1);
      }
  // Held elements: 2/W of the model (one shard's worth of rounding either way).
  CHECK(elements_held(1000, 4, 0) == 256 + 232);
  CHECK(elements_held(1000, 1, 0) == 1000);
}

TEST_CASE("a group that did not change moves nothing, nor does a fresh start") {
  const int64_t n = 10000;
  CHECK(plan_recut({n, 4, {at(0), at(1), at(2), at(3)}}).empty());
  CHECK(plan_recut({n, 1, {loader, loader, loader}}).empty());
}

TEST_CASE("re-cut tables: kills, drains, joins, resumes") {
  const int64_t n = 64 * 120;  // 7680: every cut below is exact
  struct row {
    const char* what;
    recut_facts facts;
    int64_t moved;  ///< elements per slot, closed form
  };
  // 4 -> 3 (rank 2 gone): old shards of 1920, new of 2560; each new rank needs its own
  // and its replica's new shard (5120) and keeps what overlaps its old two (3840 held).
  const std::vector<row> rows = {
      // new 0 (old 0: [0,1920)+[5760,7680)) needs [0,2560)+[5120,7680): 640 + 640 missing.
      // new 1 (old 1: [1920,3840)+[0,1920)) needs [2560,5120)+[0,2560): 1280 missing.
      // new 2 (old 3: [5760,7680)+[3840,5760)) needs [5120,7680)+[2560,5120): 1280 missing.
      // In all n / 2: half the model's state per slot.
      {"kill rank 2 of 4", {n, 4, {at(0), at(1), at(3)}}, 640 + 640 + 1280 + 1280},
      {"drain rank 0 of 2", {n, 2, {at(1)}}, 0},  // one left holds both shards already
      // 2 -> 3, a joiner last: new 0 (old 0: all) keeps; new 1 (old 1: all) keeps; the
      // joiner needs its shard and its replica's, 2/3 of the model.
      {"a joiner beside two", {n, 2, {at(0), at(1), joiner}}, 2 * n / 3},
      // 1 -> 2: the one member holds all; the joiner gets both shards (all of it).
      {"a joiner beside one", {n, 1, {at(0), joiner}}, n},
      // A resume: every member reads its ranges itself; a joiner of the same step takes its
      // ranges from the first loader.
      {"a resume with a joiner", {n, 3, {loader, joiner}}, n},
  };
  for (const row& r : rows) {
    CAPTURE(r.what);
    const std::vector<shard_move> moves = plan_recut(r.facts);
    CHECK(moved_elements(moves) == r.moved);
    check_plan_covers(r.facts, moves);
    for (std::size_t i = 1; i < moves.size(); ++i) {  // sorted, adjacent pieces merged
      const shard_move& a = moves[i - 1];
      const shard_move& b = moves[i];
      CHECK((a.src < b.src || (a.src == b.src && (a.dst < b.dst || (a.dst == b.dst &&
                                                                    a.r.end < b.r.begin)))));
    }
  }
}

TEST_CASE("a re-cut takes each piece from its old owner first, then from its replica holder") {
  const int64_t n = 64 * 120;
  // 4 -> 3 with old rank 1 gone: old shard 1 ([1920,3840)) now lives only on old rank 2
  // (its replica holder, new rank 1); old shard 2 on old rank 2 itself.
  const std::vector<shard_move> moves = plan_recut({n, 4, {at(0), at(2), at(3)}});
  for (const shard_move& m : moves)
    if (m.r.begin >= 1920 && m.r.end <= 3840) CHECK(m.src == 1);
}

TEST_CASE("two neighbours lost at once: the shard between them is gone, and the plan says so") {
  const int64_t n = 64 * 120;
  // Old ranks 1 and 2 of 4 both gone: shard 1 was on 1 and 2 only.
  try {
    plan_recut({n, 4, {at(0), at(3)}});
    FAIL("no error");
  } catch (const cohort::error& e) {
    const std::string what = e.what();
    CHECK(what.find("[1920, 3840)") != std::string::npos);
    CHECK(what.find("resume from a checkpoint") != std::string::npos);
  }
  // Two that are not neighbours: every shard keeps a holder.
  const recut_facts f{n, 4, {at(1), at(3)}};
  check_plan_covers(f, plan_recut(f));
  // Facts that contradict each other.
  // Two members that held the same old rank of the same step hold the same bits: no throw,
  // the first is the source. Of 4, two claim old rank 1 and rank 2 is gone: old shard 1 and
  // the replica of shard 0 are on both; each keeps what it holds.
  const recut_facts twice{n, 4, {at(0), at(1), at(1), at(3)}};
  const std::vector<shard_move> m2 = plan_recut(twice);
  check_plan_covers(twice, m2);
  for (const shard_move& m : m2) CHECK(m.src != 2);  // the first claimant is the source
  CHECK(plan_recut({n, 2, {at(0), at(0)}}).empty());  // of 2, each held it all
  CHECK_THROWS_AS(plan_recut({n, 2, {at(2)}}), cohort::usage_error);
}

// The ring: a shard's replica is the next position's, so the hosts take turns around it and a
// shard's two copies sit on different hosts wherever the hosts' sizes allow.
TEST_CASE("ring_of_hosts: the hosts take turns, each host's ranks in order") {
  struct row {
    std::vector<uint64_t> host;  // per rank
    std::vector<int> ring;       // rank at each position
    int same_host_pairs;         // neighbours (p, p + 1 mod W) on one host
  };
  const std::vector<row> rows = {
      {{7}, {0}, 1},
      {{7, 7, 7, 7}, {0, 1, 2, 3}, 4},           // one host: the identity
      {{1, 1, 2, 2}, {0, 2, 1, 3}, 0},           // two hosts of two: alternating
      {{1, 2, 1, 2}, {0, 1, 2, 3}, 0},           // already alternating
      {{5, 5, 5, 9}, {0, 3, 1, 2}, 2},           // 3 + 1: two pairs are unavoidable
      {{3, 3, 4, 4, 8, 8}, {0, 2, 4, 1, 3, 5}, 0},
      {{2, 1, 1, 2, 3}, {0, 1, 4, 3, 2}, 0},     // hosts in the order of their lowest rank
      {{1, 1, 1, 2, 2}, {0, 3, 1, 4, 2}, 1},
  };
  for (const row& r : rows) {
    CAPTURE(r.ring.size());
    const std::vector<int> ring = ring_of_hosts(r.host);
    CHECK(ring == r.ring);
    // A permutation of the ranks.
    CHECK(std::set<int>(ring.begin(), ring.end()).size() == r.host.size());
    int same = 0;
    for (std::size_t p = 0; p < ring.size(); ++p)
      same += r.host[static_cast<std::size_t>(ring[p])] ==
              r.host[static_cast<std::size_t>(ring[(p + 1) % ring.size()])];
    CHECK(same == r.same_host_pairs);
  }
}

// The experts' cut: each unit (an expert's parameters) whole in its owner's shard, ends moved
// down to the alignment, the other elements cut evenly in order.
TEST_CASE("unit_cut: each expert whole in its owner's shard, the rest cut evenly, every element once") {
  // 1000 elements; units [128, 300) and [300, 520) (ends move down to 256, 512) and
  // [700, 1000) (to the end, which stays): owners 1, 0, 1 of 3 positions.
  const shard_cut c = unit_cut(1000, 3, {{128, 300}, {300, 520}, {700, 1000}}, {1, 0, 1});
  REQUIRE(c.w() == 3);
  // The rest: [0, 128), [512, 640) (256 elements; cut at 64-multiples of their count:
  // shard_of(256, 3, p) = [0, 64), [64, 128), [128, 256)) and the tail piece [640, 640)
  // is empty ([512, 640) is the gap between 512 and 640 = 640 down-moved from 700).
  CHECK(c.shards[0] == std::vector<elem_range>{{0, 64}, {256, 512}});
  CHECK(c.shards[1] == std::vector<elem_range>{{64, 256}, {640, 1000}});
  CHECK(c.shards[2] == std::vector<elem_range>{{512, 640}});
  int64_t total = 0;
  for (int j = 0; j < 3; ++j) total += c.size(j);
  CHECK(total == 1000);
  // Every end but n a multiple of the alignment.
  for (const auto& s : c.shards)
    for (const elem_range& r : s) {
      CHECK(r.begin % shard_align == 0);
      CHECK((r.end == 1000 || r.end % shard_align == 0));
    }
  // Held: its own ranges, then its neighbour's replica.
  CHECK(ranges_held(c, 1) == std::vector<elem_range>{{64, 256}, {640, 1000}, {0, 64}, {256, 512}});
  CHECK(elements_held(c, 0) == c.size(0) + c.size(2));
  // No units: the even cut.
  CHECK(unit_cut(1000, 3, {}, {}) == even_cut(1000, 3));
  // The text a checkpoint keeps, and back.
  CHECK(cut_text(c) == "0-64,256-512;64-256,640-1000;512-640");
  CHECK(cut_from_text(cut_text(c), 1000) == c);
  CHECK(cut_from_text("0-1000", 1000) == even_cut(1000, 1));
  for (const char* bad : {"0-64;64-900", "0-64,32-1000", "0-500;500-1000;x", "0-64;64-1000;10-20",
                          "0-1001", "0-64;;64-1000x"})
    CHECK_THROWS_AS(cut_from_text(bad, 1000), usage_error);
  CHECK_THROWS_AS(unit_cut(1000, 3, {{300, 520}, {128, 300}}, {0, 1}), usage_error);
  CHECK_THROWS_AS(unit_cut(1000, 3, {{128, 300}}, {3}), usage_error);
}

TEST_CASE("re-cut between experts' cuts: each missing piece from a member that held it") {
  // Old: 3 positions, units owned 1, 0, 1; new: 2 positions, the units to 0, 1, 0.
  recut_facts f;
  f.n = 1000;
  f.old_w = 3;
  const shard_cut old_cut = unit_cut(1000, 3, {{128, 300}, {300, 520}, {700, 1000}}, {1, 0, 1});
  const shard_cut new_cut = unit_cut(1000, 2, {{128, 300}, {300, 520}, {700, 1000}}, {0, 1, 0});
  // Old position 1 was lost; the survivors are old 0 (new 0) and old 2 (new 1).
  f.members = {{shard_source::layout, 0}, {shard_source::layout, 2}};
  const std::vector<shard_move> moves = plan_recut(f, old_cut, new_cut);
  // Every new holding is complete afterwards: what each had plus what it receives.
  for (int k = 0; k < 2; ++k) {
    std::vector<elem_range> have = ranges_held(old_cut, f.members[static_cast<std::size_t>(k)].old_rank);
    for (const shard_move& m : moves)
      if (m.dst == k) have.push_back(m.r);
    for (const elem_range& want : ranges_held(new_cut, k))
      for (int64_t e = want.begin; e < want.end; e += 8) {
        bool in = false;
        for (const elem_range& h : have) in = in || (e >= h.begin && e < h.end);
        CHECK_MESSAGE(in, "new rank " << k << " lacks element " << e);
      }
    // ... and every move's source held the piece.
    for (const shard_move& m : moves) {
      if (m.src != k) continue;
      const auto held = ranges_held(old_cut, f.members[static_cast<std::size_t>(k)].old_rank);
      bool in = false;
      for (const elem_range& h : held) in = in || (m.r.begin >= h.begin && m.r.end <= h.end);
      CHECK(in);
    }
  }
  // Cuts of other groups than the facts name are refused.
  recut_facts g = f;
  g.old_w = 2;
  CHECK_THROWS_AS(plan_recut(g, old_cut, new_cut), usage_error);
}

// Expert parallelism with sharded parameters: what each DP rank gathers of a block is the
// block's dense parameters and the experts its EP rank computes (e % size == rank).
TEST_CASE("expert_block_needs: dense parameters for every rank, each expert for its EP rank only") {
  cohort::nn::gpt_shape s{7, 4, 2, 2, 8};  // vocab 7, context 4, 2 layers, 2 heads, d_model 8
  s.moe_experts = 4;
  s.moe_top_k = 2;
  s.moe_every = 2;  // block h.1's MLP is the mixture
  cohort::nn::gpt m(s, 2, 1);
  const std::size_t moe_block = 2, dense_block = 1;  // embedding, h.0, h.1, head
  REQUIRE(m.blocks()[moe_block].name == "h.1");
  auto range_of = [&](const std::string& name) {
    const cohort::nn::parameter& p = m.param(name);
    return elem_range{p.offset, p.offset + p.value.numel()};
  };
  auto expert = [&](int e) {
    const std::string x = "transformer.h.1.mlp.experts." + std::to_string(e) + ".";
    return elem_range{range_of(x + "c_fc.weight").begin, range_of(x + "c_proj.bias").end};
  };
  const auto [first, count] = m.block_elements(moe_block);
  const elem_range dense{first, range_of("transformer.h.1.mlp.router.weight").end};
  // Two EP groups of 2 (ranks 0 1 and 2 3), then one group of 3 and one of 1.
  const auto two = expert_block_needs(m, moe_block, {{0, 2}, {1, 2}, {0, 2}, {1, 2}});
  REQUIRE(two.size() == 4);
  const std::vector<elem_range> even{{dense.begin, expert(0).end}, expert(2)};
  const std::vector<elem_range> odd{dense, expert(1), expert(3)};
  CHECK(two[0] == even);
  CHECK(two[1] == odd);
  CHECK(two[2] == even);
  CHECK(two[3] == odd);
  const auto uneven = expert_block_needs(m, moe_block, {{0, 3}, {1, 3}, {2, 3}, {0, 1}});
  CHECK(uneven[0] == std::vector<elem_range>{{dense.begin, expert(0).end}, expert(3)});
  CHECK(uneven[1] == std::vector<elem_range>{dense, expert(1)});
  CHECK(uneven[2] == std::vector<elem_range>{dense, expert(2)});
  CHECK(uneven[3] == std::vector<elem_range>{{first, first + static_cast<int64_t>(count)}});
  // A block without experts: the whole block for everyone.
  const auto [f1, c1] = m.block_elements(dense_block);
  for (const auto& r : expert_block_needs(m, dense_block, {{0, 2}, {1, 2}}))
    CHECK(r == std::vector<elem_range>{{f1, f1 + static_cast<int64_t>(c1)}});
}
