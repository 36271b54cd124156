#include "checkpoint_versions.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <unordered_set>

#include "background_priority.h"
#include "errors.h"
#include "file_io.h"

namespace recdev::store {
namespace {

constexpr char kMagic[8] = {'R', 'E', 'C', 'D', 'E', 'V', 'V', 'R'};
constexpr uint32_t kVersionFormat = 1;
constexpr uint32_t kBaseKind = 0;
constexpr uint32_t kDeltaKind = 1;
constexpr uint32_t kWholeSection = 1;
// The section fields of checkpoint format 5.
constexpr uint32_t kSectionFormat = 5;
// magic, format, version, chain, kind, written, table_count
constexpr uint64_t kHeaderBytes = sizeof(kMagic) + 4 + 8 + 8 + 4 + 8 + 4;
constexpr char kSuffix[] = ".recdev";

std::string file_name(uint64_t version, bool base) {
  char name[64];
  std::snprintf(name, sizeof(name), "v%08llu-%s%s", static_cast<unsigned long long>(version), base ? "base" : "delta",
                kSuffix);
  return name;
}

// "v00000012-delta.recdev" -> (12, false); anything else (temporary files included) -> nullopt.
std::optional<std::pair<uint64_t, bool>> parse_name(const std::string& name) {
  if (name.size() < 2 || name[0] != 'v') return std::nullopt;
  const size_t dash = name.find('-');
  if (dash == std::string::npos || dash < 2 || dash > 21) return std::nullopt;
  const std::string digits = name.substr(1, dash - 1);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  const std::string rest = name.substr(dash + 1);
  bool base;
  if (rest == std::string("base") + kSuffix) {
    base = true;
  } else if (rest == std::string("delta") + kSuffix) {
    base = false;
  } else {
    return std::nullopt;
  }
  return std::make_pair(uint64_t(std::stoull(digits)), base);
}

int64_t unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct FileHeader {
  uint64_t version;
  uint64_t chain;
  uint32_t kind;
  int64_t written_unix_ms;
  uint32_t table_count;
};

FileHeader read_header(ChecksummedReader& in, const std::string& path) {
  if (in.size() < kHeaderBytes + kCrcBytes)
    corrupt(path, "is too small to be a recdev version (" + std::to_string(in.size()) + " bytes)");
  char magic[sizeof(kMagic)];
  in.get_bytes(magic, sizeof(magic));
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) corrupt(path, "is not a recdev version (bad magic)");
  const uint32_t format = in.get<uint32_t>();
  if (format != kVersionFormat) {
    corrupt(path, "has version format " + std::to_string(format) + "; this build reads format " +
                      std::to_string(kVersionFormat));
  }
  FileHeader header;
  header.version = in.get<uint64_t>();
  header.chain = in.get<uint64_t>();
  header.kind = in.get<uint32_t>();
  header.written_unix_ms = in.get<int64_t>();
  header.table_count = in.get<uint32_t>();
  if (header.kind != kBaseKind && header.kind != kDeltaKind)
    corrupt(path, "has an unknown kind " + std::to_string(header.kind));
  return header;
}

struct Section {
  StagedTable table;
  bool whole = false;
  std::vector<uint64_t> erased;
};

struct VersionContents {
  FileHeader header;
  std::vector<Section> sections;
};

// Reads and verifies a whole version file; its name must match what its header says.
VersionContents read_version_file(const VersionFile& file) {
  ChecksummedReader in(file.path, Checksum::Crc32c);
  VersionContents contents{read_header(in, file.path), {}};
  const FileHeader& header = contents.header;
  if (header.version != file.version || (header.kind == kBaseKind) != file.base) {
    corrupt(file.path, "holds version " + std::to_string(header.version) +
                           (header.kind == kBaseKind ? " (base)" : " (delta)") + ", not what its name says");
  }
  std::set<std::string> names;
  for (size_t index = 0; index < header.table_count; ++index) {
    if (in.remaining() <= kCrcBytes) corrupt(file.path, "is truncated before table #" + std::to_string(index));
    CheckpointTableInfo info = read_section_header(in, file.path, kSectionFormat, index);
    const std::string table = label(info.name, index);
    if (info.name.empty()) corrupt(file.path, "holds an anonymous table");
    if (!names.insert(info.name).second) corrupt(file.path, "holds " + table + " twice");
    Section section{StagedTable{std::move(info), RowSet(0)}, false, {}};
    const CheckpointTableInfo& read = section.table.info;
    section.table.rows = RowSet(read.config.row_words + read.config.state_words);
    const uint32_t flags = in.get<uint32_t>();
    if ((flags & ~kWholeSection) != 0)
      corrupt(file.path, "has unknown section flags " + std::to_string(flags) + " in " + table);
    section.whole = (flags & kWholeSection) != 0;
    if (header.kind == kBaseKind && !section.whole) corrupt(file.path, "is a base with a partial section for " + table);
    const uint64_t erased = in.get<uint64_t>();
    if (erased > in.remaining() / sizeof(uint64_t))
      corrupt(file.path, "claims " + std::to_string(erased) + " erased rows in " + table + ", more than it holds");
    section.erased.resize(erased);
    if (erased != 0) in.get_bytes(section.erased.data(), erased * sizeof(uint64_t));
    for (const uint64_t id : section.erased) {
      if (id >= read.config.num_rows)
        corrupt(file.path, "erases row " + std::to_string(id) + " of " + table + ", outside the table");
    }
    read_section_rows(in, file.path, table, section.table, true);
    read_policy_block(in, file.path, table, section.table);
    contents.sections.push_back(std::move(section));
  }
  check_file_end(in, file.path);
  return contents;
}

// A table as a replay has it so far: rows, header and policy, and its touch metadata in eviction
// order.
struct Image {
  StagedTable table;
  std::vector<RowTouch> touches;
};

// One section onto the table's image from the version before (none for a whole section).
Image apply_section(Section& section, Image* before, const std::string& path) {
  if (section.whole || before == nullptr) {
    if (!section.whole)
      corrupt(path, "holds a partial section for " + label(section.table.info.name, 0) +
                        ", which the version before does not have");
    Image image{std::move(section.table), {}};
    if (image.table.info.policy) image.touches = std::move(image.table.info.policy->touches);
    return image;
  }
  Image image = std::move(*before);
  const CheckpointTableInfo& info = section.table.info;
  const TableConfig& had = image.table.info.config;
  if (info.config.num_rows != had.num_rows || info.config.row_words != had.row_words ||
      info.config.dtype != had.dtype || info.config.state_words != had.state_words) {
    corrupt(path,
            "holds a partial section for " + label(info.name, 0) + " whose layout differs from the version before");
  }
  std::unordered_set<uint64_t> changed(section.erased.begin(), section.erased.end());
  for (const uint64_t id : section.erased) image.table.rows.erase(id);
  section.table.rows.for_each([&](uint64_t id, const float* record) {
    image.table.rows.put(id, record);
    changed.insert(id);
  });
  std::optional<TablePolicyState> policy = std::move(section.table.info.policy);
  if (policy) {
    // Rows touched since the version before are newer than every row that was not (a touch takes the
    // next tick), so they follow the others, in their own order.
    std::erase_if(image.touches, [&](const RowTouch& row) { return changed.count(row.id) != 0; });
    image.touches.insert(image.touches.end(), policy->touches.begin(), policy->touches.end());
  } else {
    image.touches.clear();
  }
  image.table.info = info;
  image.table.info.policy = std::move(policy);
  return image;
}

std::vector<VersionFile> chain_for(const std::vector<VersionFile>& files, uint64_t version) {
  // The newest base at or below the version whose chain has every delta up to it.
  for (auto base = files.rbegin(); base != files.rend(); ++base) {
    if (!base->base || base->version > version) continue;
    std::vector<VersionFile> chain{*base};
    for (uint64_t next = base->version + 1; next <= version; ++next) {
      const auto delta = std::find_if(files.begin(), files.end(), [&](const VersionFile& file) {
        return file.version == next && !file.base && file.chain == base->chain;
      });
      if (delta == files.end()) break;
      chain.push_back(*delta);
    }
    if (chain.back().version == version) return chain;
  }
  return {};
}

std::string describe_versions(const std::vector<uint64_t>& versions) {
  if (versions.empty()) return "no complete version";
  std::string text = "versions ";
  for (size_t i = 0; i < versions.size(); ++i) {
    size_t j = i;
    while (j + 1 < versions.size() && versions[j + 1] == versions[j] + 1) ++j;
    if (text.size() > 9) text += ", ";
    text += std::to_string(versions[i]) + (j > i ? "-" + std::to_string(versions[j]) : "");
    i = j;
  }
  return text;
}

CheckpointSummary write_version_file(const std::string& path, uint64_t version, uint64_t chain, bool base,
                                     const std::vector<NamedCut>& cuts) {
  ChecksummedWriter out(path, Checksum::Crc32c);
  out.put_bytes(kMagic, sizeof(kMagic));
  out.put(kVersionFormat);
  out.put(version);
  out.put(chain);
  out.put(base ? kBaseKind : kDeltaKind);
  out.put(unix_ms_now());
  out.put(uint32_t(cuts.size()));
  for (const NamedCut& named : cuts) {
    const TableCut& cut = named.cut;
    write_section_header(out, named.name, cut.header);
    out.put(cut.whole ? kWholeSection : uint32_t{0});
    out.put(uint64_t(cut.erased.size()));
    out.put_bytes(cut.erased.data(), cut.erased.size() * sizeof(uint64_t));
    const size_t record_words = size_t{cut.header.config.row_words} + cut.header.config.state_words;
    for (size_t row = 0; row < cut.ids.size(); ++row) {
      out.put(cut.ids[row]);
      out.put_bytes(cut.records.data() + row * record_words, record_words * sizeof(float));
    }
    write_policy_block(out, cut.policy);
  }
  out.finish();
  CheckpointSummary summary;
  summary.tables = cuts.size();
  for (const NamedCut& named : cuts) summary.rows += named.cut.ids.size();
  summary.bytes = out.bytes();
  summary.crc = out.crc();
  return summary;
}

// A version's image (every table) from its chain of files.
std::vector<StagedTable> replay(const std::vector<VersionFile>& chain) {
  std::map<std::string, Image> images;
  std::vector<std::string> order;
  for (const VersionFile& file : chain) {
    VersionContents contents = read_version_file(file);
    if (contents.header.chain != chain.front().chain)
      corrupt(file.path, "belongs to another chain of versions than its base");
    std::map<std::string, Image> next;
    order.clear();
    for (Section& section : contents.sections) {
      const std::string name = section.table.info.name;
      const auto before = images.find(name);
      next.emplace(name, apply_section(section, before == images.end() ? nullptr : &before->second, file.path));
      order.push_back(name);
    }
    images = std::move(next);
  }
  std::vector<StagedTable> tables;
  for (const std::string& name : order) {
    Image& image = images.at(name);
    image.table.info.row_count = image.table.rows.size();
    if (image.table.info.policy) image.table.info.policy->touches = std::move(image.touches);
    tables.push_back(std::move(image.table));
  }
  return tables;
}

uint64_t random_chain() {
  std::random_device device;
  uint64_t chain = 0;
  while (chain == 0) chain = (uint64_t{device()} << 32) | device();
  return chain;
}

void make_directory(const std::string& directory) {
  if (::mkdir(directory.c_str(), 0755) != 0 && errno != EEXIST) {
    throw StoreError(ErrorCode::Io,
                     "cannot create the checkpoint directory '" + directory + "': " + std::strerror(errno));
  }
  struct stat status;
  if (::stat(directory.c_str(), &status) != 0 || !S_ISDIR(status.st_mode)) {
    throw StoreError(ErrorCode::InvalidArgument,
                     "'" + directory + "' is not a directory; give ops.checkpoint a directory for its versions");
  }
}

}  // namespace

