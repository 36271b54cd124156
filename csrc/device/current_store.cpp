#include "current_store.h"

#include "store/errors.h"
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

struct DeferredConnection {
  std::function<std::shared_ptr<store::StoreClient>()> connect;
  std::string description;
};

DeferredConnection& deferred_slot() {
  static auto* slot = new DeferredConnection();
  return *slot;
}

}  // namespace

std::shared_ptr<store::StoreClient> embedded_store() {
  static auto* instance = new std::shared_ptr<store::StoreClient>(std::make_shared<store::EmbeddedStoreClient>());
  return *instance;
}

std::shared_ptr<store::StoreClient> current_store() {
  // Connecting under the lock: every other first use needs the same connection, and waits for it.
  std::lock_guard<std::mutex> lock(current_mutex());
  DeferredConnection& deferred = deferred_slot();
  if (deferred.connect) {
    try {
      current_slot() = deferred.connect();
    } catch (const store::StoreError& error) {
      throw store::StoreError(error.code(), deferred.description + ": " + error.what());
    }
    deferred = DeferredConnection{};
  }
  return current_slot();
}

void set_current_store(std::shared_ptr<store::StoreClient> client) {
  std::shared_ptr<store::StoreClient> previous;  // released outside the lock: a remote client closes sockets
  std::lock_guard<std::mutex> lock(current_mutex());
  deferred_slot() = DeferredConnection{};
  previous = std::exchange(current_slot(), std::move(client));
}

void wait_for_store_answers() {
  std::shared_ptr<store::StoreClient> client;
  {
    std::lock_guard<std::mutex> lock(current_mutex());
    client = current_slot();  // a connection still deferred has sent nothing
  }
  client->wait_for_answers();
}

void connect_on_first_use(std::function<std::shared_ptr<store::StoreClient>()> connect, std::string description) {
  std::lock_guard<std::mutex> lock(current_mutex());
  deferred_slot() = DeferredConnection{std::move(connect), std::move(description)};
}

}  // namespace recdev::device
