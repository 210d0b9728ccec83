// Signal-driven stops of meshrun-train (checkpoint.signal and SIGTERM): the handler only records the
// signal; the ranks agree at step boundaries, save, write the status file and exit together.
#pragma once
#include <functional>
#include <string>

namespace meshrun::train::cli {

// From now on checkpoint.signal and SIGTERM ask for a stop; InputError for a signal the trainer cannot catch.
void install_stop_handlers(const std::string& signal);

// The stop bits of every rank, OR-ed (the tiny all-reduce each step boundary): 1 checkpoint.signal, 2 SIGTERM.
int agreed_stop_bits();

// What a stop needs to know of the run's saves.
struct SaveHistory {
  int last_saved = -1;      // the step whose checkpoint is committed
  double last_save_s = -1;  // wall time of the last save (< 0: none yet)
  double last_step_s = 0;
};

// The stop the ranks agreed on (`stop` bits) after step `step` of a run with checkpoint.dir = `dir`: a save
// of the step through `save` (collective; false with *why on failure) unless it is committed or a SIGTERM
// leaves too little time, rank 0's status file and lines, a barrier. Returns every rank's exit status.
int stop_after_step(int stop, int step, const std::string& dir, int rank, const SaveHistory& saves,
                    const std::function<bool(int, std::string*)>& save);

}  // namespace meshrun::train::cli
