#include "read_ahead.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "file_io.hpp"
#include "meshrun/train/checkpoint/checkpoint.hpp"

namespace meshrun::train::ckpt {

namespace {
constexpr std::uint64_t align_down(std::uint64_t v) { return v & ~std::uint64_t{ReadAhead::kAlign - 1}; }
constexpr std::uint64_t align_up(std::uint64_t v) { return align_down(v + ReadAhead::kAlign - 1); }
}  // namespace

ReadAhead::ReadAhead(std::vector<std::string> paths, std::vector<Range> plan, bool direct)
    : paths_(std::move(paths)), plan_(std::move(plan)), direct_(direct), files_(paths_.size()) {
  // The chunks: each run of ranges that follow each other byte for byte in one file, cut where a chunk
  // (from its first byte's aligned block) would pass kChunk.
  for (std::size_t i = 0; i < plan_.size();) {
    const Range& r = plan_[i];
    if (r.file < 0 || static_cast<std::size_t>(r.file) >= paths_.size()) throw std::logic_error("ReadAhead: a range names no file");
    std::uint64_t end = r.offset + r.bytes;
    std::size_t j = i + 1;
    while (j < plan_.size() && plan_[j].file == r.file && plan_[j].offset == end) end += plan_[j++].bytes;
    for (std::uint64_t pos = r.offset; pos < end;) {
      const std::uint64_t stop = std::min(end, align_down(pos) + kChunk);
      chunks_.push_back({r.file, pos, stop});
      pos = stop;
    }
    i = j;
  }
  // Each slot holds a chunk plus the lead that aligns its first byte down to kAlign.
  ring_bytes_ = static_cast<std::size_t>(kSlots) * (kChunk + kAlign);
  void* p = ::mmap(nullptr, ring_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw CheckpointError("cannot map the " + std::to_string(ring_bytes_ >> 20) + " MiB checkpoint read buffer (" + errno_text() + ")");
  ring_ = static_cast<char*>(p);
  (void)::madvise(ring_, ring_bytes_, MADV_HUGEPAGE);
  for (int t = 0; t < kReaders; ++t)
    readers_.emplace_back([this] {
      try {
        read_loop();
      } catch (const std::exception& e) {  // out of memory for a message, say: the load fails, not the process
        std::lock_guard<std::mutex> lock(mu_);
        failure_ = e.what();
        stop_ = true;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++readers_done_;
      }
      cv_.notify_all();
    });
}

ReadAhead::~ReadAhead() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : readers_) t.join();
  for (File& f : files_) {
    if (f.direct_fd >= 0) ::close(f.direct_fd);
    if (f.buffered_fd >= 0) ::close(f.buffered_fd);
    if (f.map != nullptr) ::munmap(f.map, f.map_bytes);
  }
  ::munmap(ring_, ring_bytes_);
}

