// The choices of the comm section (comm.backend, comm.transport, comm.hierarchy,
// comm.compression) as types, with their YAML spellings: parsed once where the config is
// read (config_values.cpp), carried typed to the factory and the gradient path, and spelled
// back only for output (dumps, summaries, logs). What each choice does is runtime/comm's.
#pragma once
#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace cohort {

/// comm.backend: the collective library (runtime/comm/factory.hpp resolves automatic).
enum class comm_backend { automatic, gloo, nccl };
/// comm.transport: how a CPU group moves tensors (automatic: decided per group by rank 0).
enum class comm_transport { automatic, gloo, shm };
/// comm.hierarchy: with transport automatic and several hosts, flat or per-host sums.
enum class comm_hierarchy { automatic, flat, hierarchical };
/// comm.compression: the wire format of the DP gradient sum (none: fp32).
enum class comm_compression { none, bf16, fp16, fp8 };

/// The spelling of each value of a choice, in the order the schema lists them.
template <class E>
struct choice_spellings;
template <>
struct choice_spellings<comm_backend> {
  static constexpr std::array<std::pair<comm_backend, const char*>, 3> words{
      {{comm_backend::automatic, "auto"},
       {comm_backend::gloo, "gloo"},
       {comm_backend::nccl, "nccl"}}};
};
template <>
struct choice_spellings<comm_transport> {
  static constexpr std::array<std::pair<comm_transport, const char*>, 3> words{
      {{comm_transport::automatic, "auto"},
       {comm_transport::gloo, "gloo"},
       {comm_transport::shm, "shm"}}};
};
template <>
struct choice_spellings<comm_hierarchy> {
  static constexpr std::array<std::pair<comm_hierarchy, const char*>, 3> words{
      {{comm_hierarchy::automatic, "auto"},
       {comm_hierarchy::flat, "flat"},
       {comm_hierarchy::hierarchical, "hierarchical"}}};
};
template <>
struct choice_spellings<comm_compression> {
  static constexpr std::array<std::pair<comm_compression, const char*>, 4> words{
      {{comm_compression::none, "none"},
       {comm_compression::bf16, "bf16"},
       {comm_compression::fp16, "fp16"},
       {comm_compression::fp8, "fp8"}}};
};

/// True for the enums above (the config loader reads and writes them as words).
template <class E, class = void>
struct is_choice : std::false_type {};
template <class E>
struct is_choice<E, std::void_t<decltype(choice_spellings<E>::words)>> : std::true_type {};

/// The YAML spelling of `v` ("auto", "gloo", ...): for dumps, summaries and messages.
template <class E, class = std::enable_if_t<is_choice<E>::value>>
const char* to_string(E v) {
  for (const auto& [value, word] : choice_spellings<E>::words)
    if (value == v) return word;
  return "?";  // unreachable: every enumerator has a spelling
}

/// The value spelled `word`, or nullopt when it is none of the spellings (exact match).
template <class E>
std::optional<E> parse_choice(std::string_view word) {
  for (const auto& [value, w] : choice_spellings<E>::words)
    if (word == w) return value;
  return std::nullopt;
}

/// Every spelling of E, in order (the schema's `choices`, messages, CLI checks).
template <class E>
std::vector<std::string> choice_words() {
  std::vector<std::string> out;
  for (const auto& [value, w] : choice_spellings<E>::words) out.emplace_back(w);
  return out;
}

}  // namespace cohort
