// Target 8: checkpoint manifests (DIR/step-N/manifest.json), read by `meshrun-ckpt inspect`, resumes and
// checkpoint.load. The input is the manifest; the directory has no shards, so verification must refuse it.
// Contracts: only CheckpointError escapes (no JSON library exception, no out_of_range); a manifest that
// lists shard files cannot verify without them.
#include "fuzz_common.hpp"
#include "meshrun/train/checkpoint/checkpoint.hpp"

using namespace meshrun::train;

static meshrun::fuzz::ScratchCleanup cleanup;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  meshrun::fuzz::write_scratch("manifest.json", data, size);
  const std::string dir = meshrun::fuzz::scratch_dir().string();
  int files = -1;
  try {
    const CheckpointInfo info = read_checkpoint_info(dir);
    FUZZ_CHECK(info.files >= 0 && !info.layout_text.empty(), "checkpoint info");
    files = info.files;
  } catch (const CheckpointError& e) {
    FUZZ_CHECK(!std::string(e.what()).empty(), "CheckpointError message");
  }
  try {
    verify_checkpoint(dir);
    // (verification reads only what it needs: a manifest read_checkpoint_info refuses may still verify)
    if (files >= 0) FUZZ_CHECK(files == 0, "a manifest listing " + std::to_string(files) + " shard files verified without them");
  } catch (const CheckpointError& e) {
    FUZZ_CHECK(!std::string(e.what()).empty(), "CheckpointError message");
  }
  return 0;
}
