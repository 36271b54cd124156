// recdev-server --metrics-listen HOST:PORT: `GET /metrics` over plain HTTP/1.0 and 1.1, answered with
// the shard's STATS in the Prometheus text format (metrics_format.h), by one thread of its own that
// shares nothing with the shard's connections but ShardService::stats(). Every byte it reads is
// hostile: a request must be whole within kMaxRequestBytes (else 431) and kReadTimeout, an answer be
// taken within kWriteTimeout, and at most kMaxClients connections are open, a new one pushing out the
// oldest; whatever a peer does, it costs the shard one stats() per request at most and never blocks
// its request path. It needs no token and shows no row, but names every table with its size.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>

#include "net/server/server.h"
#include "net/wire/socket.h"

namespace recdev::server {

class MetricsEndpoint : public net::ServiceWatcher {
 public:
  static constexpr size_t kMaxRequestBytes = 8 * 1024;  // request line and headers
  static constexpr size_t kMaxClients = 16;
  static constexpr auto kReadTimeout = std::chrono::seconds(5);
  static constexpr auto kWriteTimeout = std::chrono::seconds(10);

  // Listens on `address` at once, so that a port in use or an address this host does not have stops
  // recdev-server before it serves: throws std::runtime_error naming --metrics-listen.
  explicit MetricsEndpoint(const std::string& address);
  ~MetricsEndpoint() override;
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // Logs "metrics on http://HOST:PORT/metrics" on stderr (the port picked for port 0) and serves.
  void start(net::ShardService& service) override;
  void stop() override;

 private:
  void run(net::ShardService& service);

  net::Socket listener_;
  net::HostPort bound_;
  int wake_[2] = {-1, -1};  // stop() writes a byte: the thread's poll returns at once
  std::thread thread_;
};

}  // namespace recdev::server
