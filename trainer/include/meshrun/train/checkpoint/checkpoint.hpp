// Sharded, atomic, resumable checkpoints (docs/trainer.md, "Checkpoints").
//
// A checkpoint is a directory DIR/step-N/ holding one safetensors shard per rank (rank-RRRRR.safetensors:
// what that rank holds — its ZeRO shard region of its TP block of its pipeline units: parameters and both
// AdamW moments, as 1-D pieces) and manifest.json (format version, step, consumed samples, layout, the
// model/training/data settings that must match, every tensor's global shape, and for every shard file
// the global slice and a 64-bit hash of each piece). No rank gathers the model.
//
// Commit protocol: rank 0 creates step-N.tmp/; every rank writes and fsyncs its shard; the pieces'
// descriptions are gathered to rank 0, which writes and fsyncs the manifest and the directory, renames
// step-N.tmp → step-N, fsyncs DIR, writes DIR/latest.tmp ("step-N"), fsyncs it and renames it to
// DIR/latest, then removes complete checkpoints beyond checkpoint.keep; a final barrier. A crash at any
// point leaves `latest` naming the previous complete checkpoint; *.tmp directories are never read.
//
// Loading remaps slices through the manifest: any layout of the same model (tp, pp with any chunking, dp,
// ZeRO stage) reads exactly the elements of its own blocks. Loading does no communication; a problem is a
// CheckpointError (one line naming the file and the tensor or setting) on the ranks that found it.
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshrun/bounded_file.hpp"
#include "meshrun/job.hpp"
#include "meshrun/train/checkpoint/hf_model.hpp"
#include "meshrun/train/run/trainer.hpp"

namespace meshrun::train {

// Its message echoes paths, tensor names and values read from files: made printable and cut where it is built
// (cut_long_values), so every reader prints one safe line.
struct CheckpointError : std::runtime_error {
  explicit CheckpointError(const std::string& message) : std::runtime_error(cut_long_values(message)) {}
};

// 2: manifest_hash, lr_schedule and the shard-list/coverage cross-checks; version 1 still loads.
inline constexpr int kCheckpointFormatVersion = 2;
// Exit status of every rank after a signal-driven stop whose checkpoint was committed (EX_TEMPFAIL).
inline constexpr int kPreemptedExitCode = 75;

struct SaveResult {
  int step = 0;
  double stall_seconds = 0;         // what training waited for: start() (prepare, host copy; sync: the write) + finish()
  bool background = false;          // the shard was written in a background thread (checkpoint.async)
  double work_seconds = 0;          // what the save costs when waited for: stall + the background write
  std::string path;                 // DIR/step-N
  std::int64_t bytes_rank = 0;      // this rank's shard file
  std::int64_t bytes_total = 0;     // every shard + the manifest (rank 0; 0 elsewhere)
  int files = 0;                    // shard files
  double seconds = 0;               // wall time of the whole collective save
  std::vector<std::string> removed; // older checkpoints removed by checkpoint.keep (rank 0)
  bool removing_in_background = false;  // async: `removed` are being removed by a thread (joined by the next save)
};

// What a checkpoint directory says about itself (manifest.json), without reading shards.
struct CheckpointInfo {
  std::string path;  // DIR/step-N
  int step = 0;
  std::int64_t consumed_samples = 0;
  std::string dtype;  // "F32" / "F64"
  Layout layout;
  std::string layout_text;  // "tp=2 cp=1 pp=1 dp=2 ep=1 virtual_stages=1 zero=1 sp=off order=tp-cp-ep-dp-pp"
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> tensors;  // name, global shape
  int files = 0;
};

// The crash points of the save, in order, for the MESHRUN_CKPT_KILL / MESHRUN_CKPT_FAIL test hook
// (described in src/checkpoint/fault_points.hpp).
std::vector<std::string> crash_point_names();

// A save in two halves, so that the write can overlap training (checkpoint.async, docs/trainer.md "Async
// save"). start() is collective: rank 0 prepares step-N.tmp, every rank copies its state into a host staging
// buffer (allocated once, reused; the only part training waits for) and writes its shard from it, in a
// background thread when `background`, else before returning. ready() is collective and cheap: every rank's
// write has ended. finish() is collective: waits for this rank's write, then the commit as above; a failure
// anywhere is a CheckpointError on every rank, after rank 0 removed what the save wrote. The background thread
// makes no MPI call. Destroying a saver waits for a write in flight (it is never dropped) but commits nothing.
template <class T>
class CheckpointSaver {
 public:
  CheckpointSaver(Trainer<T>& trainer, std::string dir, int keep, const DataIdentity& data, bool background);
  ~CheckpointSaver();
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;

