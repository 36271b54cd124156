#include "command_line.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <regex>
#include <sstream>

namespace recdev::server {

namespace {

double parse_seconds(const std::string& flag, const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || !std::isfinite(value) || value < 0) {
    throw UsageError(flag + ": '" + text + "' is not a number of seconds >= 0");
  }
  return value;
}

uint32_t parse_count(const std::string& flag, const std::string& text, uint32_t minimum) {
  size_t used = 0;
  unsigned long long value = 0;
  try {
    value = text.empty() || text[0] == '-' ? 0 : std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || value < minimum || value > std::numeric_limits<uint32_t>::max()) {
    throw UsageError(flag + " must be a whole number >= " + std::to_string(minimum) + "; got '" + text + "'");
  }
  return uint32_t(value);
}

std::string trim(const std::string& text) {
  const char* space = " \t\r\n\v\f";
  const size_t first = text.find_first_not_of(space);
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(space) - first + 1);
}

// The bound of the latency bucket that holds quantile q of an opcode's requests ("<= 64 us"), or
// "> 33554432 us" when that is the last bucket.
std::string latency_quantile(const net::OpcodeCounters& opcode, double q) {
  const double rank = q * double(opcode.requests());
  uint64_t seen = 0;
  for (size_t bucket = 0; bucket + 1 < net::kLatencyBuckets; ++bucket) {
    seen += opcode.latency_buckets[bucket];
    if (double(seen) >= rank) return "<= " + std::to_string(net::latency_bucket_bound_us(bucket)) + " us";
  }
  return "> " + std::to_string(net::latency_bucket_bound_us(net::kLatencyBuckets - 2)) + " us";
}

using Setter = std::function<void(CommandLine&, const std::string&)>;

// Every flag that takes a value, with what it sets.
const std::map<std::string, Setter>& flags() {
  static const auto* table = new std::map<std::string, Setter>{
      {"--listen", [](CommandLine& c, const std::string& v) { c.server.listen = v; }},
      {"--shard", [](CommandLine& c, const std::string& v) { c.server.service.shard = parse_count("--shard", v, 0); }},
      {"--num-shards",
       [](CommandLine& c, const std::string& v) { c.server.service.num_shards = parse_count("--num-shards", v, 1); }},
      {"--token-file", [](CommandLine& c, const std::string& v) { c.token_file = v; }},
      {"--checkpoint-dir", [](CommandLine& c, const std::string& v) { c.server.checkpoint_dir = v; }},
      {"--disk-dir", [](CommandLine& c, const std::string& v) { c.server.disk_dir = v; }},
      {"--serve", [](CommandLine& c, const std::string& v) { c.server.service.serve_dir = v; }},
      {"--checkpoint-every",
       [](CommandLine& c, const std::string& v) {
         c.server.checkpoint_every = parse_seconds("--checkpoint-every", v);
       }},
      {"--max-memory", [](CommandLine& c, const std::string& v) { c.server.service.max_memory = parse_bytes(v); }},
      {"--lease-seconds",
       [](CommandLine& c, const std::string& v) {
         c.server.service.lease_seconds = parse_seconds("--lease-seconds", v);
       }},
      {"--max-staged-bytes",
       [](CommandLine& c, const std::string& v) { c.server.service.max_staged_bytes = parse_bytes(v); }},
      {"--max-connections",
       [](CommandLine& c, const std::string& v) { c.server.max_connections = parse_count("--max-connections", v, 1); }},
      {"--idle-timeout",
       [](CommandLine& c, const std::string& v) { c.server.idle_timeout = parse_seconds("--idle-timeout", v); }},
      {"--stats", [](CommandLine& c, const std::string& v) { c.stats_address = v; }},
      {"--metrics-listen",
       [](CommandLine& c, const std::string& v) {
         try {
           net::parse_host_port(v);
         } catch (const store::StoreError& error) {
           throw UsageError(std::string("--metrics-listen: ") + error.what());
         }
         c.metrics_address = v;
       }},
      {"--timeout", [](CommandLine& c, const std::string& v) { c.timeout_seconds = parse_seconds("--timeout", v); }},
  };
  return *table;
}

}  // namespace

