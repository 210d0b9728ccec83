// meshrun-ckpt: inspect, verify and export the sharded checkpoints of meshrun-train (docs/trainer.md).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "meshrun/bounded_file.hpp"

#include "meshrun/train/checkpoint/checkpoint.hpp"
#include "meshrun/train/checkpoint/hf_model.hpp"
#include "meshrun/train/checkpoint/safetensors.hpp"
#include "meshrun/train/run/generate.hpp"
#include "meshrun/train/tokenizer/tokenizer.hpp"
#include "meshrun/version.hpp"

namespace {

const char* kUsage =
    "usage: meshrun-ckpt inspect PATH [--verify]     step, layout, shards and tensors of a checkpoint\n"
    "       meshrun-ckpt export PATH OUT.safetensors  one Hugging Face safetensors file of the parameters\n"
    "       meshrun-ckpt export PATH OUTDIR [--max-shard-size SIZE] [--tokenizer TOK]\n"
    "                                                 a Hugging Face model directory (config.json, model.safetensors\n"
    "                                                 or shards of at most SIZE, default 5GB, + index, generation_config.json,\n"
    "                                                 and TOK's files: tokenizer.json + tokenizer_config.json, or tokenizer.model)\n"
    "       meshrun-ckpt sample PATH --prompt TEXT [--tokenizer TOK] [--max-new-tokens N] [--temperature T] [--top-p P]\n"
    "                           [--seed S] [--ids]\n"
    "                                                 generate from the checkpoint's model (world 1, KV cache; CUDA when\n"
    "                                                 a device is visible, else CPU); defaults N 64, T 1 (0: greedy), P 1, S 0;\n"
    "                                                 the prompt through TOK (a tokenizer.json, .model or model directory),\n"
    "                                                 else byte-level; --ids also prints the new token ids\n"
    "  PATH: a checkpoint (DIR/step-N) or a checkpoint.dir (its `latest` is used); sample also takes a Hugging Face\n"
    "  model directory (meshrun-ckpt export's OUTDIR), its tokenizer.json or tokenizer.model used unless --tokenizer.\n"
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
  std::string tokenizer;
  for (int i = 4; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc) tokenizer = argv[++i];
    else if (a == "--max-shard-size" && i + 1 < argc) max_shard = parse_shard_size(argv[++i]), shard_flag = true;
    else if (a.rfind("--max-shard-size=", 0) == 0) max_shard = parse_shard_size(a.substr(17)), shard_flag = true;
    else throw CheckpointError("unexpected argument " + shown(a) + "; usage: meshrun-ckpt export PATH OUTDIR [--max-shard-size SIZE] [--tokenizer TOK]");
  }
  const std::string path = resolve(argv[2]);
  if (ends_with(out, ".safetensors")) {
    if (shard_flag || !tokenizer.empty())
      throw CheckpointError(std::string(shard_flag ? "--max-shard-size" : "--tokenizer") +
                            " applies to the directory form; give an OUTDIR instead of " + out);
    const std::int64_t n = export_checkpoint(path, out);
    std::printf("meshrun-ckpt: wrote %s (%lld bytes) from %s\n", shown(out).c_str(), static_cast<long long>(n), shown(path).c_str());
    return 0;
  }
  // The run's own tokenizer (data.tokenizer, recorded in the manifest) unless --tokenizer names another.
  std::string note;
  if (tokenizer.empty()) {
    const std::string recorded = checkpoint_tokenizer(path);
    if (!recorded.empty() && std::filesystem::exists(recorded)) tokenizer = recorded;
    else if (!recorded.empty()) note = " (the run's data.tokenizer " + shown(recorded) + " is not there; give --tokenizer)";
  }
  const HfExport r = export_hf_directory(path, out, max_shard, tokenizer);
  std::string files;
  for (const std::string& f : r.files) files += (files.empty() ? "" : ", ") + f;
  std::printf("meshrun-ckpt: wrote the Hugging Face model directory %s (%lld bytes, %d weight file%s) from %s: %s\n",
              shown(out).c_str(), static_cast<long long>(r.bytes), r.shards, r.shards == 1 ? "" : "s", shown(path).c_str(),
              shown(files).c_str());
  // Byte-level only when the vocabulary is the 256 bytes: a larger one's ids came from a tokenizer (or are unused).
  if (r.tokenizer_files.empty() && note.empty())
    note = r.vocab > 256 ? " (no --tokenizer and no data.tokenizer in the run, and its model.vocab = " + std::to_string(r.vocab) +
                               " is more than the 256 byte ids: the ids are not bytes unless its data was; give --tokenizer "
                               "with the tokenizer that made its data)"
                         : " (no --tokenizer and no data.tokenizer in the run: a byte-level run's ids are bytes 0-255)";
  if (r.tokenizer_files.empty())
    std::printf("meshrun-ckpt: no tokenizer files%s\n", note.c_str());
  else
    std::printf("meshrun-ckpt: tokenizer files from %s\n", shown(tokenizer).c_str());
  return 0;
}

