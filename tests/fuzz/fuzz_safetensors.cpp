// Target 6: safetensors files (checkpoint.load, checkpoint shards, released Hugging Face checkpoints).
// Contracts: only SafetensorsError escapes; an accepted file's tensors lie inside the file's payload
// (begin <= end <= payload bytes) with as many bytes as shape · dtype size for the dtypes meshrun reads;
// reading any tensor as float and double either gives shape-product values or a SafetensorsError.
#include "fuzz_common.hpp"
#include "meshrun/train/checkpoint/safetensors.hpp"

using namespace meshrun::train;

static meshrun::fuzz::ScratchCleanup cleanup;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = meshrun::fuzz::write_scratch("t.safetensors", data, size);
  try {
    const SafetensorsFile f(path);
    std::uint64_t header = 0;
    for (int i = 0; i < 8 && static_cast<size_t>(i) < size; ++i) header |= std::uint64_t(data[i]) << (8 * i);
    FUZZ_CHECK(size >= 8 && header <= size - 8, "accepted a header longer than the file");
    const std::uint64_t payload = size - 8 - header;
    for (const std::string& name : f.names()) {
      const TensorEntry* e = f.find(name);
      FUZZ_CHECK(e, "names() lists " + name + " but find() misses it");
      FUZZ_CHECK(e->begin <= e->end && e->end <= payload, "tensor " + name + " lies outside the payload");
      std::uint64_t elems = 1;
      bool fits = true;
      for (std::int64_t d : e->shape) {
        FUZZ_CHECK(d >= 0, "negative dimension in " + name);
        fits = fits && (d == 0 || elems <= (std::uint64_t(1) << 40) / std::uint64_t(d));
        elems *= std::uint64_t(d);
      }
      const int width = e->dtype == "F32" ? 4 : e->dtype == "F64" ? 8 : e->dtype == "BF16" ? 2 : 0;
      if (width && fits) FUZZ_CHECK(elems * width == e->end - e->begin, "byte count of " + name + " != shape · dtype size");
      for (int as_double = 0; as_double < 2; ++as_double) {
        try {
          const size_t n = as_double ? f.read<double>(name, e->shape).size() : f.read<float>(name, e->shape).size();
          FUZZ_CHECK(n == elems, "read " + std::to_string(n) + " values of " + name);
        } catch (const SafetensorsError&) {
        }
      }
    }
  } catch (const SafetensorsError& e) {
    FUZZ_CHECK(!std::string(e.what()).empty(), "SafetensorsError message");
  }
  return 0;
}