uint64_t parse_bytes(const std::string& text) {
  static const std::regex size(R"(\s*(\d{1,19})\s*([kKmMgGtT]?)(?:i?[bB])?\s*)");
  static const std::map<char, int> shifts{{'k', 10}, {'m', 20}, {'g', 30}, {'t', 40}};
  std::smatch match;
  if (!std::regex_match(text, match, size)) {
    throw UsageError("'" + text + "' is not a size: use bytes, or a number with K, M, G or T (binary units)");
  }
  const unsigned long long value = std::stoull(match[1].str());
  const int shift = match[2].length() == 0 ? 0 : shifts.at(char(std::tolower(match[2].str()[0])));
  if (value > (std::numeric_limits<uint64_t>::max() >> shift)) throw UsageError("'" + text + "' is too large a size");
  return uint64_t(value) << shift;
}

CommandLine parse_command_line(int argc, char** argv) {
  CommandLine line;
  for (int k = 1; k < argc; ++k) {
    std::string flag = argv[k];
    std::string value;
    bool has_value = false;
    if (const size_t equals = flag.find('='); flag.rfind("--", 0) == 0 && equals != std::string::npos) {
      value = flag.substr(equals + 1);
      flag = flag.substr(0, equals);
      has_value = true;
    }
    if (flag == "-h" || flag == "--help") {
      line.help = true;
      continue;
    }
    const auto setter = flags().find(flag);
    if (setter == flags().end()) throw UsageError("unrecognized argument: " + std::string(argv[k]));
    if (!has_value) {
      if (k + 1 >= argc) throw UsageError("argument " + flag + ": expected one argument");
      value = argv[++k];
    }
    setter->second(line, value);
  }
  if (!line.stats_address.empty() && !line.metrics_address.empty()) {
    throw UsageError("--metrics-listen serves a running shard's metrics; it does not go with --stats");
  }
  return line;  // run_server checks how the values fit together (--shard below --num-shards, ...)
}

std::string read_token(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw std::runtime_error("cannot read --token-file " + path + ": " + std::strerror(errno));
  std::string first_line;
  std::getline(file, first_line);
  const std::string token = trim(first_line);
  if (token.empty()) throw std::runtime_error("--token-file " + path + " is empty; put the token on its first line");
  return token;
}

std::string usage() {
  return "usage: recdev-server [--listen HOST:PORT] [--shard I] [--num-shards N] [--token-file F]\n"
         "                     [--checkpoint-dir D] [--checkpoint-every SECONDS] [--max-memory BYTES]\n"
         "                     [--lease-seconds SECONDS] [--max-connections N] [--idle-timeout SECONDS]\n"
         "                     [--max-staged-bytes BYTES] [--disk-dir D] [--serve D]\n"
         "                     [--metrics-listen HOST:PORT]\n"
         "       recdev-server --stats HOST:PORT [--token-file F] [--timeout SECONDS]";
}

std::string help() {
  return usage() + R"(

Serve one shard of a remote recdev store (docs/server.md), or print a server's stats.

  --listen HOST:PORT        address to listen on (default 127.0.0.1:7070, loopback only; port 0 picks a
                            free port)
  --shard I                 this server's shard, 0 to N-1 (default 0)
  --num-shards N            number of shards of the store (default 1)
  --token-file F            require the token on this file's first line from every client
  --checkpoint-dir D        load this shard's checkpoint from D at start; write one there at shutdown
  --checkpoint-every S      also write a checkpoint every S seconds (needs --checkpoint-dir)
  --disk-dir D              keep the rows that tables with spill=True evict in D (docs/disk_tier.md)
  --serve D                 a read-only serving shard: serve the newest version in D (written by
                            ops.checkpoint or a shard's --checkpoint-dir), this shard's rows of it, and
                            follow new ones as they appear; writes are refused (docs/online.md)
  --max-memory BYTES        answer 'store full' errors instead of growing past BYTES (e.g. 8G);
                            default no limit
  --lease-seconds S         free a session's anonymous tables after S seconds without a connection
                            or request (default 60)
  --max-connections N       refuse connections past N open ones (default 64); connections that have not
                            sent HELLO take at most 16 and give way to newer ones
  --idle-timeout S          close a connection after S seconds without a request (default 300; clients
                            reconnect by themselves)
  --max-staged-bytes BYTES  refuse a synchronous step's gradients past BYTES staged by all fleets at
                            once (default 1G); a part waits at most 3600 s for the other ranks'
  --metrics-listen HOST:PORT
                            also serve these stats as Prometheus metrics at http://HOST:PORT/metrics
                            (no token: bind it to loopback or a private network; it shows table names)
  --stats HOST:PORT         print the stats of the server at HOST:PORT and exit
  --timeout S               --stats: give up after S seconds (default 10)
  -h, --help                show this help and exit
)";
}

