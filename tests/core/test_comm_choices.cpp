// The comm section's choices (runtime/core/comm_choices.hpp): every YAML spelling parses to
// its enum once, in the loader, and reads back the same in the dump; a word that is none of
// them is refused at its line and column with the choices and a suggestion.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "runtime/core/config.hpp"

using cohort::comm_backend;
using cohort::comm_compression;
using cohort::comm_hierarchy;
using cohort::comm_transport;
using cohort::config;
using cohort::config_error;

namespace {

// The config of "comm:\n  KEY: WORD\n".
config with(const std::string& key, const std::string& word) {
  return cohort::load_config_text("comm:\n  " + key + ": " + word + "\n", "c.yaml");
}

// The message of the one issue loading "comm:\n  KEY: WORD\n" gives.
std::string refusal(const std::string& key, const std::string& word) {
  try {
    with(key, word);
  } catch (const config_error& e) {
    REQUIRE(e.issues().size() == 1);
    CHECK(e.issues()[0].key == "comm." + key);
    return e.issues()[0].format();
  }
  FAIL("comm." << key << ": " << word << " was accepted");
  return "";
}

// Every word of E parses to its enumerator and prints back as the same word.
template <class E>
void spells_back(const std::vector<std::pair<std::string, E>>& table) {
  CHECK(cohort::choice_words<E>().size() == table.size());
  for (const auto& [word, value] : table) {
    CAPTURE(word);
    CHECK(cohort::parse_choice<E>(word) == value);
    CHECK(std::string(cohort::to_string(value)) == word);
  }
  CHECK_FALSE(cohort::parse_choice<E>("").has_value());
  CHECK_FALSE(cohort::parse_choice<E>(table[0].first + " ").has_value());  // exact words only
}

}  // namespace

TEST_CASE("each comm choice has one spelling per value, read and printed the same") {
  spells_back<comm_backend>({{"auto", comm_backend::automatic},
                             {"gloo", comm_backend::gloo},
                             {"nccl", comm_backend::nccl}});
  spells_back<comm_transport>({{"auto", comm_transport::automatic},
                               {"gloo", comm_transport::gloo},
                               {"shm", comm_transport::shm}});
  spells_back<comm_hierarchy>({{"auto", comm_hierarchy::automatic},
                               {"flat", comm_hierarchy::flat},
                               {"hierarchical", comm_hierarchy::hierarchical}});
  spells_back<comm_compression>({{"none", comm_compression::none},
                                 {"bf16", comm_compression::bf16},
                                 {"fp16", comm_compression::fp16},
                                 {"fp8", comm_compression::fp8}});
}

TEST_CASE("the loader parses every accepted comm word into its enum, and dumps it back") {
  // backend: nccl is a word of the key but refused by a rule (config_rules), tested there.
  CHECK(with("backend", "auto").comm.backend == comm_backend::automatic);
  CHECK(with("backend", "gloo").comm.backend == comm_backend::gloo);
  CHECK(with("transport", "auto").comm.transport == comm_transport::automatic);
  CHECK(with("transport", "gloo").comm.transport == comm_transport::gloo);
  CHECK(with("transport", "shm").comm.transport == comm_transport::shm);
  CHECK(with("hierarchy", "auto").comm.hierarchy == comm_hierarchy::automatic);
  CHECK(with("hierarchy", "flat").comm.hierarchy == comm_hierarchy::flat);
  CHECK(with("hierarchy", "hierarchical").comm.hierarchy == comm_hierarchy::hierarchical);
  CHECK(with("compression", "none").comm.compression == comm_compression::none);
  CHECK(with("compression", "bf16").comm.compression == comm_compression::bf16);
  CHECK(with("compression", "fp16").comm.compression == comm_compression::fp16);
  CHECK(with("compression", "fp8").comm.compression == comm_compression::fp8);

  // --set takes the same words; the dump writes them as plain words.
  const config c = cohort::load_config_text(
      "comm:\n  transport: gloo\n", "c.yaml",
      {"comm.transport=shm", "comm.compression=bf16", "comm.hierarchy=flat"});
  CHECK(c.comm.transport == comm_transport::shm);
  CHECK(c.comm.compression == comm_compression::bf16);
  const std::string dump = cohort::dump_config(c);
  CHECK(dump.find("  transport: shm\n") != std::string::npos);
  CHECK(dump.find("  compression: bf16\n") != std::string::npos);
  CHECK(dump.find("  hierarchy: flat\n") != std::string::npos);
  CHECK(dump.find("  backend: auto\n") != std::string::npos);
  const config back = cohort::load_config_text(dump, "dump.yaml");
  CHECK(back.comm.transport == c.comm.transport);
  CHECK(back.comm.compression == c.comm.compression);
  CHECK(back.comm.hierarchy == c.comm.hierarchy);
  CHECK(back.comm.backend == c.comm.backend);
}

TEST_CASE("a word that is none of a comm choice's is refused where it is written") {
  CHECK(refusal("backend", "mpi") ==
        "c.yaml:2:12: comm.backend: 'mpi' is not allowed (use one of auto, gloo, nccl)");
  CHECK(refusal("transport", "shmm") ==
        "c.yaml:2:14: comm.transport: 'shmm' is not allowed (use one of auto, gloo, shm; did "
        "you mean shm?)");
  CHECK(refusal("hierarchy", "ring") ==
        "c.yaml:2:14: comm.hierarchy: 'ring' is not allowed (use one of auto, flat, "
        "hierarchical)");
  CHECK(refusal("compression", "fp4") ==
        "c.yaml:2:16: comm.compression: 'fp4' is not allowed (use one of none, bf16, fp16, fp8; "
        "did you mean fp8?)");
  // Case matters: the spellings are the words, nothing near them.
  CHECK(refusal("transport", "GLOO").find("'GLOO' is not allowed") != std::string::npos);
  // A list is not a word.
  CHECK(refusal("compression", "[fp8]").find("expected one of none, bf16, fp16, fp8") !=
        std::string::npos);
}