  // Allocates and touches the staging buffer now (at start-up), so that no save, a signal's least of all,
  // pays for first-touch page faults. Returns the bytes it holds.
  std::size_t reserve();
  void start(int step);
  bool in_flight() const;
  int step_in_flight() const;
  bool ready();
  SaveResult finish();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Collective over the trainer's world: writes DIR/step-N as described above and keeps the newest `keep`
// complete checkpoints. If any rank fails to write, nothing is committed and every rank throws a
// CheckpointError (the failing rank's message, or that another rank failed). data: the training data's
// identity (SampleSource::identity), recorded so that a resume on other data is refused.
template <class T>
SaveResult save_checkpoint(Trainer<T>& trainer, const std::string& dir, int step, int keep, const DataIdentity& data);

// The committed checkpoint DIR/latest names ("" when DIR has no `latest`). A `latest` that names a missing
// or incomplete directory is a CheckpointError.
std::string latest_checkpoint(const std::string& dir);

// Reads DIR/step-N/manifest.json (CheckpointError naming the file and field on a malformed manifest).
CheckpointInfo read_checkpoint_info(const std::string& path);

// Loads parameters and AdamW moments of the units this rank holds from a checkpoint directory, after
// checking the manifest against the trainer's configuration (model, training schedule and optimizer,
// dtype, data) and every shard piece it reads (file size, header, dtype, shape, hash). Returns the saved
// step (the number of completed steps). No communication; throws CheckpointError on this rank only.
// data: the training data's identity, checked against the manifest's (a checkpoint written before meshrun
// recorded a blend's entries is checked on the token count alone).
template <class T>
int load_checkpoint(Trainer<T>& trainer, const std::string& path, const DataIdentity& data);

// checkpoint.finetune: the parameters alone of checkpoint `path` (a step-N directory), resharded onto this
// run's layout as load_checkpoint places them; the moments and step are not read (the caller starts at step
// 0 with zero moments) and the saved training settings and data are not checked, only the tensors' names,
// shapes and dtype. Returns the step the checkpoint was saved at (for the log). Throws CheckpointError.
template <class T>
int load_checkpoint_weights(Trainer<T>& trainer, const std::string& path);

// The step-N directory checkpoint.finetune = `dir` names: `dir`'s `latest` when it is a checkpoint.dir, `dir`
// itself when it holds a manifest.json. CheckpointError (one line, the fix) when it is neither.
std::string finetune_checkpoint(const std::string& dir);

// One writer per checkpoint directory (docs/trainer.md, "One writer"): takes an exclusive flock on DIR/lock
// for the rest of the process's life and records job, node, host and pid in it. Returns "" when held, else
// one line: another run holds it (naming the holder), or the file system refuses flock.
std::string lock_checkpoint_dir(const std::string& dir);
std::string checkpoint_lock_path(const std::string& dir);

// Status file written by rank 0 into checkpoint.dir (DIR/status) after a stop, read by the batch script:
// one line "saved STEP SIGNAL", "finished STEP" or "not-saved STEP REASON...". Atomic (temp + rename).
void write_status_file(const std::string& dir, const std::string& line);
std::string status_file_path(const std::string& dir);

// One tensor of a checkpoint in its global shape, read from the shards that hold it (rank-agnostic; used
// by the export and inspect tools and the tests). kind: "param", "exp_avg", "exp_avg_sq".
template <class T>
std::vector<T> read_global_tensor(const std::string& path, const std::string& name, const std::string& kind);

// The model a checkpoint holds (its manifest's "model" section) and, when seq_len is not null, the
// training.seq_len it was trained at.
ModelSpec checkpoint_model(const std::string& path, int* seq_len = nullptr);

// Reads every piece of every shard (file size, header, dtype, shape, hash) and checks that every element of
// every tensor and moment is held once; returns the number of pieces. CheckpointError naming file and tensor.
std::int64_t verify_checkpoint(const std::string& path);

// Consolidates a checkpoint's parameters into one safetensors file with the Hugging Face names (the
// checkpoint's dtype), streaming: one tensor in memory at a time. Written to OUT.tmp, fsynced, renamed.
// Returns the bytes written.
std::int64_t export_checkpoint(const std::string& path, const std::string& out);

// A Hugging Face model directory OUTDIR (hf_model.hpp) from a checkpoint's parameters: config.json
// (LlamaForCausalLM or MixtralForCausalLM from the manifest's model settings), model.safetensors, or shards
// model-0000i-of-0000n.safetensors of at most max_shard_bytes each (a larger tensor alone) with
// model.safetensors.index.json, generation_config.json, and the tokenizer files (export_tokenizer_files).
// Streaming, one tensor in memory at a time; written into OUTDIR.tmp, then renamed. OUTDIR must not exist
// or be empty.
struct HfExport {
  std::vector<std::string> files;            // written, in OUTDIR
  std::vector<std::string> tokenizer_files;  // of those, the tokenizer's (none without --tokenizer)
  std::int64_t bytes = 0;
  int shards = 0;
  std::int64_t vocab = 0;  // the model's vocabulary (model.vocab)
};
// tokenizer: a tokenizer.json, SentencePiece .model or model directory to ship with the weights ("": none).
HfExport export_hf_directory(const std::string& path, const std::string& outdir, std::uint64_t max_shard_bytes,
                             const std::string& tokenizer = "");
// The tokenizer the run that wrote checkpoint `path` named (data.tokenizer, absolute), or "" when it had none.
std::string checkpoint_tokenizer(const std::string& path);

// A tokenizer's files copied into outdir under the names transformers reads (tokenizer.json with the
// tokenizer_config.json and special_tokens_map.json beside it, or tokenizer.model); returns their names.
// Refused in one line when it does not load or its vocabulary exceeds `vocab`. A SentencePiece model's special
// pieces go into a special_tokens_map.json; `special` (when given) receives its BOS, EOS and pad ids.
std::vector<std::string> export_tokenizer_files(const std::string& tokenizer, const std::string& outdir, std::int64_t vocab,
                                                SpecialTokenIds* special = nullptr);

}  // namespace meshrun::train
