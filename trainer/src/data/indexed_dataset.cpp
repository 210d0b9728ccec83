#include "meshrun/train/data/indexed_dataset.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "meshrun/train/data/data.hpp"

namespace meshrun::train {

namespace {

constexpr unsigned char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr std::size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

int code_width(int code) {
  switch (code) {
    case 1: case 2: return 1;  // uint8, int8
    case 3: case 8: return 2;  // int16, uint16
    case 4: return 4;          // int32
    case 5: return 8;          // int64
    default: return 0;         // 6 float64, 7 float32 and unknown codes: not token ids
  }
}

template <class T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class T>
void put(std::vector<unsigned char>& out, T v) {
  const auto* b = reinterpret_cast<const unsigned char*>(&v);
  out.insert(out.end(), b, b + sizeof v);
}

std::string strip_suffix(const std::string& path) {
  for (const char* ext : {".bin", ".idx"})
    if (path.size() > 4 && path.compare(path.size() - 4, 4, ext) == 0) return path.substr(0, path.size() - 4);
  return path;
}

// Maps a whole regular file read-only; DataError naming it otherwise.
const unsigned char* map_file(const std::string& path, std::size_t& bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK);
  if (fd < 0)
    throw DataError("indexed dataset " + path + ": " + std::strerror(errno) +
                    "; meshrun-tokenize writes PREFIX.bin and PREFIX.idx (docs/trainer.md)");
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw DataError("indexed dataset " + path + " is not a regular file");
  }
  bytes = static_cast<std::size_t>(st.st_size);
  if (bytes == 0) {
    ::close(fd);
    throw DataError("indexed dataset " + path + " is empty; regenerate it with meshrun-tokenize");
  }
  void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) throw DataError("indexed dataset " + path + ": mmap failed: " + std::strerror(errno));
  return static_cast<const unsigned char*>(m);
}

}  // namespace

int indexed_dtype_code(const std::string& token_dtype) {
  if (token_dtype == "uint16") return 8;
  if (token_dtype == "uint32" || token_dtype == "int32") return 4;
  throw DataError("token dtype \"" + token_dtype + "\" cannot be written to an indexed dataset; use uint16 or uint32 "
                  "(stored as Megatron's int32)");
}

// ---- writer ----

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, int dtype_code)
    : prefix_(strip_suffix(prefix)), code_(dtype_code), width_(code_width(dtype_code)) {
  if (code_ != 4 && code_ != 8)
    throw DataError("indexed dataset dtype code " + std::to_string(code_) + " cannot be written; use uint16 (8) or int32 (4)");
  bin_ = std::fopen((prefix_ + ".bin.tmp").c_str(), "wb");
  if (!bin_) throw DataError("cannot write " + prefix_ + ".bin.tmp: " + std::strerror(errno));
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (bin_) std::fclose(bin_);
  if (!finished_) {
    std::remove((prefix_ + ".bin.tmp").c_str());
    std::remove((prefix_ + ".idx.tmp").c_str());
  }
}

