#include "checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint_format.h"
#include "errors.h"
#include "file_io.h"
#include "frequency_sketch.h"

namespace recdev::store {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoints store little-endian values by copying the host's bytes");

constexpr char kMagic[8] = {'R', 'E', 'C', 'D', 'E', 'V', 'T', 'B'};
// 3: the u32 after init_kind, reserved (0) in version 2, is the table's element type
// (element_type.h; 0 is float32, so a version 2 file reads as float32 tables).
// 4: every section ends with its policy block (u64 policy_bytes, then that many bytes of
// encode_policy_state; 0 for a table without a policy).
// 5: the u32 after optimizer_kind, reserved (0) before, holds optimizer flags (bit 0: stochastic
// rounding), and a u64 rounding_seed follows beta2, so that a checkpoint keeps the rounding mode.
// 6: the file ends with a CRC-32C instead of a CRC-32: the CPU computes it at memory speed, where the
// table-driven CRC-32 (1.6 GB/s) was a sixth of a large save's time. The bytes before are version 5's.
constexpr uint32_t kFormatVersion = 6;
constexpr uint32_t kCrc32cFormatVersion = 6;
constexpr uint32_t kPolicyFormatVersion = 4;
constexpr uint32_t kOldestFormatVersion = 2;
// magic, version, table_count, crc
constexpr uint64_t kFileFixedBytes = sizeof(kMagic) + 4 + 4 + 4;
// name_length, num_rows, dim, state_words, init_kind, element type, init a, b, seed, init_stream,
// optimizer_kind, optimizer flags, 7 optimizer parameters, (rounding_seed from version 5,) optimizer_step,
// row_count; the smallest section, of the oldest version, bounds the table count.
constexpr uint64_t kSectionFixedBytes = 4 + 8 + 4 + 4 + 4 + 4 + 8 + 8 + 8 + 8 + 4 + 4 + 7 * 8 + 8 + 8;

// The policy block's flags (what was a reserved 0 before the disk tier): bit 0 spill, bit 1 a u64
// max_disk_bytes follows the flags.
constexpr uint32_t kPolicySpills = 1;
constexpr uint32_t kPolicyHasMaxDiskBytes = 2;

// The policy block's fixed part: config (u64 max_rows, u64 max_bytes, u32 evict, u32 admit_after,
// f64 half_life, u64 ttl_steps, f64 ttl_seconds, u32 sketch_width, u32 reserved), clocks (5 x u64),
// u64 sketch_since_aging, u64 sketch_count; then sketch_count x u16, u64 touch_count and touch_count
// x (u64 id, u64 tick, u64 step, f64 age in seconds, f64 lfu score).
constexpr uint64_t kPolicyFixedBytes = 8 + 8 + 4 + 4 + 8 + 8 + 8 + 4 + 4 + 5 * 8 + 8 + 8;
constexpr uint64_t kTouchBytes = 5 * 8;

class ByteWriter {
 public:
  template <class T>
  void put(const T& value) {
    bytes_.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  std::string take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

class ByteReader {
 public:
  ByteReader(const void* data, size_t size) : data_(static_cast<const char*>(data)), size_(size) {}
  template <class T>
  T get() {
    need(sizeof(T));
    T value;
    std::memcpy(&value, data_ + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }
  uint64_t remaining() const { return size_ - offset_; }
  void need(uint64_t bytes) const {
    if (bytes > remaining()) {
      throw StoreError(ErrorCode::Corrupt, "policy block of " + std::to_string(size_) + " bytes is truncated");
    }
  }

 private:
  const char* data_;
  size_t size_;
  size_t offset_ = 0;
};

[[noreturn]] void bad_policy(const std::string& problem) {
  throw StoreError(ErrorCode::Corrupt, "policy block " + problem);
}

using HeaderCheck = std::function<void(const CheckpointTableInfo&)>;

// The state width is not part of the shape: it follows the optimizer, which a load restores.
// The element type is: rows are never loaded as another type.
bool same_shape(const TableConfig& lhs, const TableConfig& rhs) {
  return lhs.num_rows == rhs.num_rows && lhs.row_words == rhs.row_words && lhs.dtype == rhs.dtype;
}

std::string shape_text(const TableConfig& config) {
  // float32 tables read as they did before tables had a type.
  const std::string dtype = config.dtype == ElementType::Float32 ? "" : " words of " + describe(config.dtype);
  return "num_rows=" + std::to_string(config.num_rows) + ", dim=" + std::to_string(config.row_words) + dtype;
}

// Returns the number of rows written.
uint64_t write_section(ChecksummedWriter& out, const std::string& name, const Table& table) {
  size_t record_bytes = 0;
  uint64_t rows = 0;
  const bool policy = table.policy().active();
  std::vector<uint64_t> written;
  table.scan(
      [&](const TableScanHeader& header) {
        write_section_header(out, name, header);
        rows = header.row_count;
        record_bytes = (size_t{header.config.row_words} + header.config.state_words) * sizeof(float);
      },
      [&](uint64_t row_id, const float* record) {
        out.put(row_id);
        out.put_bytes(record, record_bytes);
        if (policy) written.push_back(row_id);
      });
  // The policy as of just after the snapshot: metadata of rows a request added meanwhile is left
  // out (rows it evicted meanwhile are in the file and get fresh metadata at load).
  std::optional<TablePolicyState> state;
  if (policy) state = table.policy_state();
  if (state) {
    std::sort(written.begin(), written.end());
    std::erase_if(state->touches,
                  [&](const RowTouch& row) { return !std::binary_search(written.begin(), written.end(), row.id); });
  }
  write_policy_block(out, state);
  return rows;
}

CheckpointSummary write_checkpoint(const std::string& path,
                                   const std::vector<std::pair<std::string, const Table*>>& tables) {
  for (const auto& [name, table] : tables) {
    if (name.size() > kMaxNameLength) {
      throw StoreError(ErrorCode::InvalidArgument, "table name of " + std::to_string(name.size()) +
                                                       " bytes is longer than a checkpoint allows (" +
                                                       std::to_string(kMaxNameLength) + ")");
    }
  }
  ChecksummedWriter out(path, Checksum::Crc32c);
  out.put_bytes(kMagic, sizeof(kMagic));
  out.put(kFormatVersion);
  out.put(uint32_t(tables.size()));
  CheckpointSummary summary;
  summary.tables = tables.size();
  for (const auto& [name, table] : tables) summary.rows += write_section(out, name, *table);
  out.finish();
  summary.bytes = out.bytes();
  summary.crc = out.crc();
  return summary;
}

// Reads one section. check_header sees the header before any row is read; rows are staged only if
// stage_rows (otherwise they are just checked and checksummed).
StagedTable read_section(ChecksummedReader& in, const std::string& path, uint32_t version, size_t index,
                         const HeaderCheck& check_header, bool stage_rows) {
  CheckpointTableInfo info = read_section_header(in, path, version, index);
  check_header(info);
  const std::string table = label(info.name, index);
  const uint32_t record_words = info.config.row_words + info.config.state_words;
  StagedTable staged{std::move(info), RowSet(record_words)};
  read_section_rows(in, path, table, staged, stage_rows);
  if (version >= kPolicyFormatVersion) read_policy_block(in, path, table, staged);
  return staged;
}

// The checksum the file's format version ends with, read ahead of the checksummed pass that reads the
// version again and refuses what is not a checkpoint (so a file too short or of another kind gets
// any answer here).
Checksum file_checksum(const std::string& path) {
  FileReader file(path);
  if (file.size() < sizeof(kMagic) + sizeof(uint32_t)) return Checksum::Crc32c;
  char magic[sizeof(kMagic)];
  uint32_t version;
  file.read(magic, sizeof(magic));
  file.read(&version, sizeof(version));
  return version < kCrc32cFormatVersion ? Checksum::Crc32 : Checksum::Crc32c;
}

std::vector<StagedTable> read_checkpoint(const std::string& path, const HeaderCheck& check_header, bool stage_rows) {
  ChecksummedReader in(path, file_checksum(path));
  if (in.size() < kFileFixedBytes) {
    corrupt(path, "is too small to be a checkpoint (" + std::to_string(in.size()) + " bytes)");
  }
  char magic[sizeof(kMagic)];
  in.get_bytes(magic, sizeof(magic));
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) corrupt(path, "is not a recdev store checkpoint (bad magic)");
  const uint32_t version = in.get<uint32_t>();
  if (version < kOldestFormatVersion || version > kFormatVersion) {
    corrupt(path, "has unsupported format version " + std::to_string(version) + "; this build reads versions " +
                      std::to_string(kOldestFormatVersion) + " to " + std::to_string(kFormatVersion));
  }
  const uint32_t table_count = in.get<uint32_t>();
  if (table_count > (in.remaining() - kCrcBytes) / kSectionFixedBytes) {
    corrupt(path, "claims " + std::to_string(table_count) + " tables, more than its " + std::to_string(in.size()) +
                      " bytes can hold");
  }
  std::vector<StagedTable> staged;
  staged.reserve(table_count);
  for (size_t index = 0; index < table_count; ++index) {
    staged.push_back(read_section(in, path, version, index, check_header, stage_rows));
  }
  check_file_end(in, path);
  return staged;
}

// The rows, init rule and optimizer, and the file's policy if it has one: the table's own policy is
// removed first so that it does not evict installed rows the file's policy keeps. A file without a
// policy leaves the table's policy, which adopts the rows (table.h).
void install_staged(Table& table, StagedTable& staged) {
  const CheckpointTableInfo& info = staged.info;
  if (info.policy) table.set_policy(TablePolicyConfig{});
  table.install(staged.rows, info.config.init, info.init_stream, info.optimizer, info.optimizer_step);
  if (info.policy) table.restore_policy_state(*info.policy);
}

}  // namespace

std::vector<std::string> install_into_store(const std::string& path, std::vector<StagedTable>& staged, Store& store) {
  for (const StagedTable& table : staged) {
    if (const auto id = store.find(table.info.name)) {
      const TableConfig existing = store.table(*id)->config();
      if (!same_shape(table.info.config, existing)) {
        corrupt(path, "holds table '" + table.info.name + "' with " + shape_text(table.info.config) +
                          ", but the store's table of that name has " + shape_text(existing));
      }
    }
  }
  // Every section is verified; only now are tables created and filled.
  std::vector<std::shared_ptr<Table>> targets;
  targets.reserve(staged.size());
  for (const StagedTable& table : staged) {
    const auto id = store.find(table.info.name);
    targets.push_back(store.table(id ? *id : store.create_named_table(table.info.name, table.info.config)));
  }
  std::vector<std::string> names;
  names.reserve(staged.size());
  for (size_t i = 0; i < staged.size(); ++i) {
    install_staged(*targets[i], staged[i]);
    names.push_back(staged[i].info.name);
  }
  return names;
}

std::string encode_policy_state(const TablePolicyState& state) {
  ByteWriter out;
  const TablePolicyConfig& config = state.config;
  out.put(config.max_rows);
  out.put(config.max_bytes);
  out.put(uint32_t(config.evict));
  out.put(config.admit_after);
  out.put(config.half_life);
  out.put(config.ttl_steps);
  out.put(config.ttl_seconds);
  out.put(config.sketch_width);
  out.put(uint32_t((config.spill ? kPolicySpills : 0) | (config.max_disk_bytes != 0 ? kPolicyHasMaxDiskBytes : 0)));
  if (config.max_disk_bytes != 0) out.put(config.max_disk_bytes);
  for (uint64_t clock :
       {state.clocks.tick, state.clocks.step, state.clocks.evicted, state.clocks.admitted, state.clocks.pending}) {
    out.put(clock);
  }
  out.put(state.sketch_since_aging);
  out.put(uint64_t(state.sketch.size()));
  for (uint16_t counter : state.sketch) out.put(counter);
  out.put(uint64_t(state.touches.size()));
  for (const RowTouch& row : state.touches) {
    out.put(row.id);
    out.put(row.tick);
    out.put(row.step);
    out.put(row.time);
    out.put(row.score);
  }
  return out.take();
}

TablePolicyState decode_policy_state(const void* data, size_t size, uint64_t num_rows, uint64_t max_touches) {
  ByteReader in(data, size);
  in.need(kPolicyFixedBytes);
  TablePolicyState state;
  TablePolicyConfig& config = state.config;
  config.max_rows = in.get<uint64_t>();
  config.max_bytes = in.get<uint64_t>();
  const uint32_t evict = in.get<uint32_t>();
  if (evict > uint32_t(EvictKind::Ttl)) bad_policy("has an unknown eviction kind " + std::to_string(evict));
  config.evict = EvictKind(evict);
  config.admit_after = in.get<uint32_t>();
  config.half_life = in.get<double>();
  config.ttl_steps = in.get<uint64_t>();
  config.ttl_seconds = in.get<double>();
  config.sketch_width = in.get<uint32_t>();
  const uint32_t flags = in.get<uint32_t>();
  if ((flags & ~(kPolicySpills | kPolicyHasMaxDiskBytes)) != 0) {
    bad_policy("has unknown policy flags " + std::to_string(flags) + " (written by a newer recdev?)");
  }
  config.spill = (flags & kPolicySpills) != 0;
  if ((flags & kPolicyHasMaxDiskBytes) != 0) config.max_disk_bytes = in.get<uint64_t>();
  if (!config.active()) bad_policy("holds an inactive policy");
  try {
    validate_policy(config);
  } catch (const StoreError& error) {
    bad_policy(std::string("holds an invalid policy: ") + error.what());
  }
  state.clocks.tick = in.get<uint64_t>();
  state.clocks.step = in.get<uint64_t>();
  state.clocks.evicted = in.get<uint64_t>();
  state.clocks.admitted = in.get<uint64_t>();
  state.clocks.pending = in.get<uint64_t>();
  state.sketch_since_aging = in.get<uint64_t>();
  const uint64_t sketch_count = in.get<uint64_t>();
  const uint64_t sketch_expected = config.admit_after > 1 ? FrequencySketch::kDepth * uint64_t{config.sketch_width} : 0;
  if (sketch_count != 0 && sketch_count != sketch_expected) {
    bad_policy("has an admission sketch of " + std::to_string(sketch_count) + " counters; its policy's holds " +
               std::to_string(sketch_expected));
  }
  in.need(sketch_count * sizeof(uint16_t));
  state.sketch.resize(sketch_count);
  for (uint16_t& counter : state.sketch) counter = in.get<uint16_t>();
  const uint64_t touch_count = in.get<uint64_t>();
  if (touch_count > max_touches || touch_count > in.remaining() / kTouchBytes) {
    bad_policy("claims touch metadata for " + std::to_string(touch_count) + " rows, more than its table's " +
               std::to_string(max_touches) + " rows or its " + std::to_string(size) + " bytes hold");
  }
  state.touches.resize(touch_count);
  std::vector<uint64_t> ids;
  ids.reserve(touch_count);
  for (RowTouch& row : state.touches) {
    row.id = in.get<uint64_t>();
    row.tick = in.get<uint64_t>();
    row.step = in.get<uint64_t>();
    row.time = in.get<double>();
    row.score = in.get<double>();
    if (row.id >= num_rows) {
      bad_policy("has touch metadata for row " + std::to_string(row.id) + ", outside [0, " + std::to_string(num_rows) +
                 ")");
    }
    ids.push_back(row.id);
  }
  std::sort(ids.begin(), ids.end());
  const auto repeat = std::adjacent_find(ids.begin(), ids.end());
  if (repeat != ids.end()) bad_policy("has touch metadata for row " + std::to_string(*repeat) + " twice");
  if (in.remaining() != 0) bad_policy("has " + std::to_string(in.remaining()) + " unexpected bytes at its end");
  return state;
}

void save_table(const std::string& path, const Table& table, const std::string& name) {
  write_checkpoint(path, {{name, &table}});
}

void load_table(const std::string& path, Table& table) {
  const TableConfig expected = table.config();
  size_t sections = 0;
  std::vector<StagedTable> staged = read_checkpoint(
      path,
      [&](const CheckpointTableInfo& info) {
        if (++sections > 1) corrupt(path, "holds more than one table; load it with load_store");
        if (!same_shape(info.config, expected)) {
          corrupt(path, "holds a table with " + shape_text(info.config) + ", but the destination table " +
                            std::to_string(table.id()) + " has " + shape_text(expected));
        }
      },
      true);
  if (staged.empty()) corrupt(path, "holds no table");
  install_staged(table, staged[0]);
}

CheckpointSummary save_store(const std::string& path, const Store& store) {
  const auto named = store.named_tables();
  std::vector<std::pair<std::string, const Table*>> tables;
  tables.reserve(named.size());
  for (const auto& [name, table] : named) tables.emplace_back(name, table.get());
  return write_checkpoint(path, tables);
}

std::vector<StagedTable> read_store_file(const std::string& path) {
  std::set<std::string> seen;
  return read_checkpoint(
      path,
      [&](const CheckpointTableInfo& info) {
        if (info.name.empty()) corrupt(path, "holds an anonymous table; load it with load_table");
        if (!seen.insert(info.name).second) corrupt(path, "holds table '" + info.name + "' twice");
      },
      true);
}

std::vector<std::string> load_store(const std::string& path, Store& store) {
  std::vector<StagedTable> staged = read_store_file(path);
  return install_into_store(path, staged, store);
}

std::vector<CheckpointTableInfo> read_checkpoint_info(const std::string& path) {
  std::vector<StagedTable> staged = read_checkpoint(path, [](const CheckpointTableInfo&) {}, false);
  std::vector<CheckpointTableInfo> infos;
  infos.reserve(staged.size());
  for (StagedTable& table : staged) infos.push_back(std::move(table.info));
  return infos;
}

std::string describe(const CheckpointSummary& summary) {
  char crc[16];
  std::snprintf(crc, sizeof(crc), "%08x", summary.crc);
  return std::to_string(summary.tables) + (summary.tables == 1 ? " table, " : " tables, ") +
         std::to_string(summary.rows) + " rows, " + std::to_string(summary.bytes) + " bytes, crc " + crc;
}

std::string remove_interrupted_saves(const std::string& path) {
  const RemovedFiles removed = remove_stale_temp_files(path);
  if (removed.count == 0) return {};
  return "removed " + std::to_string(removed.count) + " temporary file" + (removed.count == 1 ? "" : "s") + " (" +
         std::to_string(removed.bytes) + " bytes) of interrupted saves of " + path;
}

}  // namespace recdev::store