std::vector<VersionFile> list_version_files(const std::string& directory) {
  DIR* listing = ::opendir(directory.c_str());
  if (listing == nullptr) {
    throw StoreError(errno == ENOENT ? ErrorCode::NotFound : ErrorCode::Io,
                     "cannot list the checkpoint directory '" + directory + "': " + std::strerror(errno));
  }
  std::vector<VersionFile> files;
  while (const dirent* entry = ::readdir(listing)) {
    const auto parsed = parse_name(entry->d_name);
    if (!parsed) continue;
    VersionFile file{directory + "/" + entry->d_name, parsed->first, parsed->second, 0, 0, 0};
    try {
      ChecksummedReader in(file.path, Checksum::Crc32c);
      const FileHeader header = read_header(in, file.path);
      if (header.version != file.version) continue;
      file.chain = header.chain;
      file.written_unix_ms = header.written_unix_ms;
      file.bytes = in.size();
    } catch (const StoreError&) {
      continue;  // unreadable or removed meanwhile: not a version a restore can use
    }
    files.push_back(file);
  }
  ::closedir(listing);
  std::sort(files.begin(), files.end(), [](const VersionFile& a, const VersionFile& b) {
    return a.version != b.version ? a.version < b.version : a.base > b.base;
  });
  return files;
}

