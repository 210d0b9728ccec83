// The bytes a checkpoint load needs, read ahead of it. One thread streams the planned byte ranges of the
// shard files, in exactly the order the load will consume them, into a small ring of aligned buffers, while
// the loading thread hashes and places the ones before. Reads are O_DIRECT where the file system allows
// (the disk's speed with no page-cache copy; buffered where it refuses, and where the chunk's pages are all
// in the page cache already, as mincore says), in chunks of up to kChunk bytes, adjacent ranges of one file
// read as one. Memory is bounded: kSlots chunks, whatever the size of
// the checkpoint. Internal to src/checkpoint/.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace meshrun::train::ckpt {

class ReadAhead {
 public:
  static constexpr std::size_t kChunk = std::size_t{8} << 20;
  static constexpr int kSlots = 4;
  static constexpr int kReaders = 2;  // two requests in flight: ~20% faster than one on a virtio disk
  static constexpr std::size_t kAlign = 4096;  // O_DIRECT: offsets, lengths and addresses on this boundary

  struct Range {
    int file;  // index into the paths
    std::uint64_t offset, bytes;
  };
  // Starts reading `plan` (ranges of `paths`) at once; `direct` false reads through the page cache only.
  ReadAhead(std::vector<std::string> paths, std::vector<Range> plan, bool direct = true);
  ~ReadAhead();  // stops the readers, wherever they are, and joins them
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;

  // The next range of the plan, which must be (file, offset, bytes): calls part(data, n) over its bytes in
  // order, in one or more parts. A failed or short read throws CheckpointError naming the file and `what`.
  void consume(int file, std::uint64_t offset, std::uint64_t bytes, const std::string& what,
               const std::function<void(const char*, std::size_t)>& part);
  // How many files were read through the page cache because O_DIRECT was refused (at open or first read).
  int buffered_files() const { return buffered_files_.load(); }
  // How many chunks were read through the page cache (O_DIRECT refused, or the pages already there).
  int buffered_chunks() const { return buffered_chunks_.load(); }

 private:
  struct Span {  // one chunk: the plan's bytes [begin, end) of a file
    int file;
    std::uint64_t begin, end;
  };
  struct Slot {
    std::uint64_t chunk = ~std::uint64_t{0};  // the chunk it holds, once read
    const char* data = nullptr;               // file byte `begin` of that chunk
    std::string error;                        // a failed read: why
  };
  struct File {  // opened on first use (under open_mu_), closed by the destructor
    bool opened = false;
    int direct_fd = -1, buffered_fd = -1;
    std::atomic<bool> direct{false};  // O_DIRECT usable (cleared when a read refuses it)
    void* map = nullptr;              // a read-only mapping for mincore (nothing is read through it)
    std::size_t map_bytes = 0;
  };
  void read_loop();
  std::string read_chunk(const Span& span, char* slot, const char** data);  // "" or why it failed
  File& file(int index);
  bool cached(File& f, std::uint64_t begin, std::uint64_t end) const;  // every page of [begin, end) resident

  std::vector<std::string> paths_;
  std::vector<Range> plan_;
  std::vector<Span> chunks_;  // the plan cut into chunks, in order
  bool direct_;
  std::vector<File> files_;
  std::mutex open_mu_;
  std::atomic<int> buffered_files_{0}, buffered_chunks_{0};
  char* ring_ = nullptr;
  std::size_t ring_bytes_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  Slot slots_[kSlots];           // chunk i goes to slot i % kSlots once chunk i - kSlots is released
  std::uint64_t taken_ = 0;      // chunks handed to a reader
  std::uint64_t released_ = 0;   // chunks the consumer is done with
  bool stop_ = false;
  int readers_done_ = 0;
  std::string failure_;          // an exception that ended a reader

  std::size_t next_range_ = 0;   // the consumer's position in the plan
  std::vector<std::thread> readers_;
};

}  // namespace meshrun::train::ckpt
