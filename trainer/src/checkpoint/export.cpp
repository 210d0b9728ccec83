// Rank-agnostic reading of a whole checkpoint (meshrun-ckpt and the tests): one tensor in its global
// shape, verification of every piece, and export to one safetensors file.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include "file_io.hpp"
#include "manifest.hpp"
#include "meshrun/train/checkpoint/checkpoint.hpp"
#include "meshrun/train/tokenizer/tokenizer.hpp"
#include "meshrun/train/checkpoint/hf_model.hpp"

namespace meshrun::train {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace ckpt;


namespace {
// Tensor `name` (kind k) in its global shape from the shards of a parsed manifest into out (R × C elements,
// not initialized: every element is read, counted against the exact coverage read_manifest proved);
// readers and buffers are reused.
template <class T>
void global_tensor(const Manifest& m, const std::string& name, int k, std::map<std::string, std::unique_ptr<ShardReader>>& readers,
                   T* out, GrowBuffer<T>& staging) {
  auto it = m.shapes.find(name);
  if (it == m.shapes.end()) throw CheckpointError(m.file + ": no tensor " + name);
  const std::int64_t R = it->second.at(0), C = it->second.size() > 1 ? it->second[1] : 1;
  std::int64_t placed = 0;
  for (const ManifestFile& f : m.files)
    for (const ManifestPiece& p : f.pieces) {
      if (p.tensor != name || p.kind != k) continue;
      auto& reader = readers[f.name];
      if (!reader) reader = open_shard(m, f);
      placed += place_piece(*reader, p, m.dtype, 0, 0, R, C, out, staging);
    }
  if (placed != R * C)
    throw CheckpointError(m.file + ": tensor " + piece_key(name, k) + ": the shards hold " + std::to_string(placed) + " of " +
                          std::to_string(R * C) + " elements; the checkpoint is incomplete");
}

std::size_t numel_of(const Manifest& m, const std::string& name) {
  auto it = m.shapes.find(name);
  if (it == m.shapes.end()) throw CheckpointError(m.file + ": no tensor " + name);
  return static_cast<std::size_t>(it->second.at(0) * (it->second.size() > 1 ? it->second[1] : 1));
}

int kind_index(const std::string& kind) {
  const int k = kind == "param" ? 0 : kind == "exp_avg" ? 1 : kind == "exp_avg_sq" ? 2 : -1;
  if (k < 0) throw CheckpointError("kind must be param, exp_avg or exp_avg_sq, not \"" + kind + "\"");
  return k;
}
}  // namespace

template <class T>
std::vector<T> read_global_tensor(const std::string& path, const std::string& name, const std::string& kind) {
  const Manifest m = read_manifest(path);
  if (m.dtype != dtype_name<T>()) throw CheckpointError(m.file + ": holds " + m.dtype + " values");
  const int k = kind_index(kind);
  std::map<std::string, std::unique_ptr<ShardReader>> readers;
  GrowBuffer<T> staging;
  std::vector<T> out(numel_of(m, name));
  global_tensor<T>(m, name, k, readers, out.data(), staging);
  return out;
}

ModelSpec checkpoint_model(const std::string& path, int* seq_len) { return manifest_model(read_manifest(path), seq_len); }

std::int64_t verify_checkpoint(const std::string& path) {
  const Manifest m = read_manifest(path);  // every structural check, exact coverage included
  std::int64_t n = 0;
  for (const ManifestFile& f : m.files) {
    const std::unique_ptr<ShardReader> reader = open_shard(m, f);
    for (const ManifestPiece& p : f.pieces) {
      reader->verify(p.key, m.dtype, p.b - p.a, p.hash);
      ++n;
    }
  }
  return n;
}

namespace {
// One safetensors file of the checkpoint's parameters `names` (in that order, the checkpoint's dtype),
// streaming: one tensor in memory at a time, in a buffer reused across tensors. Written to OUT.tmp, fsynced,
// renamed. Returns the bytes written.
std::int64_t write_tensor_file(const Manifest& m, const std::vector<std::string>& names, const std::string& out,
                               std::map<std::string, std::unique_ptr<ShardReader>>& readers) {
  const std::size_t es = m.dtype == "F64" ? 8 : 4;
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}, {"producer", "meshrun-ckpt export"}, {"step", std::to_string(m.step)}};
  std::uint64_t off = 0;
  for (const std::string& name : names) {
    const auto& shape = m.shapes.at(name);
    const std::uint64_t bytes = static_cast<std::uint64_t>(shape.at(0) * (shape.size() > 1 ? shape[1] : 1)) * es;
    header[name] = {{"dtype", m.dtype}, {"shape", shape}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h += ' ';
  const std::string tmp = out + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw CheckpointError("cannot write " + tmp + ": " + errno_text() + "; check the output directory");
  unsigned char len[8];
  for (int b = 0; b < 8; ++b) len[b] = static_cast<unsigned char>((static_cast<std::uint64_t>(h.size()) >> (8 * b)) & 0xff);
  try {
    write_all(fd, len, 8, tmp);
    write_all(fd, h.data(), h.size(), tmp);
    auto write_tensors = [&](auto tag) {
      using T = decltype(tag);
      GrowBuffer<T> buf, staging;
      for (const std::string& name : names) {
        const std::size_t numel = numel_of(m, name);
        T* v = buf.get(numel);
        global_tensor<T>(m, name, 0, readers, v, staging);
        write_all(fd, v, numel * sizeof(T), tmp);
      }
    };
    if (es == 8) write_tensors(double{});
    else write_tensors(float{});
    if (::fsync(fd) != 0) throw CheckpointError("fsync of " + tmp + " failed: " + errno_text());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), out.c_str()) != 0) throw CheckpointError("renaming " + tmp + " failed: " + errno_text());
  return static_cast<std::int64_t>(8 + h.size() + off);
}

