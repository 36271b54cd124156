#include "file_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>
#include <utility>

#include "errors.h"

namespace recdev::store {
namespace {

constexpr size_t kBufferBytes = size_t{1} << 20;

[[noreturn]] void io_error(const std::string& what, const std::string& path, int error) {
  throw StoreError(ErrorCode::Io, what + " '" + path + "': " + std::strerror(error));
}

std::string directory_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_name_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

constexpr char kTempInfix[] = ".tmp.";

std::string host_name() {
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

// The files (device, inode) of this process's writers not yet committed or destroyed, which a scan
// for dead writers' files must not take for leftovers of an earlier process that had the same pid
// (containers reuse pids).
std::mutex live_temps_mutex;
std::set<std::pair<dev_t, ino_t>> live_temps;

// path.tmp.HOST.PID.N: unique within the process (counter), across processes (pid) and across the
// hosts that share a directory (host); O_EXCL catches anything else.
std::string temp_path_for(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + kTempInfix + host_name() + "." + std::to_string(::getpid()) + "." +
         std::to_string(counter.fetch_add(1));
}

// Calls visit(directory fd, name, what follows ".tmp.", its stat) for each regular file of path's
// directory named as a temporary file of path.
// With an empty prefix: every temporary file of the directory (the suffix is what follows the last
// ".tmp.").
template <class Visit>
void for_each_temp_file_in(const std::string& directory, const std::string& prefix, Visit visit) {
  DIR* listing = ::opendir(directory.c_str());
  if (listing == nullptr) io_error("cannot list directory", directory, errno);
  try {
    while (const dirent* entry = ::readdir(listing)) {
      const std::string name = entry->d_name;
      size_t suffix_at;
      if (prefix.empty()) {
        const size_t infix = name.rfind(kTempInfix);
        if (infix == std::string::npos) continue;
        suffix_at = infix + sizeof(kTempInfix) - 1;
      } else {
        if (name.compare(0, prefix.size(), prefix) != 0) continue;
        suffix_at = prefix.size();
      }
      struct stat status;
      if (::fstatat(::dirfd(listing), name.c_str(), &status, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(status.st_mode)) {
        continue;
      }
      visit(::dirfd(listing), name, name.substr(suffix_at), status);
    }
  } catch (...) {
    ::closedir(listing);
    throw;
  }
  ::closedir(listing);
}

template <class Visit>
void for_each_temp_file(const std::string& path, Visit visit) {
  for_each_temp_file_in(directory_of(path), base_name_of(path) + kTempInfix, visit);
}

// Whether a temporary file named HOST.PID.N (after ".tmp.") belongs to a writer that is gone: one on
// this host whose process no longer exists, or this process's own that no writer holds any more.
bool writer_is_gone(const std::string& suffix, const struct stat& status) {
  const size_t counter_dot = suffix.rfind('.');
  if (counter_dot == std::string::npos || counter_dot == 0) return false;
  const size_t pid_dot = suffix.rfind('.', counter_dot - 1);
  if (pid_dot == std::string::npos || suffix.substr(0, pid_dot) != host_name()) return false;
  const std::string pid_text = suffix.substr(pid_dot + 1, counter_dot - pid_dot - 1);
  if (pid_text.empty() || pid_text.size() > 9 || pid_text.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  const pid_t pid = pid_t(std::stol(pid_text));
  if (pid == ::getpid()) {
    std::lock_guard<std::mutex> lock(live_temps_mutex);
    return live_temps.count({status.st_dev, status.st_ino}) == 0;
  }
  return pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH;
}

// Leftovers of writers of `path` that died before commit() (a crash or SIGKILL mid-save), so that
// repeated interrupted saves do not pile up. Best effort: a leftover that cannot be removed does not
// stop the save that found it.
void remove_dead_writers_temp_files(const std::string& path) {
  try {
    for_each_temp_file(path,
                       [](int dir_fd, const std::string& name, const std::string& suffix, const struct stat& status) {
                         if (writer_is_gone(suffix, status)) ::unlinkat(dir_fd, name.c_str(), 0);
                       });
  } catch (const StoreError&) {
    // An unlistable directory: creating the temporary file next reports what is wrong with it.
  }
}

void fsync_directory(const std::string& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) io_error("cannot open directory", directory, errno);
  const int result = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (result != 0) io_error("cannot fsync directory", directory, error);
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(const std::string& path) : path_(path), buffer_(kBufferBytes) {
  remove_dead_writers_temp_files(path);
  temp_path_ = temp_path_for(path);
  // Registered under the lock it is created under, so that no scan sees it unregistered.
  std::lock_guard<std::mutex> lock(live_temps_mutex);
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) io_error("cannot create temporary file", temp_path_, errno);
  struct stat status;
  if (::fstat(fd_, &status) != 0) {
    const int error = errno;
    ::close(fd_);
    ::unlink(temp_path_.c_str());
    io_error("cannot stat", temp_path_, error);
  }
  file_id_ = {status.st_dev, status.st_ino};
  live_temps.insert(file_id_);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temp_path_.c_str());
  }
  std::lock_guard<std::mutex> lock(live_temps_mutex);
  live_temps.erase(file_id_);
}

void AtomicFileWriter::flush() {
  for (size_t done = 0; done < buffered_;) {
    const ssize_t written = ::write(fd_, buffer_.data() + done, buffered_ - done);
    if (written < 0) {
      if (errno == EINTR) continue;
      io_error("cannot write", temp_path_, errno);
    }
    done += size_t(written);
  }
  buffered_ = 0;
}

void AtomicFileWriter::write(const void* data, size_t size) {
  const auto* bytes = static_cast<const std::byte*>(data);
  while (size > 0) {
    if (buffered_ == buffer_.size()) flush();
    const size_t take = std::min(size, buffer_.size() - buffered_);
    std::memcpy(buffer_.data() + buffered_, bytes, take);
    buffered_ += take;
    bytes += take;
    size -= take;
  }
}

void AtomicFileWriter::commit() {
  flush();
  if (::fsync(fd_) != 0) io_error("cannot fsync", temp_path_, errno);
  if (::close(fd_) != 0) {
    fd_ = -1;
    const int error = errno;
    ::unlink(temp_path_.c_str());
    io_error("cannot close", temp_path_, error);
  }
  fd_ = -1;
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int error = errno;
    ::unlink(temp_path_.c_str());
    io_error("cannot rename '" + temp_path_ + "' to", path_, error);
  }
  fsync_directory(directory_of(path_));
}

RemovedFiles remove_temp_files_in(const std::string& directory, TempFiles which) {
  RemovedFiles removed;
  try {
    for_each_temp_file_in(
        directory, "", [&](int dir_fd, const std::string& name, const std::string& suffix, const struct stat& status) {
          if ((which == TempFiles::All || writer_is_gone(suffix, status)) && ::unlinkat(dir_fd, name.c_str(), 0) == 0) {
            ++removed.count;
            removed.bytes += uint64_t(status.st_size);
          }
        });
  } catch (const StoreError&) {
    // An unlistable directory: the write that follows reports what is wrong with it.
  }
  return removed;
}

RemovedFiles remove_stale_temp_files(const std::string& path) {
  const std::string directory = directory_of(path);
  RemovedFiles removed;
  for_each_temp_file(path, [&](int dir_fd, const std::string& name, const std::string&, const struct stat& status) {
    if (::unlinkat(dir_fd, name.c_str(), 0) != 0) {
      io_error("cannot remove the stale temporary file (remove it by hand, or let this user write to its directory)",
               directory + "/" + name, errno);
    }
    ++removed.count;
    removed.bytes += uint64_t(status.st_size);
  });
  return removed;
}

FileReader::FileReader(const std::string& path) : path_(path), buffer_(kBufferBytes) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) io_error("cannot open", path, errno);
  struct stat status;
  if (::fstat(fd_, &status) != 0) {
    const int error = errno;
    ::close(fd_);
    io_error("cannot stat", path, error);
  }
  if (!S_ISREG(status.st_mode)) {
    ::close(fd_);
    throw StoreError(ErrorCode::Io, "'" + path + "' is not a regular file");
  }
  size_ = uint64_t(status.st_size);
}

FileReader::~FileReader() { ::close(fd_); }

void FileReader::read(void* out, size_t size) {
  if (size > remaining()) {
    throw StoreError(ErrorCode::Corrupt, "checkpoint '" + path_ + "' is truncated: needed " + std::to_string(size) +
                                             " more bytes at offset " + std::to_string(consumed_) + " of " +
                                             std::to_string(size_));
  }
  auto* dest = static_cast<std::byte*>(out);
  consumed_ += size;
  while (size > 0) {
    if (buffer_begin_ == buffer_end_) {
      const ssize_t got = ::read(fd_, buffer_.data(), buffer_.size());
      if (got < 0) {
        if (errno == EINTR) continue;
        io_error("cannot read", path_, errno);
      }
      if (got == 0) {
        throw StoreError(ErrorCode::Corrupt, "checkpoint '" + path_ + "' shrank while being read");
      }
      buffer_begin_ = 0;
      buffer_end_ = size_t(got);
    }
    const size_t take = std::min(size, buffer_end_ - buffer_begin_);
    std::memcpy(dest, buffer_.data() + buffer_begin_, take);
    buffer_begin_ += take;
    dest += take;
    size -= take;
  }
}

}  // namespace recdev::store
