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

std::string add_own_submission_shape(StepShape* shape, bool* known, JobGeometry* geometry) {
  TaskShape tasks;
  std::string why;
  const bool ok = own_submission_shape(&tasks, &why, geometry);
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
