#include "disk_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "errors.h"

namespace recdev::store {
namespace {

[[noreturn]] void io_error(const std::string& what, const std::string& path, int error) {
  std::string hint;
  if (error == ENOSPC) hint = " (the disk tier's file system is full: free space, or set max_disk_bytes)";
  throw StoreError(ErrorCode::Io, what + " " + path + ": " + std::strerror(error) + hint);
}

// Reads of one run_reads call, taken by index by whichever thread is free. Each index is read by the
// one thread that took it; once the caller's own work() returned every index is taken, so when no
// worker is inside work() any more, every read has finished.
struct ReadJob {
  const std::function<void(size_t)>* read;
  size_t n;
  std::atomic<size_t> next{0};
  size_t workers_inside = 0;  // under the pool's mutex
  std::mutex error_mutex;
  std::exception_ptr error;

  void work() {
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      try {
        (*read)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next.store(n);  // take no new reads
      }
    }
  }
};

// Threads that wait for read jobs; started at the first batch of reads, kept for the process.
class ReadPool {
 public:
  void run(ReadJob& job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (threads_ == 0) {
        for (size_t t = 0; t + 1 < kReadsInFlight; ++t) {
          std::thread([this] { serve(); }).detach();
          ++threads_;
        }
      }
      jobs_.push_back(&job);
    }
    wake_.notify_all();
    job.work();
    std::unique_lock<std::mutex> lock(mutex_);
    std::erase(jobs_, &job);
    left_.wait(lock, [&] { return job.workers_inside == 0; });
  }

 private:
  void serve() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return !jobs_.empty(); });
      ReadJob* job = jobs_.front();
      if (job->next.load() >= job->n) {  // all taken: its caller removes it
        jobs_.pop_front();
        continue;
      }
      ++job->workers_inside;
      lock.unlock();
      job->work();
      lock.lock();
      if (--job->workers_inside == 0) left_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable left_;
  std::deque<ReadJob*> jobs_;
  size_t threads_ = 0;
};

}  // namespace

AlignedBuffer::AlignedBuffer(size_t size) : size_(size) {
  if (size == 0) return;
  void* memory = nullptr;
  if (posix_memalign(&memory, kDiskAlignment, size) != 0) throw std::bad_alloc();
  std::memset(memory, 0, size);
  data_.reset(static_cast<std::byte*>(memory));
}

void AlignedBuffer::Free::operator()(std::byte* p) const { std::free(p); }

SegmentFile::SegmentFile(std::string path) : path_(std::move(path)) {
  fd_ = open(path_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | O_DIRECT, 0600);
  direct_ = fd_ >= 0;
  if (fd_ < 0 && errno == EINVAL) fd_ = open(path_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd_ < 0) io_error("cannot create the disk tier's segment file", path_, errno);
}

SegmentFile::~SegmentFile() {
  if (fd_ >= 0) close(fd_);
}

void SegmentFile::write_at(uint64_t offset, const void* data, size_t size) {
  const auto* bytes = static_cast<const std::byte*>(data);
  for (size_t done = 0; done < size;) {
    const ssize_t wrote = pwrite(fd_, bytes + done, size - done, off_t(offset + done));
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote < 0) io_error("cannot write the disk tier's segment file", path_, errno);
    if (wrote == 0) io_error("cannot write the disk tier's segment file", path_, ENOSPC);
    done += size_t(wrote);
  }
  // Without O_DIRECT the blocks would stay in the page cache: drop them, they are read rarely.
  if (!direct_) posix_fadvise(fd_, off_t(offset), off_t(size), POSIX_FADV_DONTNEED);
}

void SegmentFile::read_at(uint64_t offset, void* data, size_t size) const {
  auto* bytes = static_cast<std::byte*>(data);
  for (size_t done = 0; done < size;) {
    const ssize_t got = pread(fd_, bytes + done, size - done, off_t(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) io_error("cannot read the disk tier's segment file", path_, errno);
    if (got == 0) {
      throw StoreError(ErrorCode::Corrupt, "the disk tier's segment file " + path_ + " ends at byte " +
                                               std::to_string(offset + done) + ", before a block it holds");
    }
    done += size_t(got);
  }
}

void SegmentFile::remove() { unlink(path_.c_str()); }

void run_reads(size_t n, const std::function<void(size_t)>& read) {
  if (n == 0) return;
  ReadJob job;
  job.read = &read;
  job.n = n;
  if (n == 1) {
    job.work();
  } else {
    static ReadPool* pool = new ReadPool();  // never destroyed: its threads outlive static destruction
    pool->run(job);
  }
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace recdev::store
