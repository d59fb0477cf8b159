// Helpers the membership decision files share (membership.cpp, membership_joins.cpp). Not
// part of the interface: use membership.hpp.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/net/membership.hpp"

namespace cohort::net::membership::detail {

/// Whole milliseconds from FROM to TO.
std::int64_t ms_between(mono_time from, mono_time to);
/// "'name' (member id)", how every reason names a member.
std::string who(member_id id, const std::string& name);
/// Sorts MEMBERS by id (join order) and gives them dense ranks and grid coordinates.
void assign_ranks(std::vector<member>& members, const options& opts);

}  // namespace cohort::net::membership::detail
