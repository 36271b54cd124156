#include "disk_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "errors.h"

namespace recdev::store {
namespace {

constexpr const char* kPrefix = "recdev-";

std::mutex dir_mutex;
std::string dir_set;
bool dir_was_set = false;
std::atomic<uint64_t> next_table_dir{0};

[[noreturn]] void io_error(const std::string& what, const std::string& path) {
  throw StoreError(ErrorCode::Io, what + " " + path + ": " + std::strerror(errno));
}

std::vector<std::string> entries(const std::string& path) {
  std::vector<std::string> names;
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return names;
  while (const dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(dir);
  return names;
}

// The pid of a recdev-PID-N name, or 0.
pid_t owner_of(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0) return 0;
  const char* digits = name.c_str() + std::strlen(kPrefix);
  char* end = nullptr;
  const long pid = std::strtol(digits, &end, 10);
  if (end == digits || *end != '-' || pid <= 0) return 0;
  return pid_t(pid);
}

bool process_is_gone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

}  // namespace

uint64_t set_disk_dir(const std::string& path) {
  if (path.empty()) {
    std::lock_guard<std::mutex> lock(dir_mutex);
    dir_set.clear();
    dir_was_set = true;
    return 0;
  }
  if (mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) io_error("cannot create the disk directory", path);
  struct stat info{};
  if (stat(path.c_str(), &info) != 0) io_error("cannot use the disk directory", path);
  if (!S_ISDIR(info.st_mode)) {
    throw StoreError(ErrorCode::Io, "the disk directory " + path + " is not a directory: give a directory");
  }
  const std::string probe = path + "/.recdev-probe-" + std::to_string(getpid());
  const int fd = open(probe.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
  if (fd < 0) io_error("cannot create files in the disk directory", path);
  close(fd);
  unlink(probe.c_str());
  uint64_t removed = 0;
  for (const std::string& name : entries(path)) {
    const pid_t pid = owner_of(name);
    if (pid != 0 && pid != getpid() && process_is_gone(pid)) {
      remove_table_disk_dir(path + "/" + name);
      ++removed;
    }
  }
  std::lock_guard<std::mutex> lock(dir_mutex);
  dir_set = path;
  dir_was_set = true;
  return removed;
}

std::string disk_dir() {
  std::lock_guard<std::mutex> lock(dir_mutex);
  if (dir_was_set) return dir_set;
  const char* env = std::getenv("RECDEV_DISK_DIR");
  return env != nullptr ? env : "";
}

std::string make_table_disk_dir() {
  const std::string root = disk_dir();
  if (root.empty()) {
    throw StoreError(ErrorCode::InvalidArgument,
                     "spill=True needs a disk directory for the rows it evicts: call "
                     "torch_recdev.set_disk_dir(path) or set RECDEV_DISK_DIR (a server: recdev-server --disk-dir DIR)");
  }
  if (mkdir(root.c_str(), 0700) != 0 && errno != EEXIST) io_error("cannot create the disk directory", root);
  for (;;) {  // a name left by a dead process of the same pid is skipped
    const std::string path =
        root + "/" + kPrefix + std::to_string(getpid()) + "-" + std::to_string(next_table_dir.fetch_add(1));
    if (mkdir(path.c_str(), 0700) == 0) return path;
    if (errno != EEXIST) io_error("cannot create a table's directory in the disk directory:", path);
  }
}

void remove_table_disk_dir(const std::string& path) {
  for (const std::string& name : entries(path)) unlink((path + "/" + name).c_str());
  rmdir(path.c_str());
}

}  // namespace recdev::store
