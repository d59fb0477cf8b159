// Rosters for the step's table tests: N alive members of one generation, ranked and seated
// in order. Test-only; owns nothing else.
#pragma once
#include <cstdint>
#include <string>

#include "runtime/net/membership.hpp"

namespace cohort::step::test {

namespace mb = net::membership;

/// N alive members with ids FIRST_ID.., names "w<id>", rank i and DP seat i, in GENERATION.
inline mb::roster roster_of(uint64_t generation, int n, mb::member_id first_id = 1) {
  mb::roster r;
  r.generation = generation;
  for (int i = 0; i < n; ++i) {
    mb::member m;
    m.id = first_id + static_cast<mb::member_id>(i);
    m.name = "w" + std::to_string(m.id);
    m.rank = i;
    m.at.d = i;
    m.state = mb::member_state::alive;
    r.members.push_back(m);
  }
  return r;
}

}  // namespace cohort::step::test