uint64_t newest_version(const std::string& directory) {
  const std::vector<uint64_t> versions = restorable_versions(directory);
  if (versions.empty())
    throw StoreError(ErrorCode::NotFound, "'" + directory + "' holds no complete version to restore");
  return versions.back();
}

std::vector<uint64_t> restorable_versions(const std::string& directory) {
  const std::vector<VersionFile> files = list_version_files(directory);
  std::vector<uint64_t> versions;
  for (const VersionFile& file : files) {
    if ((versions.empty() || versions.back() != file.version) && !chain_for(files, file.version).empty()) {
      versions.push_back(file.version);
    }
  }
  return versions;
}

namespace {

std::vector<StagedTable> read_version_once(const std::string& directory, uint64_t version) {
  const std::vector<VersionFile> files = list_version_files(directory);
  const std::vector<VersionFile> chain = chain_for(files, version);
  if (chain.empty()) {
    std::vector<uint64_t> versions;
    for (const VersionFile& file : files) {
      if (!chain_for(files, file.version).empty() && (versions.empty() || versions.back() != file.version))
        versions.push_back(file.version);
    }
    throw StoreError(ErrorCode::NotFound, "no version " + std::to_string(version) + " in '" + directory + "': it has " +
                                              describe_versions(versions) + " (ops.versions lists them)");
  }
  return replay(chain);
}

}  // namespace

