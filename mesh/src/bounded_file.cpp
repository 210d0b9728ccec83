#include "meshrun/bounded_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

namespace meshrun {
namespace {

std::string mib(size_t bytes) {
  return bytes % (size_t(1) << 20) == 0 ? std::to_string(bytes >> 20) + " MiB" : std::to_string(bytes) + " bytes";
}

// Opens without blocking (a FIFO with no writer would block a plain open) and checks the type on the descriptor.
int open_regular(const std::string& path, const std::string& what, struct stat* st, std::string* error) {
  const std::string shown = cut_value(path, 200);
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    *error = shown + ": cannot read the " + what + " (" + (errno == ENOENT ? "no such file" : std::strerror(errno)) +
             "); check the path";
    return -1;
  }
  if (::fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
    const char* kind = S_ISDIR(st->st_mode) ? "a directory" : S_ISFIFO(st->st_mode) ? "a FIFO"
                       : S_ISCHR(st->st_mode) ? "a character device" : S_ISBLK(st->st_mode) ? "a block device"
                       : S_ISSOCK(st->st_mode) ? "a socket" : "not a regular file";
    *error = shown + ": the " + what + " is " + kind + ", not a regular file; give the path of a file";
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

std::string cut_value(const std::string& value, size_t max_chars) {
  if (value.size() <= max_chars) return value;
  size_t end = max_chars;
  while (end > 0 && (static_cast<unsigned char>(value[end]) & 0xC0) == 0x80) --end;  // keep UTF-8 whole
  return value.substr(0, end) + "…";
}

std::string cut_long_values(const std::string& m) {
  std::string out;
  out.reserve(std::min(m.size(), size_t(4096)));
  size_t i = 0;
  while (i < m.size()) {
    size_t j = i;
    bool path = false;
    while (j < m.size() && std::string_view(" \t\n'\",=:;()[]{}").find(m[j]) == std::string_view::npos) {
      path = path || m[j] == '/';
      ++j;
    }
    if (j == i) {
      out += m[i++];
      continue;
    }
    const size_t len = j - i;
    if (len > (path ? 200 : 60)) out += cut_value(m.substr(i, len), path ? 200 : 60);
    else out.append(m, i, len);
    i = j;
  }
  return out;
}

bool check_regular_file(const std::string& path, const std::string& what, std::string* error) {
  struct stat st {};
  int fd = open_regular(path, what, &st, error);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

bool read_bounded_file(const std::string& path, size_t limit, const std::string& what, std::string* out,
                       std::string* error) {
  struct stat st {};
  int fd = open_regular(path, what, &st, error);
  if (fd < 0) return false;
  auto too_big = [&] {
    *error = cut_value(path, 200) + ": the " + what + " is larger than " + mib(limit) + "; a " + what +
             " that big is not one meshrun writes or reads, check the path";
    ::close(fd);
    return false;
  };
  if (static_cast<unsigned long long>(st.st_size) > limit) return too_big();
  std::string text;
  text.resize(std::min(limit + 1, static_cast<size_t>(st.st_size) + 1));
  size_t got = 0;
  while (true) {
    if (got == text.size()) {
      if (got > limit) return too_big();  // grew while being read
      text.resize(std::min(limit + 1, text.size() * 2 + 4096));
    }
    ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *error = cut_value(path, 200) + ": cannot read the " + what + " (" + std::strerror(errno) + "); check the file";
      ::close(fd);
      return false;
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
    if (got > limit) return too_big();
  }
  ::close(fd);
  text.resize(got);
  *out = std::move(text);
  return true;
}

}  // namespace meshrun
