#include "checkpoint_format.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "crc32.h"
#include "crc32c.h"
#include "errors.h"

namespace recdev::store {
namespace {

// Rows are read in batches of about this many bytes.
constexpr size_t kReadBatchBytes = size_t{1} << 20;

}  // namespace

uint32_t update_checksum(Checksum checksum, uint32_t crc, const void* data, size_t size) {
  return checksum == Checksum::Crc32 ? crc32_update(crc, data, size) : crc32c_update(crc, data, size);
}

[[noreturn]] void corrupt(const std::string& path, const std::string& problem) {
  throw StoreError(ErrorCode::Corrupt, "checkpoint '" + path + "' " + problem);
}

std::string label(const std::string& name, size_t index) {
  return name.empty() ? "table #" + std::to_string(index) : "table '" + name + "'";
}

void write_section_header(ChecksummedWriter& out, const std::string& name, const TableScanHeader& header) {
  const TableConfig& config = header.config;
  const OptimizerConfig& optimizer = header.optimizer;
  out.put(uint32_t(name.size()));
  out.put_bytes(name.data(), name.size());
  out.put(config.num_rows);
  out.put(config.row_words);
  out.put(config.state_words);
  out.put(uint32_t(config.init.kind));
  out.put(uint32_t(config.dtype));
  out.put(config.init.a);
  out.put(config.init.b);
  out.put(config.init.seed);
  out.put(header.init_stream);
  out.put(uint32_t(optimizer.kind));
  out.put(optimizer.stochastic_rounding ? kStochasticRoundingFlag : uint32_t{0});
  out.put(optimizer.lr);
  out.put(optimizer.weight_decay);
  out.put(optimizer.eps);
  out.put(optimizer.lr_decay);
  out.put(optimizer.initial_accumulator_value);
  out.put(optimizer.beta1);
  out.put(optimizer.beta2);
  out.put(optimizer.rounding_seed);
  out.put(header.optimizer_step);
  out.put(header.row_count);
}

void write_policy_block(ChecksummedWriter& out, const std::optional<TablePolicyState>& policy) {
  const std::string block = policy ? encode_policy_state(*policy) : std::string();
  out.put(uint64_t(block.size()));
  out.put_bytes(block.data(), block.size());
}

CheckpointTableInfo read_section_header(ChecksummedReader& in, const std::string& path, uint32_t version,
                                        size_t index) {
  CheckpointTableInfo info;
  const uint32_t name_length = in.get<uint32_t>();
  if (name_length > kMaxNameLength || name_length > in.remaining()) {
    corrupt(path, "has a table name length of " + std::to_string(name_length) + " bytes");
  }
  info.name.resize(name_length);
  in.get_bytes(info.name.data(), name_length);
  const std::string table = label(info.name, index);
  info.config.num_rows = in.get<uint64_t>();
  info.config.row_words = in.get<uint32_t>();
  info.config.state_words = in.get<uint32_t>();
  info.config.init.kind = InitKind(in.get<uint32_t>());
  const uint32_t dtype = in.get<uint32_t>();
  if (dtype > kLastElementType) corrupt(path, "has an unknown element type " + std::to_string(dtype) + " in " + table);
  info.config.dtype = ElementType(dtype);
  info.config.init.a = in.get<double>();
  info.config.init.b = in.get<double>();
  info.config.init.seed = in.get<uint64_t>();
  info.init_stream = in.get<uint64_t>();
  info.optimizer.kind = OptimizerKind(in.get<uint32_t>());
  const uint32_t flags = in.get<uint32_t>();
  const uint32_t known_flags = version >= kRoundingFormatVersion ? kStochasticRoundingFlag : 0;
  if ((flags & ~known_flags) != 0) {
    corrupt(path, "has unknown optimizer flags " + std::to_string(flags) + " in " + table);
  }
  info.optimizer.stochastic_rounding = (flags & kStochasticRoundingFlag) != 0;
  info.optimizer.lr = in.get<double>();
  info.optimizer.weight_decay = in.get<double>();
  info.optimizer.eps = in.get<double>();
  info.optimizer.lr_decay = in.get<double>();
  info.optimizer.initial_accumulator_value = in.get<double>();
  info.optimizer.beta1 = in.get<double>();
  info.optimizer.beta2 = in.get<double>();
  if (version >= kRoundingFormatVersion) info.optimizer.rounding_seed = in.get<uint64_t>();
  info.optimizer_step = in.get<uint64_t>();
  info.row_count = in.get<uint64_t>();
  try {
    validate_table_config(info.config);
  } catch (const StoreError& error) {
    corrupt(path, "has an invalid config in " + table + ": " + error.what());
  }
  try {
    validate_optimizer(info.optimizer);
  } catch (const StoreError& error) {
    corrupt(path, "has an invalid optimizer in " + table + ": " + error.what());
  }
  if (info.optimizer.stochastic_rounding && info.config.dtype != ElementType::Float16 &&
      info.config.dtype != ElementType::BFloat16) {
    corrupt(path, "has stochastic rounding on the " + std::string(element_type_name(info.config.dtype)) + " rows of " +
                      table + "; only float16 and bfloat16 rows are rounded");
  }
  if (info.optimizer.kind != OptimizerKind::None &&
      info.config.state_words != optimizer_state_words(info.optimizer.kind, info.config.dtype, info.config.row_words)) {
    corrupt(path,
            "has " + std::to_string(info.config.state_words) + " state words per row in " + table +
                ", but its optimizer " + describe(info.optimizer) + " keeps " +
                std::to_string(optimizer_state_words(info.optimizer.kind, info.config.dtype, info.config.row_words)));
  }
  return info;
}

void read_section_rows(ChecksummedReader& in, const std::string& path, const std::string& table, StagedTable& staged,
                       bool stage_rows) {
  const uint32_t record_words = staged.info.config.row_words + staged.info.config.state_words;
  const uint64_t row_bytes = sizeof(uint64_t) + uint64_t{record_words} * sizeof(float);
  if (in.remaining() < kCrcBytes || staged.info.row_count > (in.remaining() - kCrcBytes) / row_bytes) {
    corrupt(path, "is truncated: " + table + " has " + std::to_string(staged.info.row_count) + " rows of " +
                      std::to_string(row_bytes) + " bytes but only " + std::to_string(in.remaining()) +
                      " bytes remain");
  }
  const size_t batch_rows = std::max<size_t>(1, kReadBatchBytes / row_bytes);
  std::vector<std::byte> batch(std::min<uint64_t>(batch_rows, staged.info.row_count) * row_bytes);
  for (uint64_t done = 0; done < staged.info.row_count;) {
    const size_t count = size_t(std::min<uint64_t>(batch_rows, staged.info.row_count - done));
    in.get_bytes(batch.data(), count * row_bytes);
    for (size_t i = 0; i < count; ++i) {
      const std::byte* row = batch.data() + i * row_bytes;
      uint64_t row_id;
      std::memcpy(&row_id, row, sizeof(row_id));
      if (row_id >= staged.info.config.num_rows) {
        corrupt(path, "has row id " + std::to_string(row_id) + " in " + table + ", outside [0, " +
                          std::to_string(staged.info.config.num_rows) + ")");
      }
      if (stage_rows && !staged.rows.insert(row_id, reinterpret_cast<const float*>(row + sizeof(row_id)))) {
        corrupt(path, "holds row " + std::to_string(row_id) + " of " + table + " twice");
      }
    }
    done += count;
  }
}

void read_policy_block(ChecksummedReader& in, const std::string& path, const std::string& table, StagedTable& staged) {
  if (in.remaining() < sizeof(uint64_t) + kCrcBytes) corrupt(path, "is truncated in the policy block of " + table);
  const uint64_t policy_bytes = in.get<uint64_t>();
  if (policy_bytes > in.remaining() - kCrcBytes) {
    corrupt(path, "is truncated: the policy block of " + table + " has " + std::to_string(policy_bytes) +
                      " bytes but only " + std::to_string(in.remaining()) + " bytes remain");
  }
  if (policy_bytes != 0) {
    std::string block(policy_bytes, '\0');
    in.get_bytes(block.data(), block.size());
    try {
      staged.info.policy =
          decode_policy_state(block.data(), block.size(), staged.info.config.num_rows, staged.info.row_count);
    } catch (const StoreError& error) {
      corrupt(path, "has a bad policy block in " + table + ": " + error.what());
    }
  }
}

void check_file_end(ChecksummedReader& in, const std::string& path) {
  if (in.remaining() != kCrcBytes) {
    corrupt(path, "has " + std::to_string(in.remaining() - std::min(in.remaining(), kCrcBytes)) +
                      " unexpected bytes after its last table");
  }
  const uint32_t computed = in.crc();
  const uint32_t stored = in.stored_crc();
  if (computed != stored) {
    char detail[80];
    std::snprintf(detail, sizeof(detail), "(%s, stored %08x, computed %08x)",
                  in.checksum() == Checksum::Crc32 ? "CRC-32" : "CRC-32C", stored, computed);
    corrupt(path, std::string("fails its checksum ") + detail + ": the file is damaged");
  }
}

}  // namespace recdev::store