std::vector<StagedTable> read_version(const std::string& directory, uint64_t version) {
  // A compaction (of this process or another) removes files once their new base is complete: a file
  // that vanished while it was read means a fresh listing has that base.
  for (int attempt = 0;; ++attempt) {
    try {
      return read_version_once(directory, version);
    } catch (const StoreError& error) {
      if (error.code() != ErrorCode::Io || attempt == 2) throw;
    }
  }
}

std::pair<uint64_t, std::vector<std::string>> restore_version(const std::string& directory,
                                                              std::optional<uint64_t> version, Store& store) {
  if (!version) version = newest_version(directory);
  std::vector<StagedTable> tables = read_version(directory, *version);
  return {*version, install_into_store(directory, tables, store)};
}

VersionWriter::VersionWriter(std::string directory) : directory_(std::move(directory)) {}

VersionWriter::~VersionWriter() {
  if (compaction_.joinable()) compaction_.join();
}

void VersionWriter::wait_compaction() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (compaction_.joinable()) compaction_.join();
  if (compaction_error_) std::rethrow_exception(std::exchange(compaction_error_, nullptr));
}

std::string describe(const WrittenVersion& written) {
  return "version " + std::to_string(written.version) + (written.base ? ", base, " : ", delta, ") +
         describe(written.summary);
}

