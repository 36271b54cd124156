// recdev-server's main loop: listens, reads each new connection's HELLO itself (a few KiB at most,
// within a short deadline, the oldest such connection dropped for a newer one when too many wait),
// then runs one thread per authenticated connection (up to a cap) that reads frames and answers them
// through a ShardService until the client closes it or leaves it idle; frees lapsed sessions, writes
// checkpoints, and on SIGTERM or SIGINT stops accepting, lets the requests in progress finish, writes
// a last checkpoint and returns. Nothing a client sends can end it: every connection's failures end
// that connection.
#pragma once

#include <cstdint>
#include <string>

#include "service.h"

namespace recdev::net {

struct ServerOptions {
  std::string listen = "127.0.0.1:7070";
  ServiceOptions service;
  std::string checkpoint_dir;   // empty: no checkpoints
  std::string disk_dir;         // the disk tier's (store/disk_dir.h); empty: tables cannot spill
  double checkpoint_every = 0;  // seconds between periodic checkpoints; 0 = only at shutdown
  uint32_t max_connections = 64;
  double idle_timeout = 300;  // seconds without a request after which a connection is closed
};

// What runs beside the protocol and reads the shard while it serves (recdev-server's metrics
// endpoint, csrc/server/metrics_http.h): started once the shard holds its tables, just before it
// accepts connections; stopped when it stops accepting them, before the service is gone.
class ServiceWatcher {
 public:
  virtual ~ServiceWatcher() = default;
  virtual void start(ShardService& service) = 0;
  virtual void stop() = 0;
};

// Serves until SIGTERM or SIGINT; prints "listening on HOST:PORT" on stdout once it accepts
// connections. Throws StoreError for a bad option, an address it cannot listen on, or a checkpoint
// it cannot load; returns normally after a clean shutdown. `watcher` (may be null) runs meanwhile.
void run_server(const ServerOptions& options, ServiceWatcher* watcher = nullptr);

}  // namespace recdev::net
