// From a layered Config to the inputs of compute_task_env(): the site's policy ([site] and the site file's
// [env], trusted) and the job's extra variables (the template's and flags' [env], allow-listed).
#pragma once
#include <map>
#include <string>

#include "meshrun/config.hpp"
#include "meshrun/task_env.hpp"

namespace meshrun {

struct EnvInputs {
  EnvPolicy policy;
  std::map<std::string, std::string> user_env;
};

EnvInputs env_inputs(const Config& cfg);

}  // namespace meshrun