std::string format_stats(const std::string& address, const net::ServerStats& stats) {
  const std::string limit = stats.max_memory == 0 ? "none" : std::to_string(stats.max_memory);
  char uptime[64];
  std::snprintf(uptime, sizeof(uptime), "%.1f s", stats.uptime_seconds);
  std::ostringstream out;
  out << "server       " << address << " (shard " << stats.shard << " of " << stats.num_shards << ")\n"
      << "tables       " << stats.tables << " (" << stats.named_tables << " named)\n"
      << "rows         " << stats.rows << "\n"
      << "bytes        " << stats.bytes << " (max-memory " << limit << ")\n"
      << "requests     " << stats.requests << "\n"
      << "errors       " << stats.errors << "\n"
      << "connections  " << stats.connections << "\n"
      << "sessions     " << stats.sessions << "\n"
      << "staged steps " << stats.staged_steps << " (" << stats.staged_bytes << " bytes)\n"
      << "uptime       " << uptime << "\n";
  if (!stats.serving_dir.empty()) {
    out << "serving      ";
    if (stats.serving_version == 0) {
      out << "no version yet of " << stats.serving_dir << "\n";
    } else {
      const double age = double(std::chrono::duration_cast<std::chrono::milliseconds>(
                                    std::chrono::system_clock::now().time_since_epoch())
                                    .count() -
                                stats.serving_written_unix_ms) /
                         1000.0;
      char written[64];
      std::snprintf(written, sizeof(written), "%.1f s", age);
      out << "version " << stats.serving_version << " of " << stats.serving_dir << ", written " << written << " ago\n";
    }
  }
  // Per opcode answered: what the requests carried and how long they took.
  for (const net::OpcodeCounters& opcode : stats.opcodes) {
    char mean[32];
    std::snprintf(mean, sizeof(mean), "%.1f us", double(opcode.latency_ns) / 1000.0 / double(opcode.requests()));
    out << "opcode       " << net::opcode_name(uint8_t(opcode.opcode)) << ": requests " << opcode.requests()
        << ", errors " << opcode.errors << ", rows " << opcode.rows << ", received " << opcode.bytes_received
        << " bytes, sent " << opcode.bytes_sent << " bytes, latency mean " << mean << ", p50 "
        << latency_quantile(opcode, 0.5) << ", p99 " << latency_quantile(opcode, 0.99) << "\n";
  }
  // Per table: what its policy did on this shard (a budget is this shard's share of the table's).
  for (const net::TableCounters& table : stats.table_counters) {
    out << "table        " << (table.name.empty() ? "(anonymous " + std::to_string(table.table_id) + ")" : table.name)
        << ": rows " << table.rows;
    if (table.policy.active()) {
      out << ", evicted " << table.evicted << ", admitted " << table.admitted << ", pending " << table.pending
          << ", policy " << store::describe(table.policy);
    }
    if (table.policy.spill) {
      out << ", on disk " << table.rows_on_disk << " rows in " << table.disk_bytes << " bytes, disk reads "
          << table.disk_reads << ", disk writes " << table.disk_writes;
    }
    out << "\n";
  }
  return out.str();
}

}  // namespace recdev::server