std::size_t tensor_bytes(const Manifest& m, const std::string& name) { return numel_of(m, name) * (m.dtype == "F64" ? 8 : 4); }
}  // namespace

std::int64_t export_checkpoint(const std::string& path, const std::string& out) {
  const Manifest m = read_manifest(path);
  std::map<std::string, std::unique_ptr<ShardReader>> readers;
  return write_tensor_file(m, m.order, out, readers);
}

std::string checkpoint_tokenizer(const std::string& path) {
  const Manifest m = read_manifest(path);
  const auto it = m.root.find("tokenizer");
  if (it == m.root.end()) return "";
  if (!it->is_string()) throw CheckpointError(m.file + ": field tokenizer is not a string; the manifest is damaged");
  return it->get<std::string>();
}

std::vector<std::string> export_tokenizer_files(const std::string& tokenizer, const std::string& outdir, std::int64_t vocab,
                                                SpecialTokenIds* special) {
  if (tokenizer.empty()) return {};
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = load_tokenizer(tokenizer);
  } catch (const TokenizerError& e) {
    throw CheckpointError("--tokenizer: " + e.msg);
  }
  if (static_cast<std::int64_t>(tok->vocab_size()) > vocab)
    throw CheckpointError("--tokenizer " + tokenizer + " has " + std::to_string(tok->vocab_size()) + " tokens but the model's vocabulary is " +
                          std::to_string(vocab) + "; give the tokenizer the run was trained with");
  // Which files: those load_tokenizer read, under Hugging Face's names, and for a tokenizer.json the
  // special_tokens_map.json beside it (meshrun does not read it; transformers does).
  const TokenizerFiles files = tokenizer_files(tokenizer);
  std::vector<std::pair<fs::path, std::string>> copy{{files.tokenizer, files.hf_json ? "tokenizer.json" : "tokenizer.model"}};
  if (!files.config.empty()) copy.push_back({files.config, "tokenizer_config.json"});
  const fs::path special_map = fs::path(files.tokenizer).parent_path() / "special_tokens_map.json";
  if (files.hf_json && fs::exists(special_map)) copy.push_back({special_map, "special_tokens_map.json"});
  if (special) *special = {tok->bos_id(), tok->eos_id(), tok->pad_id()};
  std::vector<std::string> names;
  for (const auto& [from, name] : copy) {
    std::error_code ec;
    fs::copy_file(from, fs::path(outdir) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) throw CheckpointError("cannot copy " + from.string() + " into the export: " + ec.message());
    names.push_back(name);
  }
  // A SentencePiece model defines its special tokens inside the .model: transformers' LlamaTokenizer would
  // otherwise assume <s>, </s> and <unk>, so their pieces are written as special_tokens_map.json.
  if (!files.hf_json) {
    json map = json::object();
    const std::pair<const char*, std::optional<std::uint32_t>> named[] = {
        {"bos_token", tok->bos_id()}, {"eos_token", tok->eos_id()}, {"unk_token", tok->unk_id()}, {"pad_token", tok->pad_id()}};
    for (const auto& [key, id] : named)
      if (id && !tok->token_text(*id).empty()) map[key] = tok->token_text(*id);
    write_file_atomic((fs::path(outdir) / "special_tokens_map.json").string(), map.dump(2) + "\n");
    names.push_back("special_tokens_map.json");
  }
  return names;
}