// The prompt's token ids: through the tokenizer when one is given (its special tokens added, as
// transformers' encode does), else byte-level (meshrun-tokenize without --tokenizer: each UTF-8 byte is one id).
std::vector<std::int32_t> encode_prompt(const std::string& text, std::int64_t vocab, const meshrun::train::Tokenizer* tok) {
  std::vector<std::int32_t> ids;
  if (tok) {
    for (std::uint32_t id : tok->encode(text, true)) ids.push_back(static_cast<std::int32_t>(id));
    return ids;
  }
  if (vocab < 256)
    throw meshrun::train::CheckpointError("the model's vocabulary has " + std::to_string(vocab) +
                                          " tokens, fewer than the byte-level tokenizer's 256; give --tokenizer");
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}
// The text of ids: the tokenizer's decoder, else bytes 0-255 (another id shown as <id>).
std::string decode_tokens(const std::vector<std::int32_t>& ids, const meshrun::train::Tokenizer* tok) {
  if (tok) return tok->decode(std::vector<std::uint32_t>(ids.begin(), ids.end()));
  std::string out;
  for (std::int32_t t : ids) out += t < 256 ? std::string(1, static_cast<char>(t)) : "<" + std::to_string(t) + ">";
  return out;
}

// Generated text on a terminal: newlines and tabs as they are, other control bytes escaped (\xNN).
std::string terminal_safe(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c == '\n' || c == '\t' || (c >= 0x20 && c != 0x7f)) {
      out += static_cast<char>(c);
    } else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    }
  }
  return out;
}

// A number option's value, the whole text, or one line naming the option.
template <class V>
V option_value(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  V v{};
  try {
    if constexpr (std::is_same_v<V, double>) v = std::stod(text, &used);
    else if constexpr (std::is_same_v<V, std::uint64_t>) v = text.empty() || text[0] == '-' ? throw std::invalid_argument("") : std::stoull(text, &used);
    else v = static_cast<V>(std::stoi(text, &used));
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty())
    throw meshrun::train::CheckpointError(flag + " " + shown(text) + " is not a number; see meshrun-ckpt --help");
  return v;
}

