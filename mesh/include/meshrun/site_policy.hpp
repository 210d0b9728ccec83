// From a layered Config to the inputs of compute_task_env(): the site's policy ([site] and the site file's
// [env], trusted) and the job's extra variables (the template's and flags' [env], allow-listed).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "meshrun/config.hpp"
#include "meshrun/layout.hpp"
#include "meshrun/task_env.hpp"

namespace meshrun {

struct EnvInputs {
  EnvPolicy policy;
  std::map<std::string, std::string> user_env;
};

EnvInputs env_inputs(const Config& cfg);

// The job's variables checked against the policy before anything is submitted or started (the same rules
// compute_task_env() applies per task): one problem (check "env") per refused name, naming where it came from:
// "--mesh-env sets LD_PRELOAD, …" for the plugin's flag, "[env] (t.toml:9:1) sets …" for a template.
std::vector<Problem> check_job_env(const Config& cfg, const EnvPolicy& policy);

}  // namespace meshrun
