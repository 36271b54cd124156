// A shard's STATS in the Prometheus text exposition format (version 0.0.4), for recdev-server
// --metrics-listen (metrics_http.h): the metric names of docs/server.md ("Metrics"), each family with
// its # HELP and # TYPE, counters ending in _total, the request latencies as histograms, per-opcode
// figures labelled `opcode`, per-table ones `table`.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "net/wire/protocol.h"

namespace recdev::server {

// `now_unix_ms` dates the served version's age. Tables whose names read the same once made valid
// UTF-8 are added up into one series, as are the anonymous tables (under table=""), so that no two
// samples of a family carry the same labels.
std::string format_metrics(const net::ServerStats& stats, int64_t now_unix_ms);

// A label value as the format wants it: bytes that are not UTF-8 replaced by U+FFFD (one per maximal
// invalid subpart, as Python's errors="replace" does), then \, " and newline escaped.
std::string escape_label_value(std::string_view value);

}  // namespace recdev::server
