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

int64_t shard_cut::size(int j) const {
  int64_t total = 0;
  for (const elem_range& r : shards.at(static_cast<std::size_t>(j))) total += r.size();
  return total;
}

shard_cut even_cut(int64_t n, int w) {
  shard_cut c;
  c.n = n;
  for (int j = 0; j < w; ++j) {
    const elem_range r = shard_of(n, w, j);
    c.shards.push_back(r.size() > 0 ? std::vector<elem_range>{r} : std::vector<elem_range>{});
  }
  return c;
}

shard_cut unit_cut(int64_t n, int w, const std::vector<elem_range>& units,
                   const std::vector<int>& owner) {
  if (w < 1) throw usage_error("a cut needs at least one position");
  if (owner.size() != units.size()) throw usage_error("unit_cut: one owner a unit");
  // The units with their ends moved down to the alignment (n stays n), the empty ones left out.
  auto down = [&](int64_t x) { return x >= n ? n : x / shard_align * shard_align; };
  std::vector<std::pair<elem_range, int>> kept;
  int64_t at = 0;
  for (std::size_t i = 0; i < units.size(); ++i) {
    const elem_range& u = units[i];
    if (u.begin < at || u.end < u.begin || u.end > n)
      throw usage_error("unit_cut: unit " + to_string(u) + " is out of order or outside [0, " +
                        std::to_string(n) + ")");
    if (owner[i] < 0 || owner[i] >= w)
      throw usage_error("unit_cut: unit " + to_string(u) + " goes to position " +
                        std::to_string(owner[i]) + " of " + std::to_string(w));
    at = u.end;
    const elem_range a{down(u.begin), down(u.end)};
    if (a.size() > 0) kept.emplace_back(a, owner[i]);
  }
  // The other elements, in order: the gaps between the units.
  std::vector<elem_range> rest;
  at = 0;
  for (const auto& [u, o] : kept) {
    if (u.begin > at) rest.push_back({at, u.begin});
    at = u.end;
  }
  if (at < n) rest.push_back({at, n});
  int64_t total = 0;
  for (const elem_range& r : rest) total += r.size();
  shard_cut c;
  c.n = n;
  c.shards.resize(static_cast<std::size_t>(w));
  // Position p takes elements [shard_of(total, w, p)) of the rest, counted in order: every gap
  // but the last starts and ends at a multiple of the alignment, so these cut points are too.
  for (int p = 0; p < w; ++p) {
    const elem_range want = shard_of(total, w, p);
    int64_t before = 0;  // elements of the rest before gap g
    for (const elem_range& g : rest) {
      const int64_t lo = std::max(want.begin, before), hi = std::min(want.end, before + g.size());
      if (hi > lo)
        c.shards[static_cast<std::size_t>(p)].push_back({g.begin + (lo - before), g.begin + (hi - before)});
      before += g.size();
    }
  }
  for (const auto& [u, o] : kept) c.shards[static_cast<std::size_t>(o)].push_back(u);
  for (auto& s : c.shards) {  // sorted, adjacent ranges merged
    std::sort(s.begin(), s.end(), [](const elem_range& a, const elem_range& b) { return a.begin < b.begin; });
    std::vector<elem_range> merged;
    for (const elem_range& r : s) {
      if (!merged.empty() && merged.back().end == r.begin)
        merged.back().end = r.end;
      else
        merged.push_back(r);
    }
    s = std::move(merged);
  }
  return c;
}

std::vector<elem_range> ranges_held(const shard_cut& c, int r) {
  std::vector<elem_range> out;
  for (int j : shards_held(c.w(), r))
    for (const elem_range& x : c.shards.at(static_cast<std::size_t>(j))) out.push_back(x);
  return out;
}

int64_t elements_held(const shard_cut& c, int r) {
  int64_t total = 0;
  for (const elem_range& x : ranges_held(c, r)) total += x.size();
  return total;
}

std::string cut_text(const shard_cut& c) {
  std::string out;
  for (std::size_t j = 0; j < c.shards.size(); ++j) {
    if (j > 0) out += ';';
    for (std::size_t i = 0; i < c.shards[j].size(); ++i) {
      if (i > 0) out += ',';
      out += std::to_string(c.shards[j][i].begin) + "-" + std::to_string(c.shards[j][i].end);
    }
  }
  return out;
}

shard_cut cut_from_text(const std::string& text, int64_t n) {
  shard_cut c;
  c.n = n;
  c.shards.emplace_back();
  std::vector<bool> seen;
  std::size_t i = 0;
  auto fail = [&](const std::string& why) -> shard_cut {
    throw usage_error("shard cut \"" + text.substr(0, 80) + "\": " + why);
  };
  auto number = [&]() -> int64_t {
    if (i >= text.size() || text[i] < '0' || text[i] > '9') fail("a number expected at " + std::to_string(i));
    int64_t v = 0;
    for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
      if (v > (int64_t{1} << 50)) fail("a number too large");
      v = v * 10 + (text[i] - '0');
    }
    return v;
  };
  int64_t covered = 0;
  while (i < text.size()) {
    if (text[i] == ';') {
      c.shards.emplace_back();
      ++i;
      continue;
    }
    if (text[i] == ',') ++i;
    const int64_t b = number();
    if (i >= text.size() || text[i] != '-') fail("'-' expected at " + std::to_string(i));
    ++i;
    const int64_t e = number();
    if (e <= b || e > n) fail("range " + std::to_string(b) + "-" + std::to_string(e) + " is empty or past " + std::to_string(n));
    auto& s = c.shards.back();
    if (!s.empty() && s.back().end >= b) fail("ranges out of order");
    s.push_back({b, e});
    covered += e - b;
  }
  // Every element once: the sizes add up to n and no two ranges overlap.
  std::vector<elem_range> all;
  for (const auto& s : c.shards) all.insert(all.end(), s.begin(), s.end());
  std::sort(all.begin(), all.end(), [](const elem_range& a, const elem_range& b) { return a.begin < b.begin; });
  int64_t at = 0;
  for (const elem_range& r : all) {
    if (r.begin != at) fail("element " + std::to_string(at) + " is in no shard or in two");
    at = r.end;
  }
  if (at != n || covered != n) fail("the shards do not cover the " + std::to_string(n) + " elements");
  return c;
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
  if (f.members.empty() || f.old_w < 1)
    throw usage_error("a re-cut needs at least one rank on each side");
  return plan_recut(f, even_cut(f.n, f.old_w), even_cut(f.n, static_cast<int>(f.members.size())));
}

std::vector<shard_move> plan_recut(const recut_facts& f, const shard_cut& old_cut,
                                   const shard_cut& new_cut) {
  const int new_w = static_cast<int>(f.members.size());
  if (new_w < 1 || f.old_w < 1) throw usage_error("a re-cut needs at least one rank on each side");
  if (old_cut.w() != f.old_w || new_cut.w() != new_w || old_cut.n != f.n || new_cut.n != f.n)
    throw usage_error("a re-cut's cuts do not match its groups");
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
        s.kind == shard_source::layout ? ranges_held(old_cut, s.old_rank)
                                       : std::vector<elem_range>{};
    for (const elem_range& want : ranges_held(new_cut, k)) {
      for (const elem_range& piece : minus(want, have)) {
        // Split at the old shards' boundaries: each part has its own holders.
        for (int j = 0; j < f.old_w; ++j)
          for (const elem_range& old : old_cut.shards[static_cast<std::size_t>(j)]) {
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
