#pragma once
// The process-wide current store: the StoreClient that new tables, named
// tables and save / load go to. Embedded (an in-process store) until
// torch_recdev.connect() chooses servers. A table keeps the client that
// created it (TableBlock::client), so it works, and is freed, through that
// client after the current store changed.

#include "store/table_handle.h"

#include <functional>
#include <memory>
#include <string>

namespace recdev::device {

// The current store; connects first if a connection is deferred (connect_on_first_use), and then
// raises that connection's error, prefixed with its description, for as long as it fails.
std::shared_ptr<store::StoreClient> current_store();
void set_current_store(std::shared_ptr<store::StoreClient> client);
// Reads the answers of the current store's requests that nothing waited for (connect's
// overlap_updates) and raises a refused one: part of synchronizing the device. Connects nothing.
void wait_for_store_answers();

// Makes `connect()` the current store at the first current_store() call, so that configuring a
// remote store (RECDEV_SERVERS at `import torch`) opens no socket. `description` prefixes its errors
// (e.g. "RECDEV_SERVERS='tcp://...'"). set_current_store drops a deferred connection.
void connect_on_first_use(std::function<std::shared_ptr<store::StoreClient>()> connect, std::string description);

// The in-process store (one per process, for its whole life).
std::shared_ptr<store::StoreClient> embedded_store();

}  // namespace recdev::device