WrittenVersion VersionWriter::write_base_alone(const std::function<std::vector<NamedCut>()>& cut) {
  std::lock_guard<std::mutex> lock(mutex_);
  make_directory(directory_);
  remove_temp_files_in(directory_, TempFiles::OfDeadWriters);
  const std::vector<VersionFile> files = list_version_files(directory_);
  const uint64_t version = (files.empty() ? 0 : files.back().version) + 1;
  chain_ = 0;  // the next checkpoint is a base again
  const std::vector<NamedCut> cuts = cut();
  WrittenVersion written{version, true, directory_ + "/" + file_name(version, true), {}};
  run_at_background_priority(
      [&] { written.summary = write_version_file(written.path, version, random_chain(), true, cuts); });
  return written;
}

WrittenVersion VersionWriter::write(const VersionSource& source) {
  std::lock_guard<std::mutex> lock(mutex_);
  make_directory(directory_);
  remove_temp_files_in(directory_, TempFiles::OfDeadWriters);
  const std::vector<VersionFile> files = list_version_files(directory_);
  const uint64_t newest = files.empty() ? 0 : files.back().version;
  const bool delta = chain_ != 0 && last_version_ == newest && files.back().chain == chain_;
  if (!delta) chain_ = random_chain();
  const uint64_t version = newest + 1;
  const std::vector<NamedCut> cuts = source.cut(chain_);
  WrittenVersion written{version, !delta, directory_ + "/" + file_name(version, !delta), {}};
  try {
    for (const NamedCut& named : cuts) {
      if (!delta && !named.cut.whole)
        corrupt(directory_, "got a partial cut of table '" + named.name + "' for a new base");
    }
    run_at_background_priority(
        [&] { written.summary = write_version_file(written.path, version, chain_, !delta, cuts); });
  } catch (...) {
    source.forget(chain_);
    chain_ = 0;
    throw;
  }
  last_version_ = version;
  compact_if_due(version);
  return written;
}

void VersionWriter::compact_if_due(uint64_t version) {
  // One at a time, and a checkpoint never waits for one: while a compaction runs, the next
  // checkpoint after it finishes considers the chain again. An error is kept for wait_compaction.
  if (compacting_) return;
  if (compaction_.joinable()) compaction_.join();
  // Listed now, not when this version's write began: a compaction that finished during the write
  // has removed the files it folded, and a chain of those would fail to open them.
  const std::vector<VersionFile> chain = chain_for(list_version_files(directory_), version);
  if (chain.size() < 2) return;
  uint64_t delta_bytes = 0;
  for (size_t i = 1; i < chain.size(); ++i) delta_bytes += chain[i].bytes;
  if (double(delta_bytes) <= kCompactRatio * double(chain.front().bytes)) return;
  compacting_ = true;
  compaction_ = std::thread([this, chain, version] {
    lower_to_background_priority();
    try {
      std::vector<StagedTable> tables = replay(chain);
      std::vector<NamedCut> cuts;
      for (StagedTable& table : tables) {
        NamedCut named{table.info.name, TableCut{}};
        TableCut& cut = named.cut;
        const CheckpointTableInfo& info = table.info;
        cut.header =
            TableScanHeader{info.config, info.init_stream, info.optimizer, info.optimizer_step, info.row_count};
        cut.whole = true;
        const size_t record_words = table.rows.record_words();
        cut.ids.reserve(info.row_count);
        cut.records.reserve(info.row_count * record_words);
        table.rows.for_each([&](uint64_t id, const float* record) {
          cut.ids.push_back(id);
          cut.records.insert(cut.records.end(), record, record + record_words);
        });
        cut.policy = info.policy;
        cuts.push_back(std::move(named));
      }
      write_version_file(directory_ + "/" + file_name(version, true), version, chain.front().chain, true, cuts);
      // The new base stands for every version up to it: the older files go, oldest first, so that
      // a crash midway leaves versions that still restore.
      for (const VersionFile& file : chain) ::unlink(file.path.c_str());
      for (const VersionFile& file : list_version_files(directory_)) {
        if (file.version < chain.front().version) ::unlink(file.path.c_str());
      }
    } catch (...) {
      compaction_error_ = std::current_exception();
    }
    compacting_ = false;
  });
}

