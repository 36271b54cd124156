// The pieces of the checkpoint files' format that whole-store checkpoints (checkpoint.h) and
// incremental versions (checkpoint_versions.h) share: checksummed streams, the section header
// (a table's config, init rule, optimizer and step), its rows and its policy block. The byte layout
// is documented in checkpoint.h.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "checkpoint.h"
#include "file_io.h"

namespace recdev::store {

constexpr uint32_t kMaxNameLength = 4096;
// The section fields that appeared in format 5 (optimizer flags, rounding_seed).
constexpr uint32_t kRoundingFormatVersion = 5;
constexpr uint32_t kStochasticRoundingFlag = 1;
constexpr uint64_t kCrcBytes = 4;

// Checkpoint files (checkpoint.h) end with a CRC-32 (zlib's); versions with a CRC-32C, which the
// CPU computes (crc32c.h).
enum class Checksum { Crc32, Crc32c };
uint32_t update_checksum(Checksum checksum, uint32_t crc, const void* data, size_t size);

class ChecksummedWriter {
 public:
  ChecksummedWriter(const std::string& path, Checksum checksum) : file_(path), checksum_(checksum) {}

  template <class T>
  void put(const T& value) {
    put_bytes(&value, sizeof(T));
  }
  void put_bytes(const void* data, size_t size) {
    crc_ = update_checksum(checksum_, crc_, data, size);
    file_.write(data, size);
    bytes_ += size;
  }
  void finish() {
    file_.write(&crc_, sizeof(crc_));
    bytes_ += sizeof(crc_);
    file_.commit();
  }
  uint32_t crc() const { return crc_; }
  uint64_t bytes() const { return bytes_; }

 private:
  AtomicFileWriter file_;
  Checksum checksum_;
  uint32_t crc_ = 0;
  uint64_t bytes_ = 0;
};

class ChecksummedReader {
 public:
  ChecksummedReader(const std::string& path, Checksum checksum) : file_(path), checksum_(checksum) {}

  template <class T>
  T get() {
    T value;
    get_bytes(&value, sizeof(T));
    return value;
  }
  void get_bytes(void* out, size_t size) {
    file_.read(out, size);
    crc_ = update_checksum(checksum_, crc_, out, size);
  }
  // The checksum of everything read so far, and then the stored one, which it must equal.
  uint32_t crc() const { return crc_; }
  uint32_t stored_crc() {
    uint32_t stored;
    file_.read(&stored, sizeof(stored));
    return stored;
  }
  uint64_t remaining() const { return file_.remaining(); }
  uint64_t size() const { return file_.size(); }
  Checksum checksum() const { return checksum_; }

 private:
  FileReader file_;
  Checksum checksum_;
  uint32_t crc_ = 0;
};

struct StagedTable {
  CheckpointTableInfo info;
  RowSet rows;
};

[[noreturn]] void corrupt(const std::string& path, const std::string& problem);
// "table 'name'", or "table #index" for an anonymous one.
std::string label(const std::string& name, size_t index);

void write_section_header(ChecksummedWriter& out, const std::string& name, const TableScanHeader& header);
// A section's header: the table's name, config, init stream, optimizer with its step, and row
// count, each checked. `version` is the checkpoint format whose fields it has (5 for versions).
CheckpointTableInfo read_section_header(ChecksummedReader& in, const std::string& path, uint32_t version, size_t index);
// A section's rows (staged.info.row_count of them): each id checked to be in range and not repeated;
// staged into staged.rows if stage_rows.
void read_section_rows(ChecksummedReader& in, const std::string& path, const std::string& table, StagedTable& staged,
                       bool stage_rows);
// u64 policy_bytes, then encode_policy_state's bytes (none without a policy).
void write_policy_block(ChecksummedWriter& out, const std::optional<TablePolicyState>& policy);
// After the last section: nothing but the checksum may remain, and it must match (Corrupt otherwise).
void check_file_end(ChecksummedReader& in, const std::string& path);
// A section's policy block, decoded into staged.info.policy.
void read_policy_block(ChecksummedReader& in, const std::string& path, const std::string& table, StagedTable& staged);

// A store checkpoint file's named tables, verified and staged (what load_store installs), for a
// client that sends them elsewhere (a remote store's load).
std::vector<StagedTable> read_store_file(const std::string& path);

// Installs verified sections into the store's named tables of the same names, creating the missing
// ones; an existing table must have the section's shape (checked for all before any changes).
// Returns the names.
std::vector<std::string> install_into_store(const std::string& path, std::vector<StagedTable>& staged, Store& store);

}  // namespace recdev::store
