// The disk tier's file I/O (disk_tier.h): segment files read and written in whole aligned blocks,
// bypassing the page cache where the file system allows it, and a pool of threads that keeps many
// reads in flight.
//
// Why O_DIRECT: in production the page cache is memory the table's budget does not see — a disk tier
// read through it would grow the process's footprint by every block it touched. File systems that
// refuse O_DIRECT (tmpfs) fall back to buffered I/O (SegmentFile::direct() says which).
//
// Why a thread pool rather than io_uring: a pool of threads each issuing pread keeps as many reads in
// flight as it has threads, needs nothing beyond POSIX, and its cost (a wake-up per read) is small
// beside a disk read; see docs/disk_tier.md for the measurement.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace recdev::store {

// Every offset and size of a direct read or write is a multiple of this.
constexpr size_t kDiskAlignment = 4096;

// Memory aligned to kDiskAlignment, zero-filled.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t size);
  std::byte* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, Free> data_;
  size_t size_ = 0;
};

// One segment file, created new. Errors are StoreError(Io) naming the file and the system's reason.
class SegmentFile {
 public:
  explicit SegmentFile(std::string path);
  ~SegmentFile();
  SegmentFile(const SegmentFile&) = delete;
  SegmentFile& operator=(const SegmentFile&) = delete;

  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }
  // Whole aligned blocks, from and to aligned memory.
  void write_at(uint64_t offset, const void* data, size_t size);
  void read_at(uint64_t offset, void* data, size_t size) const;
  void remove();  // unlinks the file (it stays readable through this object until destroyed)

 private:
  std::string path_;
  int fd_ = -1;
  bool direct_ = false;
};

// Calls read(i) for every i in [0, n) on up to kReadsInFlight threads of a process-wide pool (the
// caller's among them), and returns when all have returned; the first exception thrown is rethrown
// (after every read has finished, so no thread still writes to the caller's buffers).
constexpr size_t kReadsInFlight = 32;
void run_reads(size_t n, const std::function<void(size_t)>& read);

}  // namespace recdev::store
