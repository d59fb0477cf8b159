// `cohort validate CFG [--set k=v ...]`: checks a config and prints it resolved, and the
// shared --set option every config-taking subcommand uses. Owns no config logic: the
// schema, checks and printing live in runtime/core/config.
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/core/config.hpp"
#include "tools/commands.hpp"

namespace cohort::cli {

std::vector<faults::fault_spec> job_faults(const config& c,
                                           const std::vector<std::string>& inject) {
  std::vector<faults::fault_spec> specs = c.faults;
  for (const auto& text : inject) {
    try {
      specs.push_back(faults::parse_fault(text));
    } catch (const faults::fault_parse_error& e) {
      throw usage_error(std::string("--inject: ") + e.what());
    }
  }
  return specs;
}

void add_set_option(CLI::App& cmd, std::vector<std::string>* overrides) {
  cmd.add_option("--set", *overrides,
                 "Override one config key; the value is parsed as YAML "
                 "(--set parallel.dp=2, --set 'model.hidden=[64,32]'). Repeatable; a later "
                 "--set of the same key wins.")
      ->type_name("KEY=VALUE")
      // One value per --set, so `--set a=1 cfg.yaml` leaves cfg.yaml to the positional.
      ->allow_extra_args(false);
}

void add_observe_options(CLI::App& cmd, std::string* trace, std::string* metrics) {
  cmd.add_option("--trace", *trace,
                 "Write one Chrome trace of the whole job to FILE (open it in Perfetto or "
                 "chrome://tracing): a track per worker and one for the coordinator, workers' "
                 "clocks aligned to the coordinator's (docs/observability.md)")
      ->type_name("FILE");
  if (metrics != nullptr)
    cmd.add_option("--metrics", *metrics,
                   "Serve Prometheus metrics at http://HOST:PORT/metrics while the job runs "
                   "(PORT alone: 127.0.0.1, this machine only; PORT 0: any free port; the "
                   "address is printed at start; beyond loopback it is unauthenticated HTTP, "
                   "docs/security.md)")
        ->type_name("[HOST:]PORT");
}

void add_validate(CLI::App& app, int* rc) {
  struct options {
    std::string path;
    std::vector<std::string> overrides;
    bool hash = false;
    bool reference = false;
    bool keys_markdown = false;
    std::string get;  // --get KEY: one resolved value
  };
  auto opt = std::make_shared<options>();
  CLI::App* cmd = app.add_subcommand(
      "validate",
      "Check a config against the schema. Prints the resolved config (every default filled "
      "in) and exits 0, or prints every problem as FILE:LINE:COL: key: what is wrong (how to "
      "fix) on stderr and exits 2.");
  cmd->add_option("config", opt->path, "YAML config file")->type_name("CFG");
  add_set_option(*cmd, &opt->overrides);
  cmd->add_flag("--hash", opt->hash,
                "Print only the config hash (SHA-256 of the resolved config) instead");
  cmd->add_flag("--reference", opt->reference,
                "Print the reference config (every key, its default and meaning) and exit");
  cmd->add_flag("--keys-markdown", opt->keys_markdown,
                "Print the markdown table of every key (as in docs/config.md) and exit");
  cmd->add_option("--get", opt->get,
                  "Print only the resolved value of one key (dotted, e.g. cluster.workers), "
                  "for scripts such as tools/slurm/cohort.sbatch")
      ->type_name("KEY");
  cmd->callback([opt, rc] {
    if (opt->reference) {
      std::cout << reference_config_yaml();
      *rc = exit_ok;
      return;
    }
    if (opt->keys_markdown) {
      std::cout << config_keys_markdown();
      *rc = exit_ok;
      return;
    }
    if (opt->path.empty()) {
      std::fprintf(stderr,
                   "cohort validate: give a config file (e.g. configs/fashion_mlp.yaml); "
                   "--reference prints every key\n");
      *rc = exit_usage;
      return;
    }
    try {
      const config c = load_config(opt->path, opt->overrides);
      if (!opt->get.empty()) {
        // The resolved config as YAML, walked by the dotted key.
        YAML::Node n = YAML::Load(dump_config(c));
        std::string part;
        std::istringstream path(opt->get);
        while (std::getline(path, part, '.')) {
          if (!n.IsMap() || !n[part]) {
            std::fprintf(stderr, "cohort validate: --get %s: no such key (cohort validate "
                         "--reference lists every key)\n", opt->get.c_str());
            *rc = exit_usage;
            return;
          }
          n = n[part];
        }
        if (n.IsScalar())
          std::cout << n.as<std::string>() << "\n";
        else
          std::cout << YAML::Dump(n) << "\n";
        *rc = exit_ok;
        return;
      }
      std::cout << (opt->hash ? config_hash(c) + "\n" : dump_config(c));
      *rc = exit_ok;
    } catch (const config_error& e) {
      // One issue per line and nothing else, so editors and scripts can parse stderr.
      for (const config_issue& i : e.issues()) std::fprintf(stderr, "%s\n", i.format().c_str());
      *rc = e.exit_status();
    }
  });
}

}  // namespace cohort::cli
