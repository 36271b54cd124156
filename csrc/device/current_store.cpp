#include "current_store.h"

#include "store/local_store.h"

#include <mutex>
#include <utility>

namespace recdev::device {

namespace {

std::mutex& current_mutex() {
  static std::mutex* mutex = new std::mutex();
  return *mutex;
}

// Leaked on purpose, like the stores they point to: storages freed during
// interpreter shutdown still reach them.
std::shared_ptr<store::StoreClient>& current_slot() {
  static auto* slot = new std::shared_ptr<store::StoreClient>(embedded_store());
  return *slot;
}

} // namespace

std::shared_ptr<store::StoreClient> embedded_store() {
  static auto* instance = new std::shared_ptr<store::StoreClient>(std::make_shared<store::EmbeddedStoreClient>());
  return *instance;
}

std::shared_ptr<store::StoreClient> current_store() {
  std::lock_guard<std::mutex> lock(current_mutex());
  return current_slot();
}

void set_current_store(std::shared_ptr<store::StoreClient> client) {
  std::shared_ptr<store::StoreClient> previous;  // released outside the lock: a remote client closes sockets
  std::lock_guard<std::mutex> lock(current_mutex());
  previous = std::exchange(current_slot(), std::move(client));
}

} // namespace recdev::device
