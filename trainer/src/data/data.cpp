#include "meshrun/train/data/data.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "meshrun/train/model/params.hpp"

namespace meshrun::train {

namespace {
int token_width(const std::string& dtype) {
  if (dtype == "uint16") return 2;
  if (dtype == "uint32") return 4;
  throw DataError("data.token_dtype = \"" + dtype + "\" is not supported; use \"uint16\" or \"uint32\"");
}
}  // namespace

TokenFile::TokenFile(const std::string& path, const std::string& token_dtype, std::int64_t vocab,
                     std::int64_t seq_len, std::int64_t global_batch)
    : path_(path), width_(token_width(token_dtype)) {
  // Ids travel as int32 in the batches: a larger vocabulary could not be represented.
  if (vocab <= 0 || vocab > std::int64_t{INT32_MAX} + 1)
    throw DataError("model.vocab = " + std::to_string(vocab) + " is outside [1, 2^31]; token ids are int32 in the batches");
  if (path.empty())
    throw DataError("data.path is not set; point it at a token file (meshrun-tokenize makes one) or set data.text to "
                    "a UTF-8 corpus to tokenize");
  // O_NONBLOCK: a FIFO must not block open(); the type is checked on the opened descriptor.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK);
  if (fd < 0)
    throw DataError("token file " + path + ": " + std::strerror(errno) +
                    "; point data.path at a token file (meshrun-tokenize makes one), or remove data.path to train on data.text");
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw DataError("token file " + path + " is not a regular file; point data.path at a token file (meshrun-tokenize makes one)");
  }
  bytes_ = static_cast<std::size_t>(st.st_size);
  if (bytes_ == 0) {
    ::close(fd);
    throw DataError("token file " + path + " is empty; regenerate it with meshrun-tokenize");
  }
  if (bytes_ % width_ != 0) {
    ::close(fd);
    throw DataError("token file " + path + " has " + std::to_string(bytes_) + " bytes, not a multiple of " +
                    std::to_string(width_) + " (" + token_dtype + "); check data.token_dtype");
  }
  void* m = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) throw DataError("token file " + path + ": mmap failed: " + std::strerror(errno));
  data_ = static_cast<const unsigned char*>(m);
  n_ = static_cast<std::int64_t>(bytes_ / width_);
  const std::int64_t need = global_batch * seq_len + 1;
  if (n_ < need) {
    unmap();
    throw DataError("token file " + path + " holds " + std::to_string(n_) + " tokens, fewer than one batch needs (" +
                    std::to_string(need) + " = global_batch_size·seq_len + 1); use more text or a smaller batch");
  }
  windows_ = (n_ - 1) / seq_len;
  // Compared unsigned and 64-bit: a uint32 id >= 2^31 must not pass as a negative int32.
  for (std::int64_t i = 0; i < n_; ++i) {
    if (const std::uint32_t id = raw(i); id >= static_cast<std::uint64_t>(vocab)) {
      unmap();
      throw DataError("token file " + path + ": token " + std::to_string(i) + " has id " + std::to_string(id) +
                      " >= model.vocab (" + std::to_string(vocab) + "); raise model.vocab or retokenize");
    }
  }
}

TokenFile::~TokenFile() { unmap(); }

void TokenFile::unmap() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), bytes_);
  data_ = nullptr;
}

std::uint32_t TokenFile::raw(std::int64_t i) const {
  const unsigned char* p = data_ + static_cast<std::size_t>(i) * width_;
  std::uint32_t v = p[0] | (std::uint32_t(p[1]) << 8);
  if (width_ == 4) v |= (std::uint32_t(p[2]) << 16) | (std::uint32_t(p[3]) << 24);
  return v;
}

BatchSchedule::BatchSchedule(const TokenStream& file, std::int64_t seq_len, std::int64_t global_batch, bool shuffle,
                             std::uint64_t seed)
    : file_(file), seq_(seq_len), batch_(global_batch), windows_((file.tokens() - 1) / seq_len), shuffle_(shuffle),
      seed_(seed) {
  if (windows_ < 1) throw std::logic_error("BatchSchedule: the token stream holds fewer than seq_len + 1 tokens");
}

std::int64_t BatchSchedule::window_start(std::int64_t index) const {
  const std::int64_t w = windows_;
  if (!shuffle_) return (index % w) * seq_;
  const std::int64_t epoch = index / w;
  if (epoch != perm_epoch_) {
    // Fisher-Yates driven by a counter-based hash of (seed, epoch, position).
    perm_.resize(static_cast<std::size_t>(w));
    for (std::int64_t i = 0; i < w; ++i) perm_[i] = i;
    const std::uint64_t key = mix64(seed_ ^ mix64(0x5348554646ULL + static_cast<std::uint64_t>(epoch)));
    for (std::int64_t i = w - 1; i > 0; --i) {
      const std::int64_t j = static_cast<std::int64_t>(mix64(key ^ static_cast<std::uint64_t>(i)) %
                                                       static_cast<std::uint64_t>(i + 1));
      std::swap(perm_[i], perm_[j]);
    }
    perm_epoch_ = epoch;
  }
  return perm_[index % w] * seq_;
}

void BatchSchedule::sequence(std::int64_t index, std::int32_t* ids, std::int32_t* targets) const {
  const std::int64_t s = window_start(index);
  for (std::int64_t t = 0; t < seq_; ++t) {
    ids[t] = file_.at(s + t);
    targets[t] = file_.at(s + t + 1);
  }
}

void BatchSchedule::tokens(std::int64_t index, const std::int32_t* positions, std::int64_t count, std::int32_t* ids,
                           std::int32_t* targets) const {
  const std::int64_t s = window_start(index);
  for (std::int64_t i = 0; i < count; ++i) {
    ids[i] = file_.at(s + positions[i]);
    targets[i] = file_.at(s + positions[i] + 1);
  }
}

std::vector<std::string> text_files(const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> inside;
      for (const auto& e : fs::directory_iterator(in, ec))
        if (e.is_regular_file()) inside.push_back(e.path().string());
      std::sort(inside.begin(), inside.end());
      files.insert(files.end(), inside.begin(), inside.end());
    } else if (fs::is_regular_file(in, ec)) {
      files.push_back(in);
    } else {
      throw DataError("text input " + in + " is not a readable file or directory; check data.text");
    }
  }
  return files;
}

std::int64_t tokenize_bytes(const std::vector<std::string>& inputs, const std::string& out_path,
                            const std::string& token_dtype) {
  namespace fs = std::filesystem;
  const int width = token_width(token_dtype);
  const std::vector<std::string> files = text_files(inputs);
  std::string out;
  std::int64_t count = 0;
  for (const std::string& f : files) {
    std::ifstream is(f, std::ios::binary);
    if (!is) throw DataError("cannot read text file " + f);
    const std::string text((std::istreambuf_iterator<char>(is)), std::istreambuf_iterator<char>());
    for (unsigned char c : text) {
      out.push_back(static_cast<char>(c));
      for (int b = 1; b < width; ++b) out.push_back(0);
      ++count;
    }
  }
  if (count == 0) throw DataError("text inputs hold no bytes; give a non-empty UTF-8 file");
  const std::string tmp = out_path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream os(tmp, std::ios::binary | std::ios::trunc);
    if (!os) throw DataError("cannot write token file " + out_path + "; check the directory exists and is writable");
    os.write(out.data(), static_cast<std::streamsize>(out.size()));
    if (!os) throw DataError("writing token file " + out_path + " failed (disk full?)");
  }
  fs::rename(tmp, out_path);  // atomic: concurrent readers never see a partial file
  return count;
}

}  // namespace meshrun::train
