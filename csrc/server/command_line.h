// recdev-server's command line: the flags of docs/server.md parsed into ServerOptions (or a --stats
// request), the token file, and the --stats report. Kept apart from main() so that every flag's
// parsing is in one screen.
#pragma once

#include <stdexcept>
#include <string>

#include "net/server/server.h"
#include "net/wire/protocol.h"

namespace recdev::server {

// A bad command line: main prints it under the usage and exits 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct CommandLine {
  net::ServerOptions server;
  std::string token_file;       // empty: no token; main reads it into server.service.token
  std::string stats_address;    // --stats HOST:PORT: report that server's stats instead of serving
  std::string metrics_address;  // --metrics-listen HOST:PORT: serve Prometheus metrics there too (metrics_http.h)
  double timeout_seconds = 10.0;
  bool help = false;
};

// Throws UsageError for an unknown flag, a missing or malformed value, or values out of range.
CommandLine parse_command_line(int argc, char** argv);

// "1048576", "512M", "4GiB", "2g" -> bytes (binary units). Throws UsageError otherwise.
uint64_t parse_bytes(const std::string& text);

// The token on the file's first line, without surrounding whitespace; throws std::runtime_error if
// the file cannot be read or that line is empty.
std::string read_token(const std::string& path);

std::string usage();
std::string help();
std::string format_stats(const std::string& address, const net::ServerStats& stats);

}  // namespace recdev::server
