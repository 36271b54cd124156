#pragma once
// The process-wide current store: the StoreClient that new tables, named
// tables and save / load go to. Embedded (an in-process store) until
// torch_recdev.connect() chooses servers. A table keeps the client that
// created it (TableBlock::client), so it works, and is freed, through that
// client after the current store changed.

#include "store/table_handle.h"

#include <memory>

namespace recdev::device {

std::shared_ptr<store::StoreClient> current_store();
void set_current_store(std::shared_ptr<store::StoreClient> client);

// The in-process store (one per process, for its whole life).
std::shared_ptr<store::StoreClient> embedded_store();

} // namespace recdev::device
