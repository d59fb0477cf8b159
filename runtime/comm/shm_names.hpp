// Names of the shared-memory segments shm_comm makes in /dev/shm, and the removal of those a
// process left when it died before unlinking them (SIGKILL during the rendezvous). Owns the
// name's layout, "/cohort-<pid>-n<pid namespace>-<random>-g<generation>", and the rule for
// what is stale; not the segment's contents (shm_comm.hpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace cohort::comm {

/// A fresh segment name for the group of GENERATION, made by this process: its pid and pid
/// namespace are in the name so that a later process can tell whether the maker is gone.
std::string shm_segment_name(std::uint64_t generation);

/// Removes from /dev/shm every segment named by shm_segment_name whose maker is gone: same pid
/// namespace as this process, owned by this user, and no process with its pid exists. Segments of
/// live processes, of other users, of other pid namespaces and anything not named this way are kept
/// (a pid reused since keeps its segment: never one of a live process). Best effort: never throws.
/// Returns the names removed.
std::vector<std::string> remove_stale_shm_segments();

}  // namespace cohort::comm