void IndexedDatasetWriter::add_document(const std::uint32_t* ids, std::size_t n) {
  if (finished_) throw DataError("indexed dataset " + prefix_ + ": add_document after finish");
  if (n > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    throw DataError("indexed dataset " + prefix_ + ": a document of " + std::to_string(n) +
                    " tokens exceeds Megatron's int32 sequence length");
  const std::uint32_t max_id = code_ == 8 ? 0xFFFFu : static_cast<std::uint32_t>(std::numeric_limits<std::int32_t>::max());
  scratch_.resize(n * static_cast<std::size_t>(width_));
  for (std::size_t i = 0; i < n; ++i) {
    if (ids[i] > max_id)
      throw DataError("token id " + std::to_string(ids[i]) + " does not fit " + (code_ == 8 ? "uint16" : "int32") +
                      "; write the dataset with --dtype uint32");
    if (code_ == 8) {
      const auto v = static_cast<std::uint16_t>(ids[i]);
      std::memcpy(&scratch_[i * 2], &v, 2);
    } else {
      const auto v = static_cast<std::int32_t>(ids[i]);
      std::memcpy(&scratch_[i * 4], &v, 4);
    }
  }
  if (n && std::fwrite(scratch_.data(), 1, scratch_.size(), bin_) != scratch_.size())
    throw DataError("cannot write " + prefix_ + ".bin.tmp: " + std::strerror(errno));
  lengths_.push_back(static_cast<std::int32_t>(n));
  pointers_.push_back(bytes_);
  bytes_ += static_cast<std::int64_t>(scratch_.size());
}

void IndexedDatasetWriter::finish() {
  if (finished_) return;
  const bool flushed = std::fflush(bin_) == 0 && ::fsync(::fileno(bin_)) == 0;
  const bool closed = std::fclose(bin_) == 0;
  bin_ = nullptr;
  if (!flushed || !closed) throw DataError("cannot write " + prefix_ + ".bin.tmp: " + std::strerror(errno));

  std::vector<unsigned char> idx(kMagic, kMagic + 9);
  put<std::uint64_t>(idx, 1);
  put<std::uint8_t>(idx, static_cast<std::uint8_t>(code_));
  put<std::uint64_t>(idx, lengths_.size());
  put<std::uint64_t>(idx, lengths_.size() + 1);  // document indices: 0, 1, …, n (one sequence per document)
  for (std::int32_t l : lengths_) put(idx, l);
  for (std::int64_t p : pointers_) put(idx, p);
  for (std::size_t d = 0; d <= lengths_.size(); ++d) put(idx, static_cast<std::int64_t>(d));

  const std::string tmp = prefix_ + ".idx.tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw DataError("cannot write " + tmp + ": " + std::strerror(errno));
  const bool ok = std::fwrite(idx.data(), 1, idx.size(), f) == idx.size() && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  if (std::fclose(f) != 0 || !ok) throw DataError("cannot write " + tmp + ": " + std::strerror(errno));
  if (std::rename((prefix_ + ".bin.tmp").c_str(), (prefix_ + ".bin").c_str()) != 0 ||
      std::rename(tmp.c_str(), (prefix_ + ".idx").c_str()) != 0)
    throw DataError("cannot rename the indexed dataset into place at " + prefix_ + ": " + std::strerror(errno));
  finished_ = true;
}

// ---- reader ----

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(strip_suffix(prefix)) {
  const std::string idx_path = prefix_ + ".idx", bin_path = prefix_ + ".bin";
  idx_ = map_file(idx_path, idx_bytes_);
  try {
    auto bad = [&](const std::string& what) {
      return DataError("indexed dataset " + idx_path + ": " + what + "; regenerate it (meshrun-tokenize, or Megatron's preprocess_data.py)");
    };
    if (idx_bytes_ < kHeaderBytes || std::memcmp(idx_, kMagic, 9) != 0)
      throw bad("not a Megatron index (no MMIDIDX header)");
    if (const auto version = load<std::uint64_t>(idx_ + 9); version != 1)
      throw bad("index version " + std::to_string(version) + " is not supported (version 1 is)");
    code_ = idx_[17];
    width_ = code_width(code_);
    if (!width_) throw bad("dtype code " + std::to_string(code_) + " is not an integer token type");
    const auto n = load<std::uint64_t>(idx_ + 18), d = load<std::uint64_t>(idx_ + 26);
    // Untrusted counts: bounded by the file size before any multiplication.
    const std::size_t room = idx_bytes_ - kHeaderBytes;
    if (n > room / 12 || d > room / 8 || n * 12 + d * 8 > room)
      throw bad("truncated: the header promises " + std::to_string(n) + " sequences and " + std::to_string(d) +
                " document indices, more than the file holds");
    const std::size_t expect = kHeaderBytes + n * 12 + d * 8;
    if (idx_bytes_ == expect + n && n > 0)
      throw bad("it carries sequence modes (a multimodal dataset); only text datasets are read");
    if (idx_bytes_ != expect)
      throw bad(std::to_string(idx_bytes_) + " bytes where the header implies " + std::to_string(expect));
    sequences_ = static_cast<std::int64_t>(n);

    // Document indices: start at 0, never decrease, end at the sequence count.
    doc_index_.resize(d);
    std::memcpy(doc_index_.data(), idx_ + kHeaderBytes + n * 12, d * 8);
    if (d < 1 || doc_index_.front() != 0 || doc_index_.back() != sequences_)
      throw bad("document indices must run from 0 to the sequence count (" + std::to_string(n) + ")");
    for (std::size_t i = 1; i < d; ++i)
      if (doc_index_[i] < doc_index_[i - 1]) throw bad("document index " + std::to_string(i) + " decreases");

    // Sequences back to back from byte 0: the reader treats .bin as one token stream.
    std::int64_t at = 0;
    for (std::int64_t i = 0; i < sequences_; ++i) {
      const auto len = load<std::int32_t>(idx_ + kHeaderBytes + static_cast<std::size_t>(i) * 4);
      const auto ptr = load<std::int64_t>(idx_ + kHeaderBytes + n * 4 + static_cast<std::size_t>(i) * 8);
      if (len < 0) throw bad("sequence " + std::to_string(i) + " has a negative length");
      if (ptr != at * width_)
        throw bad("sequence " + std::to_string(i) + " starts at byte " + std::to_string(ptr) + ", not right after the previous one (" +
                  std::to_string(at * width_) + ")");
      at += len;
    }
    tokens_ = at;
  } catch (...) {
    ::munmap(const_cast<unsigned char*>(idx_), idx_bytes_);
    throw;
  }
  try {
    bin_ = map_file(bin_path, bin_bytes_);
  } catch (...) {
    ::munmap(const_cast<unsigned char*>(idx_), idx_bytes_);
    throw;
  }
  if (bin_bytes_ != static_cast<std::size_t>(tokens_) * static_cast<std::size_t>(width_)) {
    const std::string msg = "indexed dataset " + bin_path + " has " + std::to_string(bin_bytes_) + " bytes, but " + idx_path +
                            " describes " + std::to_string(tokens_) + " tokens of " + std::to_string(width_) +
                            " bytes; the pair is truncated or mismatched: regenerate it";
    ::munmap(const_cast<unsigned char*>(idx_), idx_bytes_);
    ::munmap(const_cast<unsigned char*>(bin_), bin_bytes_);
    throw DataError(msg);
  }
}

IndexedDataset::~IndexedDataset() {
  if (idx_) ::munmap(const_cast<unsigned char*>(idx_), idx_bytes_);
  if (bin_) ::munmap(const_cast<unsigned char*>(bin_), bin_bytes_);
}

std::int64_t IndexedDataset::sequence_length(std::int64_t i) const {
  return load<std::int32_t>(idx_ + kHeaderBytes + static_cast<std::size_t>(i) * 4);
}

std::int64_t IndexedDataset::sequence_start(std::int64_t i) const {
  return load<std::int64_t>(idx_ + kHeaderBytes + static_cast<std::size_t>(sequences_) * 4 + static_cast<std::size_t>(i) * 8) /
         width_;
}

std::int64_t IndexedDataset::value(std::int64_t i) const {
  const unsigned char* p = bin_ + static_cast<std::size_t>(i) * static_cast<std::size_t>(width_);
  switch (code_) {
    case 1: return *p;
    case 2: return static_cast<std::int8_t>(*p);
    case 3: return load<std::int16_t>(p);
    case 4: return load<std::int32_t>(p);
    case 5: return load<std::int64_t>(p);
    default: return load<std::uint16_t>(p);  // 8
  }
}

std::uint32_t IndexedDataset::token(std::int64_t i) const { return static_cast<std::uint32_t>(value(i)); }

void IndexedDataset::check_ids_below(std::int64_t vocab) const {
  for (std::int64_t i = 0; i < tokens_; ++i) {
    if (const std::int64_t id = value(i); id < 0 || id >= vocab)
      throw DataError("indexed dataset " + prefix_ + ".bin: token " + std::to_string(i) + " has id " + std::to_string(id) +
                      (id < 0 ? " < 0" : " >= model.vocab (" + std::to_string(vocab) + ")") +
                      "; raise model.vocab or retokenize with the model's tokenizer");
  }
}

}  // namespace meshrun::train
