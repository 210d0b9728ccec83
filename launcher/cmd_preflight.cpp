// meshrun preflight: runs meshrun-preflight (launcher/preflight_main.cpp), which links MPI and the CPU kernels,
// so that the meshrun CLI itself loads neither (meshrun exec starts every task of a job).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "commands.hpp"
#include "launch_common.hpp"
#include "meshrun/bounded_file.hpp"

extern char** environ;

int cmd_preflight(int argc, char** argv) {
  namespace fs = std::filesystem;
  // Next to this binary (install tree /usr/bin, build tree launcher/), else on $PATH.
  std::string helper = "meshrun-preflight";
  const std::string self = meshrun::launch::self_path();
  if (self != "meshrun") {
    const fs::path next = fs::path(self).parent_path() / "meshrun-preflight";
    if (::access(next.c_str(), X_OK) == 0) helper = next.string();
  }
  if (helper == "meshrun-preflight") {
    auto env = meshrun::environment_map(environ);
    if (auto found = meshrun::launch::find_in_path(helper, env)) helper = *found;
    else {
      std::fprintf(stderr, "meshrun preflight: meshrun-preflight is not installed next to %s nor on $PATH; build or "
                           "install it (target meshrun-preflight)\n", meshrun::cut_value(self).c_str());
      return 2;
    }
  }
  std::vector<char*> args{helper.data()};
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execv(helper.c_str(), args.data());
  std::fprintf(stderr, "meshrun preflight: cannot run %s: %s\n", meshrun::cut_value(helper).c_str(), std::strerror(errno));
  return 2;
}