TableCut whole_cut(TableSnapshot& snapshot) {
  TableCut cut;
  cut.header = snapshot.header;
  cut.whole = true;
  const size_t record_words = snapshot.rows.record_words();
  cut.ids.reserve(snapshot.header.row_count);
  cut.records.reserve(snapshot.header.row_count * record_words);
  snapshot.rows.for_each([&](uint64_t id, const float* record) {
    cut.ids.push_back(id);
    cut.records.insert(cut.records.end(), record, record + record_words);
  });
  cut.header.row_count = cut.ids.size();
  return cut;
}

TableCut exported(TableCut whole, std::optional<ElementType> dtype, const std::string& name) {
  TableConfig& config = whole.header.config;
  const uint32_t record_words = config.row_words + config.state_words;
  const bool narrow = dtype && *dtype != config.dtype;
  if (narrow &&
      (config.dtype != ElementType::Float32 || (*dtype != ElementType::Float16 && *dtype != ElementType::BFloat16))) {
    throw StoreError(ErrorCode::InvalidArgument,
                     "cannot export table '" + name + "' of " + describe(config.dtype) + " rows as " +
                         describe(*dtype) +
                         ": an export narrows float32 rows to float16 or bfloat16, or keeps a table's type");
  }
  const uint32_t elements = config.row_words;  // float32: one element per word
  const uint32_t row_words = narrow ? (elements * 2 + 3) / 4 : config.row_words;
  std::vector<float> records(whole.ids.size() * size_t{row_words}, 0.0f);
  for (size_t row = 0; row < whole.ids.size(); ++row) {
    const float* from = whole.records.data() + row * record_words;
    float* to = records.data() + row * row_words;
    if (narrow) {
      narrow_from_float(*dtype, from, to, elements);
    } else {
      std::copy(from, from + row_words, to);
    }
  }
  whole.records = std::move(records);
  config.row_words = row_words;
  config.state_words = 0;
  if (narrow) config.dtype = *dtype;
  whole.header.optimizer = OptimizerConfig{};
  whole.header.optimizer_step = 0;
  whole.policy.reset();
  whole.erased.clear();
  return whole;
}

WrittenVersion export_store_version(const std::string& directory, const Store& store,
                                    std::optional<ElementType> dtype) {
  return version_writer_for(directory).write_base_alone([&] {
    std::vector<NamedCut> cuts;
    for (const auto& [name, table] : store.named_tables()) {
      TableSnapshot snapshot = table->snapshot();
      cuts.push_back(NamedCut{name, exported(whole_cut(snapshot), dtype, name)});
    }
    return cuts;
  });
}

VersionWriter& version_writer_for(const std::string& directory) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<VersionWriter>> writers;
  char resolved[PATH_MAX];
  make_directory(directory);
  const std::string key = ::realpath(directory.c_str(), resolved) != nullptr ? resolved : directory;
  std::lock_guard<std::mutex> lock(mutex);
  auto& writer = writers[key];
  if (!writer) writer = std::make_unique<VersionWriter>(key);
  return *writer;
}

WrittenVersion checkpoint_store_version(const std::string& directory, const Store& store) {
  const auto named = store.named_tables();
  VersionSource source;
  source.cut = [&](uint64_t chain) {
    std::vector<NamedCut> cuts;
    cuts.reserve(named.size());
    for (const auto& [name, table] : named) cuts.push_back(NamedCut{name, table->cut_changes(chain)});
    return cuts;
  };
  source.forget = [&](uint64_t chain) {
    for (const auto& [name, table] : named) table->forget_change_chain(chain);
  };
  return version_writer_for(directory).write(source);
}

}  // namespace recdev::store
