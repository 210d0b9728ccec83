#include "meshrun/bounded_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
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

namespace {

// The length of the valid UTF-8 sequence at s[i] (1-4), or 0 when the bytes there are not one (a stray
// continuation byte, an overlong form, a surrogate, a code point above U+10FFFF, a truncated sequence).
size_t utf8_length(std::string_view s, size_t i, uint32_t* code_point) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) {
    *code_point = c;
    return 1;
  }
  size_t n = 0;
  uint32_t cp = 0, min = 0;
  if (c >= 0xC2 && c <= 0xDF) n = 2, cp = c & 0x1F, min = 0x80;
  else if (c >= 0xE0 && c <= 0xEF) n = 3, cp = c & 0x0F, min = 0x800;
  else if (c >= 0xF0 && c <= 0xF4) n = 4, cp = c & 0x07, min = 0x10000;
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  *code_point = cp;
  return n;
}

// Code points a terminal acts on or that reorder or break the displayed line: C1 controls (U+0080-009F,
// e.g. U+009B is CSI), the line and paragraph separators, and the bidirectional overrides and isolates.
bool invisible_control(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || cp == 0x2028 || cp == 0x2029 || (cp >= 0x202A && cp <= 0x202E) ||
         (cp >= 0x2066 && cp <= 0x2069) || cp == 0x200E || cp == 0x200F || cp == 0x061C;
}

// One piece of the printable form of s at i: the escape or the character itself; *consumed input bytes.
std::string printable_piece(std::string_view s, size_t i, size_t* consumed) {
  uint32_t cp = 0;
  const size_t n = utf8_length(s, i, &cp);
  char buf[12];
  if (n == 0) {
    *consumed = 1;
    std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(s[i]));
    return buf;
  }
  *consumed = n;
  switch (cp) {
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: break;
  }
  if (cp < 0x20 || cp == 0x7F) {
    std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(cp));
    return buf;
  }
  if (invisible_control(cp)) {
    std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
    return buf;
  }
  return std::string(s.substr(i, n));
}

}  // namespace

std::string cut_value(std::string_view value, size_t max_chars) {
  std::string out;
  out.reserve(std::min(value.size(), max_chars) + 4);
  size_t i = 0;
  while (i < value.size()) {
    size_t consumed = 0;
    std::string piece = printable_piece(value, i, &consumed);
    if (out.size() + piece.size() > max_chars) return out + "…";
    out += piece;
    i += consumed;
  }
  return out;
}

std::string cut_long_values(std::string_view m) {
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
      size_t consumed = 0;
      out += printable_piece(m, i, &consumed);  // a separator; \t and \n escaped
      i += consumed;
      continue;
    }
    out += cut_value(m.substr(i, j - i), path ? 200 : 60);
    i = j;
  }
  // Every value is cut, but a message made of many short values (each escaped up to 4× its bytes) can still
  // grow without bound: the whole line is cut too, at a character or escape boundary.
  constexpr size_t kMaxMessage = 1536;
  if (out.size() <= kMaxMessage) return out;
  size_t keep = 0;
  for (size_t k = 0; k < out.size();) {
    size_t len = 1;
    const unsigned char c = static_cast<unsigned char>(out[k]);
    if (c == '\\' && k + 1 < out.size()) len = out[k + 1] == 'x' ? 4 : out[k + 1] == 'u' ? 6 : 2;
    else if (c >= 0xF0) len = 4;
    else if (c >= 0xE0) len = 3;
    else if (c >= 0xC0) len = 2;
    if (k + len > kMaxMessage - 3) break;
    k += len;
    keep = k;
  }
  out.resize(keep);
  return out + "…";
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

std::string cut_lines(const std::vector<std::string>& messages) {
  std::string out;
  for (const std::string& m : messages) out += (out.empty() ? "" : "\n") + cut_long_values(m);
  return out;
}

std::string message_lines(std::string_view prefix, std::string_view message) {
  std::string out;
  size_t i = 0;
  while (true) {
    const size_t j = message.find('\n', i);
    out += std::string(prefix) + cut_long_values(message.substr(i, j == std::string_view::npos ? std::string_view::npos : j - i)) + "\n";
    if (j == std::string_view::npos) break;
    i = j + 1;
  }
  return out;
}

}  // namespace meshrun
