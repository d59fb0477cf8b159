#include "runtime/train/zero_shards.hpp"

#include <algorithm>

#include "runtime/core/error.hpp"

namespace cohort::train {

elem_range shard_of(int64_t n, int w, int r) {
  if (w < 1 || r < 0 || r >= w)
    throw usage_error("shard " + std::to_string(r) + " of a group of " + std::to_string(w) +
                      " does not exist");
  const int64_t units = (n + shard_align - 1) / shard_align;
  auto bound = [&](int k) { return std::min(n, (k * units / w) * shard_align); };
  return {bound(r), bound(r + 1)};
}

std::vector<int> ring_of_hosts(const std::vector<uint64_t>& host) {
  // Each host's ranks, ascending; the hosts in the order of their lowest rank.
  std::vector<std::vector<int>> hosts;
  std::vector<uint64_t> keys;
  for (int k = 0; k < static_cast<int>(host.size()); ++k) {
    const auto at = std::find(keys.begin(), keys.end(), host[static_cast<std::size_t>(k)]);
    if (at == keys.end()) {
      keys.push_back(host[static_cast<std::size_t>(k)]);
      hosts.push_back({k});
    } else {
      hosts[static_cast<std::size_t>(at - keys.begin())].push_back(k);
    }
  }
  std::vector<int> ring;
  for (std::size_t round = 0; ring.size() < host.size(); ++round)
    for (const std::vector<int>& h : hosts)
      if (round < h.size()) ring.push_back(h[round]);
  return ring;
}

std::vector<int> holders_of(int w, int j) {
  if (w == 1) return {0};
  return {j, (j + 1) % w};
}

std::vector<int> shards_held(int w, int r) {
  if (w == 1) return {0};
  return {r, (r - 1 + w) % w};
}

std::vector<elem_range> ranges_held(int64_t n, int w, int r) {
  std::vector<elem_range> out;
  for (int j : shards_held(w, r)) out.push_back(shard_of(n, w, j));
  return out;
}

int64_t elements_held(int64_t n, int w, int r) {
  int64_t total = 0;
  for (const elem_range& x : ranges_held(n, w, r)) total += x.size();
  return total;
}

std::string to_string(const elem_range& r) {
  return "[" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ")";
}

namespace {

// Pieces of R not covered by any of HELD.
std::vector<elem_range> minus(elem_range r, const std::vector<elem_range>& held) {
  std::vector<elem_range> left{r};
  for (const elem_range& h : held) {
    std::vector<elem_range> next;
    for (const elem_range& x : left) {
      if (h.end <= x.begin || h.begin >= x.end) {
        next.push_back(x);
        continue;
      }
      if (x.begin < h.begin) next.push_back({x.begin, h.begin});
      if (h.end < x.end) next.push_back({h.end, x.end});
    }
    left = std::move(next);
  }
  return left;
}

}  // namespace

std::vector<shard_move> plan_recut(const recut_facts& f) {
  const int new_w = static_cast<int>(f.members.size());
  if (new_w < 1 || f.old_w < 1) throw usage_error("a re-cut needs at least one rank on each side");
  // Which new rank holds each old rank's shards (-1: none), and the first that holds all.
  std::vector<int> now_at(static_cast<std::size_t>(f.old_w), -1);
  int everything = -1;
  for (int k = 0; k < new_w; ++k) {
    const shard_source& s = f.members[static_cast<std::size_t>(k)];
    if (s.kind == shard_source::everything && everything < 0) everything = k;
    if (s.kind != shard_source::layout) continue;
    if (s.old_rank < 0 || s.old_rank >= f.old_w)
      throw usage_error("rank " + std::to_string(k) + " says it held old rank " +
                        std::to_string(s.old_rank) + " of a group of " + std::to_string(f.old_w));
    // Two members of the same old layout for the same step (a re-cut that failed on some
    // members only, then a renumbering) hold the same bits: the first is the source, and
    // each keeps what it holds.
    if (now_at[static_cast<std::size_t>(s.old_rank)] < 0)
      now_at[static_cast<std::size_t>(s.old_rank)] = k;
  }
  std::vector<shard_move> moves;
  for (int k = 0; k < new_w; ++k) {
    const shard_source& s = f.members[static_cast<std::size_t>(k)];
    if (s.kind == shard_source::everything) continue;  // it makes its ranges itself
    const std::vector<elem_range> have =
        s.kind == shard_source::layout ? ranges_held(f.n, f.old_w, s.old_rank)
                                       : std::vector<elem_range>{};
    for (const elem_range& want : ranges_held(f.n, new_w, k)) {
      for (const elem_range& piece : minus(want, have)) {
        // Split at the old shards' boundaries: each part has its own holders.
        for (int j = 0; j < f.old_w; ++j) {
          const elem_range old = shard_of(f.n, f.old_w, j);
          const elem_range part{std::max(piece.begin, old.begin), std::min(piece.end, old.end)};
          if (part.size() <= 0) continue;
          int src = -1;
          for (int h : holders_of(f.old_w, j))
            if (src < 0) src = now_at[static_cast<std::size_t>(h)];
          if (src < 0) src = everything;
          if (src < 0)
            throw shard_lost("optimizer state " + to_string(part) + " (shard " +
                                std::to_string(j) + " of " + std::to_string(f.old_w) +
                                ") was held only by members that are gone: resume from a "
                                "checkpoint");
          moves.push_back({src, k, part});
        }
      }
    }
  }
  std::sort(moves.begin(), moves.end(), [](const shard_move& a, const shard_move& b) {
    if (a.src != b.src) return a.src < b.src;
    if (a.dst != b.dst) return a.dst < b.dst;
    return a.r.begin < b.r.begin;
  });
  std::vector<shard_move> merged;
  for (const shard_move& m : moves) {
    if (!merged.empty() && merged.back().src == m.src && merged.back().dst == m.dst &&
        merged.back().r.end == m.r.begin)
      merged.back().r.end = m.r.end;
    else
      merged.push_back(m);
  }
  return merged;
}

int64_t moved_elements(const std::vector<shard_move>& moves) {
  int64_t total = 0;
  for (const shard_move& m : moves) total += m.r.size();
  return total;
}

}  // namespace cohort::train
