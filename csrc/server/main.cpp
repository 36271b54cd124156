// recdev-server: the native executable serving one shard of a remote recdev store, built from
// csrc/store and csrc/net alone (no torch, no Python). Flags as in docs/server.md:
//
//   recdev-server --listen 127.0.0.1:7070 --shard 0 --num-shards 2 [--token-file F]
//                 [--checkpoint-dir D] [--checkpoint-every S] [--max-memory BYTES] ...
//                 [--metrics-listen 127.0.0.1:9464]
//   recdev-server --stats 127.0.0.1:7070 [--token-file F] [--timeout S]
//
// Exit status: 0 after a clean shutdown (SIGTERM / SIGINT) or a --stats report; 1 when the server
// cannot start or the stats cannot be read; 2 for a bad command line.
#include <malloc.h>

#include <cstdio>
#include <exception>
#include <optional>
#include <string>

#include "net/client/connection.h"
#include "net/server/server.h"
#include "server/command_line.h"
#include "server/metrics_http.h"
#include "store/errors.h"

namespace {

using recdev::server::CommandLine;

int print_stats(const CommandLine& args) {
  const auto timeout = std::chrono::milliseconds(int64_t(args.timeout_seconds * 1000));
  recdev::net::Connection connection(args.stats_address, args.server.service.token, timeout);
  const auto stats = connection.call<recdev::net::ServerStats>(recdev::net::Opcode::Stats, recdev::net::Empty{});
  std::fputs(recdev::server::format_stats(args.stats_address, stats).c_str(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // glibc raises its mmap threshold to the largest block freed (up to 32 MiB), after which request
  // and response buffers come from the connection threads' heaps and stay resident there when freed:
  // 20 idle connections after one 32 MiB GATHER each kept 488 MiB. A fixed threshold maps every
  // block from 1 MiB and unmaps it when freed (153 MiB: the table's own rows).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  CommandLine args;
  try {
    args = recdev::server::parse_command_line(argc, argv);
  } catch (const recdev::server::UsageError& error) {
    std::fprintf(stderr, "%s\nrecdev-server: error: %s\n", recdev::server::usage().c_str(), error.what());
    return 2;
  }
  if (args.help) {
    std::fputs(recdev::server::help().c_str(), stdout);
    return 0;
  }
  try {
    if (!args.token_file.empty()) args.server.service.token = recdev::server::read_token(args.token_file);
    if (!args.stats_address.empty()) return print_stats(args);
    // Bound before the shard loads anything, so that a port in use is told at once.
    std::optional<recdev::server::MetricsEndpoint> metrics;
    if (!args.metrics_address.empty()) metrics.emplace(args.metrics_address);
    recdev::net::run_server(args.server, metrics ? &*metrics : nullptr);
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "recdev-server: %s\n", error.what());
    return 1;
  }
}