ReadAhead::File& ReadAhead::file(int index) {
  File& f = files_[static_cast<std::size_t>(index)];
  std::lock_guard<std::mutex> lock(open_mu_);
  if (f.opened) return f;
  f.opened = true;
  const char* path = paths_[static_cast<std::size_t>(index)].c_str();
  f.buffered_fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (f.buffered_fd >= 0) {
    (void)::posix_fadvise(f.buffered_fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    struct stat sb{};
    if (::fstat(f.buffered_fd, &sb) == 0 && sb.st_size > 0) {
      void* a = ::mmap(nullptr, static_cast<std::size_t>(sb.st_size), PROT_READ, MAP_SHARED, f.buffered_fd, 0);
      if (a != MAP_FAILED) {
        f.map = a;
        f.map_bytes = static_cast<std::size_t>(sb.st_size);
      }
    }
  }
  if (direct_) {
    f.direct_fd = ::open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (f.direct_fd < 0) ++buffered_files_;  // EINVAL: the file system refuses O_DIRECT (tmpfs before Linux 6.6, some FUSE)
    f.direct = f.direct_fd >= 0;
  }
  return f;
}

bool ReadAhead::cached(File& f, std::uint64_t begin, std::uint64_t end) const {
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t lo = begin / page * page;
  if (f.map == nullptr || end > f.map_bytes) return false;
  std::vector<unsigned char> resident(static_cast<std::size_t>((end - lo + page - 1) / page));
  if (::mincore(static_cast<char*>(f.map) + lo, static_cast<std::size_t>(end - lo), resident.data()) != 0) return false;
  return std::all_of(resident.begin(), resident.end(), [](unsigned char r) { return (r & 1) != 0; });
}

// Reads the chunk's bytes into `slot` so that file byte `begin` lands at *data = slot + (begin -
// align_down(begin)): O_DIRECT in whole aligned blocks, else buffered. Returns "" or why it failed.
std::string ReadAhead::read_chunk(const Span& s, char* slot, const char** data) {
  const std::uint64_t base = align_down(s.begin);
  *data = slot + (s.begin - base);
  File& f = file(s.file);
  if (f.direct && !cached(f, s.begin, s.end)) {
    std::uint64_t got = 0;  // the last read may stop at the end of the file, short of the aligned length
    const std::uint64_t want = align_up(s.end) - base;
    while (got < s.end - base) {
      const ssize_t r = ::pread(f.direct_fd, slot + got, static_cast<std::size_t>(want - got), static_cast<off_t>(base + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && errno == EINVAL && got == 0) {  // an alignment this device does not take: buffered from here on
        if (f.direct.exchange(false)) ++buffered_files_;
        break;
      }
      if (r < 0) return "read failed at byte " + std::to_string(base + got) + " (" + errno_text() + ")";
      if (r == 0 || (static_cast<std::uint64_t>(r) % kAlign != 0 && got + static_cast<std::uint64_t>(r) < s.end - base))
        return "the file ends at byte " + std::to_string(base + got + static_cast<std::uint64_t>(r)) + ", before byte " +
               std::to_string(s.end) + " its header lists; the shard was truncated: restore it or resume from an older step";
      got += static_cast<std::uint64_t>(r);
    }
    if (got >= s.end - base) return "";
  }
  ++buffered_chunks_;
  if (f.buffered_fd < 0) return "cannot open (" + errno_text() + ")";
  char* at = slot + (s.begin - base);
  for (std::uint64_t pos = s.begin; pos < s.end;) {
    const ssize_t r = ::pread(f.buffered_fd, at + (pos - s.begin), static_cast<std::size_t>(s.end - pos), static_cast<off_t>(pos));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return "read failed at byte " + std::to_string(pos) + " (" + errno_text() + ")";
    if (r == 0)
      return "the file ends at byte " + std::to_string(pos) + ", before byte " + std::to_string(s.end) +
             " its header lists; the shard was truncated: restore it or resume from an older step";
    pos += static_cast<std::uint64_t>(r);
  }
  return "";
}

// Each reader takes the next chunk, waits until its slot is free (the chunk kSlots before released), reads
// it there and publishes it; the readers run side by side on neighbouring chunks.
void ReadAhead::read_loop() {
  for (;;) {
    std::uint64_t i;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stop_ || taken_ == chunks_.size()) return;
      i = taken_++;
      cv_.wait(lock, [&] { return stop_ || i < released_ + kSlots; });
      if (stop_) return;
    }
    const std::size_t slot = static_cast<std::size_t>(i % kSlots);
    const char* data = nullptr;
    std::string error = read_chunk(chunks_[static_cast<std::size_t>(i)], ring_ + slot * (kChunk + kAlign), &data);
    {
      std::lock_guard<std::mutex> lock(mu_);
      slots_[slot].chunk = i;
      slots_[slot].data = data;
      slots_[slot].error = std::move(error);
    }
    cv_.notify_all();
  }
}

void ReadAhead::consume(int file, std::uint64_t offset, std::uint64_t bytes, const std::string& what,
                        const std::function<void(const char*, std::size_t)>& part) {
  if (next_range_ >= plan_.size() || plan_[next_range_].file != file || plan_[next_range_].offset != offset ||
      plan_[next_range_].bytes != bytes)
    throw std::logic_error("ReadAhead: " + what + " read out of the planned order");
  ++next_range_;
  const std::string& path = paths_[static_cast<std::size_t>(file)];
  for (std::uint64_t pos = offset, end = offset + bytes; pos < end;) {
    const std::uint64_t i = released_;  // only this thread changes it
    if (i >= chunks_.size()) throw std::logic_error("ReadAhead: " + what + " past the end of the plan");
    const Slot& slot = slots_[i % kSlots];
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return slot.chunk == i || readers_done_ == kReaders; });
      if (slot.chunk != i)
        throw CheckpointError(path + ": tensor " + what + ": reading ahead failed (" + (failure_.empty() ? "stopped" : failure_) + ")");
    }
    if (!slot.error.empty()) throw CheckpointError(path + ": tensor " + what + ": " + slot.error);
    const Span& c = chunks_[static_cast<std::size_t>(i)];
    if (c.file != file || pos < c.begin || pos >= c.end) throw std::logic_error("ReadAhead: " + what + " is not in the next chunk");
    const std::uint64_t n = std::min(end, c.end) - pos;
    part(slot.data + (pos - c.begin), static_cast<std::size_t>(n));
    pos += n;
    if (pos == c.end) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++released_;
      }
      cv_.notify_all();
    }
  }
}

}  // namespace meshrun::train::ckpt
