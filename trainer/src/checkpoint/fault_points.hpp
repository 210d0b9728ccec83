// Test hook for crash safety, read from the environment by each save and called at its named points;
// kept out of the checkpoint types so that production code carries no test state.
//
// MESHRUN_CKPT_KILL="STEP:RANK:POINT[:K]" makes rank RANK raise SIGKILL during the save of step STEP at its
// K-th (default 1st) crash point named POINT, after printing one line to stderr. Points: shard (after each
// piece is written), shard-fsync, gathered, manifest (half written), manifest-fsync, renamed, latest-tmp,
// latest, pruned. Unset: no effect. MESHRUN_CKPT_FAIL (same syntax) raises a CheckpointError there instead,
// as a failed write would (points up to latest-tmp). crash_point_names() (public header) lists the points.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace meshrun::train::ckpt {

extern const std::vector<std::string> kCrashPoints;  // in save order

struct CrashHook {
  int step = -1, rank = -1, k = 1;
  bool fail = false;  // MESHRUN_CKPT_FAIL: throw (an I/O error) instead of SIGKILL
  std::string point;
  std::map<std::string, int> hits;
  bool active(int s, int r) const { return step == s && rank == r; }
  // Crash point `name` of rank r's save of step s: kills or throws when it is the chosen one.
  void at(int s, int r, const std::string& name);
};

// The hook the environment asks for (inactive when neither variable is set); a malformed value is a
// CheckpointError.
CrashHook crash_hook();

}  // namespace meshrun::train::ckpt
