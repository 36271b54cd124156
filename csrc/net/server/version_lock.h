// VersionLock: a reader-writer lock that prefers the writer. A serving shard's requests hold it
// shared and its swap to a new version exclusively; glibc's default rwlock (std::shared_mutex)
// prefers readers, so a steady stream of overlapping lookups could hold a new version off forever.
// With the writer preferred, the swap waits only for the requests already running, and requests that
// arrive meanwhile wait for the swap (which moves pointers, not rows).
#pragma once

#include <pthread.h>

namespace recdev::net {

class VersionLock {
 public:
  VersionLock() {
    pthread_rwlockattr_t attributes;
    pthread_rwlockattr_init(&attributes);
    pthread_rwlockattr_setkind_np(&attributes, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&lock_, &attributes);
    pthread_rwlockattr_destroy(&attributes);
  }
  ~VersionLock() { pthread_rwlock_destroy(&lock_); }
  VersionLock(const VersionLock&) = delete;
  VersionLock& operator=(const VersionLock&) = delete;

  // The Lockable and SharedLockable names, for std::unique_lock and std::shared_lock.
  void lock() { pthread_rwlock_wrlock(&lock_); }
  void unlock() { pthread_rwlock_unlock(&lock_); }
  void lock_shared() { pthread_rwlock_rdlock(&lock_); }
  void unlock_shared() { pthread_rwlock_unlock(&lock_); }

 private:
  pthread_rwlock_t lock_;
};

}  // namespace recdev::net
