// meshrun-ckpt: inspect, verify and export the sharded checkpoints of meshrun-train (docs/trainer.md).
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <new>
#include <string>

#include "meshrun/bounded_file.hpp"

#include "meshrun/train/checkpoint/checkpoint.hpp"
#include "meshrun/train/checkpoint/hf_model.hpp"
#include "meshrun/train/checkpoint/safetensors.hpp"
#include "meshrun/version.hpp"

namespace {

const char* kUsage =
    "usage: meshrun-ckpt inspect PATH [--verify]     step, layout, shards and tensors of a checkpoint\n"
    "       meshrun-ckpt export PATH OUT.safetensors  one Hugging Face safetensors file of the parameters\n"
    "       meshrun-ckpt export PATH OUTDIR [--max-shard-size SIZE]\n"
    "                                                 a Hugging Face model directory (config.json, model.safetensors\n"
    "                                                 or shards of at most SIZE, default 5GB, + index, generation_config.json)\n"
    "  PATH: a checkpoint (DIR/step-N) or a checkpoint.dir (its `latest` is used).\n"
    "  --verify reads every shard piece and checks sizes, headers and hashes.\n";

std::string resolve(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(path) / "manifest.json")) return path;
  const std::string latest = meshrun::train::latest_checkpoint(path);
  if (latest.empty())
    throw meshrun::train::CheckpointError(path + " has neither manifest.json nor latest; give a checkpoint.dir or a step-N directory");
  return latest;
}

// What a checkpoint says (tensor names, the layout's order, paths) is untrusted text: printed through
// cut_value, so a name cannot send terminal escape sequences or split a line (docs/trainer.md).
std::string shown(const std::string& text) { return meshrun::cut_value(text, 1024); }

int inspect(const std::string& arg, bool verify) {
  using namespace meshrun::train;
  const std::string path = resolve(arg);
  const CheckpointInfo info = read_checkpoint_info(path);
  std::int64_t bytes = 0, params = 0;
  for (const auto& e : std::filesystem::directory_iterator(path)) bytes += static_cast<std::int64_t>(e.file_size());
  for (const auto& [name, shape] : info.tensors) params += shape.at(0) * (shape.size() > 1 ? shape[1] : 1);
  std::printf("checkpoint %s\nstep %d, %lld samples consumed, %s\nlayout %s\n%d shard files, %.2f MiB on disk, %lld parameters\n",
              shown(path).c_str(), info.step, static_cast<long long>(info.consumed_samples), shown(info.dtype).c_str(),
              shown(info.layout_text).c_str(),
              info.files, static_cast<double>(bytes) / (1024.0 * 1024.0), static_cast<long long>(params));
  for (const auto& [name, shape] : info.tensors) std::printf("  %-48s %s\n", shown(name).c_str(), shape_text(shape).c_str());
  if (verify) std::printf("verified: %lld pieces (parameters, exp_avg, exp_avg_sq), sizes and hashes match the manifest\n",
                          static_cast<long long>(verify_checkpoint(path)));
  return 0;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// export PATH OUT.safetensors | export PATH OUTDIR [--max-shard-size SIZE]
int export_command(int argc, char** argv) {
  using namespace meshrun::train;
  const std::string out = argv[3];
  std::uint64_t max_shard = kHfDefaultShardBytes;
  bool shard_flag = false;
  for (int i = 4; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--max-shard-size" && i + 1 < argc) max_shard = parse_shard_size(argv[++i]), shard_flag = true;
    else if (a.rfind("--max-shard-size=", 0) == 0) max_shard = parse_shard_size(a.substr(17)), shard_flag = true;
    else throw CheckpointError("unexpected argument " + a + "; usage: meshrun-ckpt export PATH OUTDIR [--max-shard-size SIZE]");
  }
  const std::string path = resolve(argv[2]);
  if (ends_with(out, ".safetensors")) {
    if (shard_flag)
      throw CheckpointError("--max-shard-size applies to the directory form; give an OUTDIR instead of " + out);
    const std::int64_t n = export_checkpoint(path, out);
    std::printf("meshrun-ckpt: wrote %s (%lld bytes) from %s\n", shown(out).c_str(), static_cast<long long>(n), shown(path).c_str());
    return 0;
  }
  const HfExport r = export_hf_directory(path, out, max_shard);
  std::string files;
  for (const std::string& f : r.files) files += (files.empty() ? "" : ", ") + f;
  std::printf("meshrun-ckpt: wrote the Hugging Face model directory %s (%lld bytes, %d weight file%s) from %s: %s\n",
              shown(out).c_str(), static_cast<long long>(r.bytes), r.shards, r.shards == 1 ? "" : "s", shown(path).c_str(),
              shown(files).c_str());
  if (r.tokenizer_files.empty())
    std::printf("meshrun-ckpt: tokenizer files: not yet (the run's byte-level tokenizer has none; token ids are bytes 0-255)\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc >= 2 && (!std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help"))) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (argc == 2 && !std::strcmp(argv[1], "--version")) {
      std::printf("meshrun-ckpt %s\n", meshrun::kVersion);
      return 0;
    }
    if (argc == 3 && (!std::strcmp(argv[1], "inspect") || !std::strcmp(argv[1], "export")) && !std::strcmp(argv[2], "--version")) {
      std::printf("meshrun-ckpt %s %s\n", argv[1], meshrun::kVersion);
      return 0;
    }
    if (argc >= 3 && !std::strcmp(argv[1], "inspect") && (argc == 3 || (argc == 4 && !std::strcmp(argv[3], "--verify"))))
      return inspect(argv[2], argc == 4);
    if (argc >= 4 && !std::strcmp(argv[1], "export")) return export_command(argc, argv);
    std::fputs(kUsage, stderr);
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "meshrun-ckpt: out of memory (std::bad_alloc) reading %s: its manifest or a shard header "
                         "declares more than this machine can hold; check that it is a meshrun checkpoint, or run "
                         "on a machine with more memory\n",
                 argc >= 3 ? meshrun::cut_value(argv[2], 200).c_str() : "the checkpoint");
    return 2;
  } catch (const std::exception& e) {
    // The last line of defence: whatever a message echoes (a tensor name, a path) stays one printable line.
    std::fprintf(stderr, "meshrun-ckpt: %s\n", meshrun::cut_long_values(e.what()).c_str());
    return 2;
  }
}