// sample PATH --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-p P] [--seed S] [--ids]
int sample_command(int argc, char** argv) {
  using namespace meshrun::train;
  namespace dev = meshrun::device;
  SampleOptions o;
  std::string prompt;
  bool have_prompt = false, print_ids = false;
  std::string tokenizer;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw CheckpointError(a + " needs a value; see meshrun-ckpt --help");
      return argv[++i];
    };
    if (a == "--prompt") prompt = value(), have_prompt = true;
    else if (a == "--tokenizer") tokenizer = value();
    else if (a == "--max-new-tokens") o.max_new_tokens = option_value<int>(a, value());
    else if (a == "--temperature") o.temperature = option_value<double>(a, value());
    else if (a == "--top-p") o.top_p = option_value<double>(a, value());
    else if (a == "--seed") o.seed = option_value<std::uint64_t>(a, value());
    else if (a == "--ids") print_ids = true;
    else throw CheckpointError("unexpected argument " + shown(a) + "; usage: meshrun-ckpt sample PATH --prompt TEXT [--tokenizer TOK] [--max-new-tokens N] "
                               "[--temperature T] [--top-p P] [--seed S] [--ids]");
  }
  if (!have_prompt) throw CheckpointError("sample needs --prompt TEXT");
  // A Hugging Face model directory (meshrun-ckpt export's, or any checkpoint.load = DIR accepts): the model its
  // config.json describes, loaded as checkpoint.load loads it, with the directory's tokenizer files by default.
  const bool hf_dir = is_hf_model_dir(argv[2]);
  const std::string path = hf_dir ? std::string(argv[2]) : resolve(argv[2]);
  int trained_positions = 0;  // the run's training.seq_len, or config.json's max_position_embeddings
  const meshrun::ModelSpec model = hf_dir ? hf_dir_model(path, &trained_positions) : checkpoint_model(path, &trained_positions);
  if (tokenizer.empty() && hf_dir) {
    if (dir_has_tokenizer(path)) tokenizer = path;
  } else if (tokenizer.empty()) {  // the run's own (data.tokenizer), which its token ids mean
    tokenizer = checkpoint_tokenizer(path);
    if (!tokenizer.empty() && !std::filesystem::exists(tokenizer))
      throw CheckpointError("the run was trained with data.tokenizer " + shown(tokenizer) + ", which is not there; give --tokenizer");
  }
  std::unique_ptr<Tokenizer> tok;
  if (!tokenizer.empty()) {
    try {
      tok = load_tokenizer(tokenizer);
    } catch (const TokenizerError& e) {
      throw CheckpointError("--tokenizer: " + e.msg);
    }
    if (static_cast<std::int64_t>(tok->vocab_size()) > model.vocab)
      throw CheckpointError("--tokenizer " + shown(tokenizer) + " has " + std::to_string(tok->vocab_size()) +
                            " tokens but the model's vocabulary is " + std::to_string(model.vocab) +
                            "; give the tokenizer the run was trained with");
  }
  const std::vector<std::int32_t> ids = encode_prompt(prompt, model.vocab, tok.get());
  if (const std::string why = check_sample_options(o, ids.size()); !why.empty()) throw CheckpointError(why);
  // The CUDA backend where this build has it and a device is visible, else the CPU's; fp32 either way.
  std::unique_ptr<dev::Backend> backend;
  std::string why;
  if (const int visible = dev::cuda_device_count(&why); visible > 0)
    backend = dev::make_cuda_backend(dev::Precision::cuda("fp32", "fp32", "fp32"), dev::task_cuda_device(visible));
  else
    backend = dev::make_cpu_backend("fp32");
  const std::unique_ptr<HfModelDir> dir = hf_dir ? std::make_unique<HfModelDir>(path, model) : nullptr;
  const bool f64 = !dir && read_checkpoint_info(path).dtype == "F64";
  const TensorSource weights = [&](const std::string& name, const std::vector<std::int64_t>& shape) {
    if (dir) return dir->read<float>(name, shape);
    if (!f64) return read_global_tensor<float>(path, name, "param");
    const std::vector<double> v = read_global_tensor<double>(path, name, "param");
    return std::vector<float>(v.begin(), v.end());
  };
  Generator gen(model, static_cast<std::int64_t>(ids.size()) + o.max_new_tokens, weights, std::move(backend));
  // After the weights loaded: a refused directory says only why.
  const long long reach = static_cast<long long>(ids.size()) + o.max_new_tokens;
  if (trained_positions > 0 && reach > trained_positions)
    std::fprintf(stderr, "meshrun-ckpt: warning: the prompt (%zu tokens) and --max-new-tokens %d reach %lld positions, past the "
                         "%d the model was trained on (%s); it has never attended that far, so the text beyond position %d "
                         "is unlikely to be coherent\n", ids.size(), o.max_new_tokens, reach, trained_positions,
                 hf_dir ? "config.json max_position_embeddings" : "training.seq_len", trained_positions);
  std::fprintf(stderr, "meshrun-ckpt: sampling from %s on the %s backend: %zu prompt tokens, up to %d new, temperature %g, "
                       "top-p %g, seed %llu\n", shown(path).c_str(), gen.backend().name().c_str(), ids.size(), o.max_new_tokens,
               o.temperature, o.top_p, static_cast<unsigned long long>(o.seed));
  std::fputs(terminal_safe(prompt).c_str(), stdout);
  // The new text so far is decoded whole each time and only its new end printed: a multi-byte character or a
  // merge that spans tokens appears once complete.
  std::vector<std::int32_t> fresh;
  std::size_t shown_bytes = 0;
  const std::vector<std::int32_t> out = gen.generate(ids, o, [&](std::int32_t t) {
    fresh.push_back(t);
    const std::string text = decode_tokens(fresh, tok.get());
    if (text.size() > shown_bytes) std::fputs(terminal_safe(text.substr(shown_bytes)).c_str(), stdout);
    shown_bytes = std::max(shown_bytes, text.size());
    std::fflush(stdout);
  });
  std::fputs("\n", stdout);
  if (print_ids) {
    std::printf("ids:");
    for (std::int32_t t : out) std::printf(" %d", t);
    std::printf("\n");
  }
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
    if (argc == 3 && (!std::strcmp(argv[1], "inspect") || !std::strcmp(argv[1], "export") || !std::strcmp(argv[1], "sample")) && !std::strcmp(argv[2], "--version")) {
      std::printf("meshrun-ckpt %s %s\n", argv[1], meshrun::kVersion);
      return 0;
    }
    if (argc >= 3 && !std::strcmp(argv[1], "inspect") && (argc == 3 || (argc == 4 && !std::strcmp(argv[3], "--verify"))))
      return inspect(argv[2], argc == 4);
    if (argc >= 4 && !std::strcmp(argv[1], "export")) return export_command(argc, argv);
    if (argc >= 3 && !std::strcmp(argv[1], "sample")) return sample_command(argc, argv);
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
