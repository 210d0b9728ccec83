#include "local_shape.hpp"

#include <unistd.h>

#include <cstdlib>

#include "job_geometry.hpp"

namespace meshrun::plugin {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

StepShape local_step_shape() {
  StepShape shape;
  char buf[4096];
  if (getcwd(buf, sizeof buf)) shape.cwd = buf;
  shape.site_config = env_or_empty("MESHRUN_SITE_CONFIG");
  return shape;
}

std::string add_own_submission_shape(StepShape* shape, bool* known, JobGeometry* geometry, const MeshOptions* opts) {
  TaskShape tasks;
  std::string why;
  std::vector<TaskShape> het;
  bool ok = own_submission_shape(&tasks, &why, geometry, opts ? &het : nullptr);
  if (!ok && why.empty() && het.size() > 1) {
    std::string flags;
    auto add = [&](const std::optional<int>& v, const char* name) {
      if (v) flags += (flags.empty() ? "" : " ") + std::string(name) + "=" + std::to_string(*v);
    };
    add(opts->tp, "--mesh-tp");
    add(opts->cp, "--mesh-cp");
    add(opts->pp, "--mesh-pp");
    const int group = opts->tp.value_or(1) * opts->cp.value_or(1) * opts->pp.value_or(1);
    why = het_shape_problem(het, group, flags, &tasks);
    ok = why.empty();
  }
  if (known) *known = ok;
  if (ok) {
    shape->nodes = tasks.nodes;
    shape->tasks = tasks.tasks;
    shape->gpus_per_node = tasks.gpus_per_node;
    return "";
  }
  return why;
}

}  // namespace meshrun::plugin
