// Test tool: edits fields of a checkpoint's manifest.json and recomputes its manifest_hash, as a careless
// tool or a hand edit that "fixes" the hash would. The integrity test uses it to show that each cross-check
// (directory, consumed_samples, lr_schedule, shard metadata, coverage) refuses the edit on its own, not only
// the hash. usage: manifest_edit DIR/step-N /json/pointer JSON_VALUE [/pointer VALUE ...]
// The value "auto" for /lr_schedule writes the schedule position that agrees with the (edited) step.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "../../trainer/src/checkpoint/manifest.hpp"
#include "meshrun/train/run/trainer.hpp"

int main(int argc, char** argv) {
  if (argc < 4 || (argc - 2) % 2 != 0) {
    std::fprintf(stderr, "usage: manifest_edit DIR /json/pointer JSON_VALUE [...]\n");
    return 2;
  }
  const std::string file = std::string(argv[1]) + "/manifest.json";
  std::stringstream text;
  text << std::ifstream(file).rdbuf();
  nlohmann::json m = nlohmann::json::parse(text.str());
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "/lr_schedule" && std::string(argv[i + 1]) == "auto") {
      meshrun::TrainingSpec t;
      const auto& tr = m.at("training");
      t.lr = tr.at("lr");
      t.min_lr = tr.at("min_lr");
      t.warmup_steps = tr.at("warmup_steps");
      t.lr_decay_steps = tr.contains("lr_decay_steps") ? tr.at("lr_decay_steps") : tr.at("steps");
      const int step = m.at("step");
      m["lr_schedule"] = {{"completed_steps", step}, {"next_lr", meshrun::train::lr_at(t, step)}};
      continue;
    }
    m[nlohmann::json::json_pointer(argv[i])] = nlohmann::json::parse(argv[i + 1]);
  }
  m["manifest_hash"] = meshrun::train::ckpt::manifest_digest(m);
  std::ofstream(file) << m.dump(1) << "\n";
  return 0;
}
