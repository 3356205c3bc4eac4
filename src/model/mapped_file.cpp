#include "mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace cellm {
namespace {

Status open_error(const std::filesystem::path& path, const char* action, int err) {
  std::string message = path.string() + ": " + action + " failed: " + std::strerror(err);
  if (err == ENOENT) return NotFound(std::move(message));
  return IoError(std::move(message));
}

}  // namespace

Result<std::unique_ptr<MappedFile>> MappedFile::open(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return open_error(path, "open", errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return open_error(path, "stat", err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return IoError(path.string() + ": not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* address = nullptr;
  if (size > 0) {
    address = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (address == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return open_error(path, "mmap", err);
    }
  }
  ::close(fd);  // the mapping keeps the file alive
  return std::unique_ptr<MappedFile>(new MappedFile(static_cast<const std::byte*>(address), size));
}

MappedFile::~MappedFile() {
  if (size_ > 0) ::munmap(const_cast<std::byte*>(data_), size_);
}

Result<std::string> read_text_file(const std::filesystem::path& path, const char* what) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    if (std::filesystem::exists(path, ec)) {
      return IoError(path.string() + ": the " + what + " is not a regular file");
    }
    return NotFound(path.string() + ": the " + what + " does not exist");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError(path.string() + ": cannot open the " + what);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return IoError(path.string() + ": reading the " + what + " failed");
  return text.str();
}

}  // namespace cellm
