#include "metrics_format.h"

#include <cstdio>
#include <map>

namespace recdev::server {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// The bytes as UTF-8: each maximal subpart of an ill-formed sequence (Unicode 15, 3.9) becomes one
// U+FFFD, so the text reads as Python's bytes.decode("utf-8", "replace") reads it.
std::string valid_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const auto lead = uint8_t(bytes[i]);
    if (lead < 0x80) {
      out += char(lead);
      ++i;
      continue;
    }
    // How many continuation bytes the lead byte calls for, and the range of the first (which rules
    // out overlong forms, surrogates and code points past U+10FFFF).
    int need = 0;
    uint8_t low = 0x80, high = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      need = 1;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      need = 2;
      if (lead == 0xE0) low = 0xA0;
      if (lead == 0xED) high = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      need = 3;
      if (lead == 0xF0) low = 0x90;
      if (lead == 0xF4) high = 0x8F;
    }
    size_t end = i + 1;
    int got = 0;
    while (got < need && end < bytes.size() && uint8_t(bytes[end]) >= low && uint8_t(bytes[end]) <= high) {
      low = 0x80;
      high = 0xBF;
      ++end;
      ++got;
    }
    if (need != 0 && got == need) {
      out.append(bytes.substr(i, end - i));
    } else {
      out += kReplacement;
    }
    i = end;
  }
  return out;
}

// Nanoseconds as decimal seconds, exactly ("0.000064", "1.5").
std::string seconds_of_ns(uint64_t ns) {
  std::string fraction = std::to_string(1'000'000'000 + ns % 1'000'000'000).substr(1);
  while (!fraction.empty() && fraction.back() == '0') fraction.pop_back();
  return std::to_string(ns / 1'000'000'000) + (fraction.empty() ? "" : "." + fraction);
}

std::string decimal(double value) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.3f", value);
  return text;
}

