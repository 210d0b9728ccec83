#include "fault_points.hpp"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "meshrun/train/checkpoint/checkpoint.hpp"

namespace meshrun::train {

namespace ckpt {

const std::vector<std::string> kCrashPoints = {"shard",          "shard-fsync", "gathered", "manifest",
                                               "manifest-fsync", "renamed",     "latest-tmp", "latest",
                                               "pruned"};

void CrashHook::at(int s, int r, const std::string& name) {
  if (!active(s, r) || name != point) return;
  if (++hits[name] != k) return;
  if (fail) throw CheckpointError("MESHRUN_CKPT_FAIL: injected write failure at " + name);
  std::fprintf(stderr, "meshrun-train: MESHRUN_CKPT_KILL: rank %d raises SIGKILL in the save of step %d at %s #%d\n", r,
               s, name.c_str(), k);
  std::fflush(stderr);
  std::raise(SIGKILL);
}

CrashHook crash_hook() {
  CrashHook h;
  const char* v = std::getenv("MESHRUN_CKPT_KILL");
  if (!v || !*v) {
    v = std::getenv("MESHRUN_CKPT_FAIL");
    h.fail = true;
  }
  if (!v || !*v) return h;
  std::stringstream ss(v);
  std::string part;
  std::vector<std::string> f;
  while (std::getline(ss, part, ':')) f.push_back(part);
  if (f.size() < 3 || std::find(kCrashPoints.begin(), kCrashPoints.end(), f[2]) == kCrashPoints.end())
    throw CheckpointError(std::string("MESHRUN_CKPT_KILL = \"") + v + "\": expected STEP:RANK:POINT[:K] with POINT one of "
                          "shard, shard-fsync, gathered, manifest, manifest-fsync, renamed, latest-tmp, latest, pruned");
  h.step = std::stoi(f[0]);
  h.rank = std::stoi(f[1]);
  h.point = f[2];
  if (f.size() > 3) h.k = std::stoi(f[3]);
  return h;
}

}  // namespace ckpt

std::vector<std::string> crash_point_names() { return ckpt::kCrashPoints; }

}  // namespace meshrun::train
