// `cohort keygen DIR`: writes a job's CurveZMQ keys (runtime/net/curve.hpp) into DIR; and the
// `--keys DIR` option that coordinator, worker, ctl and launch share.
#include <cstdio>

#include "runtime/net/curve.hpp"
#include "tools/commands.hpp"

namespace cohort::cli {

CLI::Option* add_keys_option(CLI::App& cmd, std::string* dir, const std::string& what) {
  return cmd
      .add_option("--keys", *dir,
                  "Folder of the job's CurveZMQ keys (written by `cohort keygen DIR`); " + what +
                      ". Default: $COHORT_KEYS")
      ->type_name("DIR")
      ->envname("COHORT_KEYS");
}

void add_keygen(CLI::App& app, int* rc) {
  auto dir = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "keygen",
      "Write a job's CurveZMQ keys into DIR (created 0700; files 0600): the coordinator's pair "
      "and one pair per role (worker, launcher, admin), with the list of authorized public "
      "keys. Copy DIR (or coordinator.pub and worker.key) to the hosts whose workers join.");
  cmd->add_option("dir", *dir, "Folder to write (an existing key file is never overwritten)")
      ->type_name("DIR")
      ->required();
  cmd->callback([dir, rc] {
    net::write_job_keys(*dir);
    std::printf(
        "keygen: keys in %s\n"
        "  coordinator:  cohort coordinator --keys %s ...\n"
        "  workers:      cohort worker --join EP --keys %s   (needs coordinator.pub, "
        "worker.key)\n"
        "  ctl:          cohort ctl --keys %s ...            (needs coordinator.pub, "
        "admin.key)\n",
        dir->c_str(), dir->c_str(), dir->c_str(), dir->c_str());
    *rc = exit_ok;
  });
}

}  // namespace cohort::cli
