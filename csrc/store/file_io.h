// Buffered file I/O for checkpoints, reporting failures as StoreError(Io) with the path and the
// operating system's reason.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace recdev::store {

// Writes a file atomically: the bytes go to a temporary file in the destination's directory;
// commit() fsyncs it, renames it over the destination and fsyncs the directory, so after a crash
// the destination holds either its old contents or all of the new ones. A writer destroyed without
// a successful commit() removes its temporary file. A process killed while writing cannot: its
// temporary file, path.tmp.HOST.PID.N, stays until the next writer of the same path on that host
// finds that process gone and removes it (or, for a server's checkpoint, remove_stale_temp_files).
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(const std::string& path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t size);
  void commit();

 private:
  void flush();

  std::string path_;
  std::string temp_path_;
  std::pair<dev_t, ino_t> file_id_{};  // the temporary file's, while this writer holds it
  int fd_ = -1;
  std::vector<std::byte> buffer_;
  size_t buffered_ = 0;
};

// Removes the temporary files that AtomicFileWriters of `path` left behind when their process died
// before commit(): the regular files of path's directory named as temporaries of exactly this path.
// Only for a path that no live process is writing, such as a server's own checkpoint at its start.
struct RemovedFiles {
  uint64_t count = 0;
  uint64_t bytes = 0;
};
RemovedFiles remove_stale_temp_files(const std::string& path);
// Removes temporary files in `directory`, for directories of many files such as checkpoint versions:
// those whose writers are gone (their process is not running on this host), which live writers may
// share the directory with; or all of them, in a directory only one writer owns, at its start.
// Best effort.
enum class TempFiles { OfDeadWriters, All };
RemovedFiles remove_temp_files_in(const std::string& directory, TempFiles which);

class FileReader {
 public:
  explicit FileReader(const std::string& path);
  ~FileReader();
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  uint64_t size() const { return size_; }
  uint64_t remaining() const { return size_ - consumed_; }
  // Throws StoreError(Corrupt) if fewer than `size` bytes remain.
  void read(void* out, size_t size);

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint64_t consumed_ = 0;
  std::vector<std::byte> buffer_;
  size_t buffer_begin_ = 0;
  size_t buffer_end_ = 0;
};

}  // namespace recdev::store
