// How meshrun-train's ranks fail together (internal to src/run/): every rank makes the same collective
// calls, and a problem found on one rank stops all of them with one line.
#pragma once
#include <stdexcept>
#include <string>

namespace meshrun::train::cli {

// Thrown for input errors: one line, exit 2.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Thrown on every rank for a failure the ranks agreed on that is not the user's input (a checkpoint that
// could not be saved): one line, exit 1.
struct RunFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// All ranks agree on success; false everywhere if any rank failed.
bool all_ok(bool ok);

// Raises on every rank when any rank found a problem (so no rank goes on into a collective alone), with the
// first failing rank's message, which rank 0 prints.
void collective_check(const std::string& why, int rank, int world);

}  // namespace meshrun::train::cli