// The text of the exposition, a family at a time: every sample of a family follows its # TYPE.
class Exposition {
 public:
  void family(const char* name, const char* type, const char* help) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    out_ += help;  // ours: no backslash or newline to escape
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }
  // A sample; `labels` already escaped (`opcode="GATHER"`), empty for none.
  void sample(std::string_view name, const std::string& labels, const std::string& value) {
    out_ += name;
    if (!labels.empty()) {
      out_ += '{';
      out_ += labels;
      out_ += '}';
    }
    out_ += ' ';
    out_ += value;
    out_ += '\n';
  }
  void sample(std::string_view name, const std::string& labels, uint64_t value) {
    sample(name, labels, std::to_string(value));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

std::string label(const char* name, std::string_view value) {
  return std::string(name) + "=\"" + escape_label_value(value) + "\"";
}

// One `table` label's figures: the tables whose labels are the same, added up.
struct TableSeries {
  uint64_t rows = 0, evicted = 0, admitted = 0, pending = 0;
  uint64_t rows_on_disk = 0, disk_bytes = 0, disk_reads = 0, disk_writes = 0;
  bool policy = false, spill = false;
};

std::map<std::string, TableSeries> table_series(const net::ServerStats& stats) {
  std::map<std::string, TableSeries> series;
  for (const net::TableCounters& table : stats.table_counters) {
    TableSeries& sum = series[label("table", table.name)];
    sum.rows += table.rows;
    sum.evicted += table.evicted;
    sum.admitted += table.admitted;
    sum.pending += table.pending;
    sum.rows_on_disk += table.rows_on_disk;
    sum.disk_bytes += table.disk_bytes;
    sum.disk_reads += table.disk_reads;
    sum.disk_writes += table.disk_writes;
    sum.policy |= table.policy.active();
    sum.spill |= table.policy.spill;
  }
  return series;
}

void server_figures(Exposition& out, const net::ServerStats& stats, int64_t now_unix_ms) {
  out.family("recdev_server_info", "gauge", "Always 1: this shard's number, the store's shards, the protocol version.");
  out.sample("recdev_server_info",
             label("shard", std::to_string(stats.shard)) + "," + label("num_shards", std::to_string(stats.num_shards)) +
                 "," + label("protocol", std::to_string(net::kProtocolVersion)),
             1);
  const struct {
    const char* name;
    const char* help;
    uint64_t value;
  } gauges[] = {
      {"recdev_tables", "Tables on this shard, named and anonymous.", stats.tables},
      {"recdev_named_tables", "Named tables on this shard.", stats.named_tables},
      {"recdev_rows", "Materialized rows of every table.", stats.rows},
      {"recdev_memory_bytes", "Memory --max-memory counts: tables, staged loads, snapshots, steps, buffers.",
       stats.bytes},
      {"recdev_max_memory_bytes", "--max-memory (0: no limit).", stats.max_memory},
      {"recdev_connections", "Open connections.", stats.connections},
      {"recdev_sessions", "Live client sessions.", stats.sessions},
      {"recdev_staged_steps", "Synchronous steps held (collecting parts, or not yet committed by every rank).",
       stats.staged_steps},
      {"recdev_staged_bytes", "Bytes of the synchronous steps' staged parts.", stats.staged_bytes},
  };
  for (const auto& gauge : gauges) {
    out.family(gauge.name, "gauge", gauge.help);
    out.sample(gauge.name, "", gauge.value);
  }
  out.family("recdev_uptime_seconds", "gauge", "Seconds since the server started.");
  out.sample("recdev_uptime_seconds", "", decimal(stats.uptime_seconds));
  if (stats.serving_dir.empty()) return;
  // A serving shard (--serve): the version it serves (0 before its first) and when it was written.
  const std::string dir = label("dir", stats.serving_dir);
  out.family("recdev_serving_version", "gauge", "The version a serving shard (--serve) serves, 0 before its first.");
  out.sample("recdev_serving_version", dir, stats.serving_version);
  if (stats.serving_version == 0) return;
  out.family("recdev_serving_version_timestamp_seconds", "gauge", "When the version served was written (unix time).");
  out.sample("recdev_serving_version_timestamp_seconds", dir, decimal(double(stats.serving_written_unix_ms) / 1000));
  out.family("recdev_serving_version_age_seconds", "gauge", "Seconds since the version served was written.");
  out.sample("recdev_serving_version_age_seconds", dir,
             decimal(double(now_unix_ms - stats.serving_written_unix_ms) / 1000));
}

void request_figures(Exposition& out, const net::ServerStats& stats) {
  const struct {
    const char* name;
    const char* help;
    uint64_t net::OpcodeCounters::* value;
  } counters[] = {
      {"recdev_request_errors_total", "Requests answered with an error, by opcode.", &net::OpcodeCounters::errors},
      {"recdev_request_received_bytes_total", "Bytes of request frames, headers included, by opcode.",
       &net::OpcodeCounters::bytes_received},
      {"recdev_request_sent_bytes_total", "Bytes of response frames, headers included, by opcode.",
       &net::OpcodeCounters::bytes_sent},
      {"recdev_request_rows_total", "Row ids the requests named (and rows DUMP answered), by opcode.",
       &net::OpcodeCounters::rows},
  };
  out.family("recdev_requests_total", "counter", "Requests answered, by opcode.");
  for (const net::OpcodeCounters& opcode : stats.opcodes) {
    out.sample("recdev_requests_total", label("opcode", net::opcode_name(uint8_t(opcode.opcode))), opcode.requests());
  }
  for (const auto& counter : counters) {
    out.family(counter.name, "counter", counter.help);
    for (const net::OpcodeCounters& opcode : stats.opcodes) {
      out.sample(counter.name, label("opcode", net::opcode_name(uint8_t(opcode.opcode))), opcode.*counter.value);
    }
  }
  out.family("recdev_request_duration_seconds", "histogram",
             "Seconds from a request's frame read to its answer built, by opcode.");
  for (const net::OpcodeCounters& opcode : stats.opcodes) {
    const std::string name = label("opcode", net::opcode_name(uint8_t(opcode.opcode)));
    uint64_t cumulative = 0;
    for (size_t bucket = 0; bucket + 1 < net::kLatencyBuckets; ++bucket) {
      cumulative += opcode.latency_buckets[bucket];
      const std::string le = seconds_of_ns(net::latency_bucket_bound_us(bucket) * 1000);
      out.sample("recdev_request_duration_seconds_bucket", name + "," + label("le", le), cumulative);
    }
    out.sample("recdev_request_duration_seconds_bucket", name + ",le=\"+Inf\"", opcode.requests());
    out.sample("recdev_request_duration_seconds_sum", name, seconds_of_ns(opcode.latency_ns));
    out.sample("recdev_request_duration_seconds_count", name, opcode.requests());
  }
}

void table_figures(Exposition& out, const net::ServerStats& stats) {
  const std::map<std::string, TableSeries> series = table_series(stats);
  // Which tables a family has samples for: every table, those with a policy, those that spill.
  enum class Tables { All, WithPolicy, Spilling };
  const struct {
    const char* name;
    const char* type;
    const char* help;
    Tables tables;
    uint64_t TableSeries::* value;
  } families[] = {
      {"recdev_table_rows", "gauge", "Materialized rows of the table on this shard (both tiers).", Tables::All,
       &TableSeries::rows},
      {"recdev_table_evicted_rows_total", "counter", "Rows the table's policy evicted on this shard.",
       Tables::WithPolicy, &TableSeries::evicted},
      {"recdev_table_admitted_rows_total", "counter", "Rows the table's policy admitted on this shard.",
       Tables::WithPolicy, &TableSeries::admitted},
      {"recdev_table_pending_rows", "gauge", "Rows looked up but not admitted yet (admit_after).", Tables::WithPolicy,
       &TableSeries::pending},
      {"recdev_table_disk_rows", "gauge", "Rows of the table in its disk tier (spill=True).", Tables::Spilling,
       &TableSeries::rows_on_disk},
      {"recdev_table_disk_bytes", "gauge", "Bytes of the table's disk tier files.", Tables::Spilling,
       &TableSeries::disk_bytes},
      {"recdev_table_disk_reads_total", "counter", "Rows read back from the disk tier.", Tables::Spilling,
       &TableSeries::disk_reads},
      {"recdev_table_disk_writes_total", "counter", "Rows written to the disk tier.", Tables::Spilling,
       &TableSeries::disk_writes},
  };
  for (const auto& family : families) {
    out.family(family.name, family.type, family.help);
    for (const auto& [labels, figures] : series) {
      const bool has = family.tables == Tables::All || (family.tables == Tables::WithPolicy && figures.policy) ||
                       (family.tables == Tables::Spilling && figures.spill);
      if (has) out.sample(family.name, labels, figures.*family.value);
    }
  }
}

}  // namespace

std::string escape_label_value(std::string_view value) {
  const std::string text = valid_utf8(value);
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string format_metrics(const net::ServerStats& stats, int64_t now_unix_ms) {
  Exposition out;
  server_figures(out, stats, now_unix_ms);
  request_figures(out, stats);
  table_figures(out, stats);
  return out.take();
}

}  // namespace recdev::server
