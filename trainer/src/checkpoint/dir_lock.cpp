// One writer per checkpoint directory: flock(2) on DIR/lock, held by rank 0 from start-up to exit and
// released by the kernel when the process dies (kill -9, node failure of a local file system), so a
// requeued job never waits on its dead predecessor. The file records the holder for the refusal message.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string>

#include "file_io.hpp"
#include "meshrun/bounded_file.hpp"
#include "meshrun/train/checkpoint/checkpoint.hpp"

namespace meshrun::train {

std::string checkpoint_lock_path(const std::string& dir) { return (std::filesystem::path(dir) / "lock").string(); }

std::string lock_checkpoint_dir(const std::string& dir) {
  static int held_fd = -1;  // never closed: the lock lives as long as the process
  const std::string path = checkpoint_lock_path(dir);
  if (held_fd >= 0) return "";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return "checkpoint.dir = " + dir + ": cannot open " + path + " (" + std::strerror(errno) + "); check the directory's permissions";
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    if (e == EWOULDBLOCK) {
      char holder[256] = {0};
      const ssize_t n = ::pread(fd, holder, sizeof holder - 1, 0);
      ::close(fd);
      std::string who = n > 0 ? std::string(holder, static_cast<std::size_t>(n)) : std::string("a process that has not written its name yet");
      while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
      return "checkpoint.dir = " + dir + " is in use by another run (" + cut_value(who, 160) + "; lock " + path +
             "); two runs writing one directory delete each other's saves: wait for it to end or set another checkpoint.dir";
    }
    ::close(fd);
    // Lustre without -o flock (ENOSYS), some NFS set-ups (ENOLCK): no lock can be trusted, so refuse.
    return "checkpoint.dir = " + dir + ": the file system refuses flock on " + path + " (" + std::strerror(e) +
           "); meshrun cannot keep a second job from writing there: mount it with flock support (Lustre: -o flock) or "
           "use a checkpoint.dir on a file system that has it";
  }
  const char* job = std::getenv("SLURM_JOB_ID");
  const char* node = std::getenv("SLURMD_NODENAME");
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  char since[32] = {0};
  const std::time_t now = std::time(nullptr);
  std::strftime(since, sizeof since, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  const std::string who = std::string("job ") + (job ? job : "-") + ", node " + (node ? node : host) + ", host " + host +
                          ", pid " + std::to_string(::getpid()) + ", since " + since + "\n";
  if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, who.data(), who.size(), 0);  // best effort: the lock is the flock
  held_fd = fd;
  return "";
}

}  // namespace meshrun::train