HfExport export_hf_directory(const std::string& path, const std::string& outdir, std::uint64_t max_shard_bytes,
                             const std::string& tokenizer) {
  const Manifest m = read_manifest(path);
  int seq_len = 0;
  const ModelSpec model = manifest_model(m, &seq_len);
  std::error_code ec;
  if (fs::exists(outdir, ec) && !(fs::is_directory(outdir, ec) && fs::is_empty(outdir, ec)))
    throw CheckpointError(outdir + " exists and is not an empty directory; export into a new directory");
  // Everything is written into OUTDIR.tmp, then renamed: a failed export leaves no half directory.
  const std::string tmp = outdir + ".tmp";
  fs::remove_all(tmp, ec);
  if (!fs::create_directories(tmp, ec) || ec)
    throw CheckpointError("cannot create " + tmp + (ec ? ": " + ec.message() : "") + "; check the output directory's parent");
  HfExport r;
  try {
    // Shards as transformers' save_pretrained cuts them: tensors in order, a new shard when the next tensor
    // would take the current one past the limit (a tensor larger than the limit gets a shard of its own).
    std::vector<std::vector<std::string>> shards(1);
    std::uint64_t in_shard = 0, total = 0;
    for (const std::string& name : m.order) {
      const std::uint64_t b = tensor_bytes(m, name);
      if (!shards.back().empty() && in_shard + b > max_shard_bytes) shards.emplace_back(), in_shard = 0;
      shards.back().push_back(name);
      in_shard += b;
      total += b;
    }
    std::map<std::string, std::unique_ptr<ShardReader>> readers;
    json weight_map = json::object();
    const int n = static_cast<int>(shards.size());
    for (int i = 0; i < n; ++i) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", i + 1, n);
      const std::string file = n == 1 ? kHfWeightsFile : name;
      r.bytes += write_tensor_file(m, shards[static_cast<std::size_t>(i)], (fs::path(tmp) / file).string(), readers);
      for (const std::string& t : shards[static_cast<std::size_t>(i)]) weight_map[t] = file;
      r.files.push_back(file);
    }
    auto write_text = [&](const std::string& file, const std::string& text) {
      write_file_atomic((fs::path(tmp) / file).string(), text);
      r.files.push_back(file);
      r.bytes += static_cast<std::int64_t>(text.size());
    };
    if (n > 1) write_text(kHfIndexFile, json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n");
    // The tokenizer first: config.json takes its special token ids.
    SpecialTokenIds special;
    r.tokenizer_files = export_tokenizer_files(tokenizer, tmp, model.vocab, &special);
    write_text(kHfConfigFile, hf_config_text(model, seq_len, m.dtype, special));
    write_text(kHfGenerationConfigFile, hf_generation_config_text(special));
    r.files.insert(r.files.end(), r.tokenizer_files.begin(), r.tokenizer_files.end());
    r.shards = n;
    r.vocab = model.vocab;
    fs::remove(outdir, ec);  // an empty directory given as the target
    fs::rename(tmp, outdir);
    fsync_path(fs::absolute(outdir).parent_path().string(), true);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    throw CheckpointError(std::string("writing ") + outdir + " failed: " + e.what());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return r;
}

template std::vector<float> read_global_tensor<float>(const std::string&, const std::string&, const std::string&);
template std::vector<double> read_global_tensor<double>(const std::string&, const std::string&, const std::string&);

}  // namespace meshrun::train
