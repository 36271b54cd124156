#include "serving.h"

#include <chrono>
#include <cstdio>
#include <utility>
#include <vector>

#include "store/checkpoint_versions.h"
#include "store/errors.h"

namespace recdev::net {

VersionFollower::VersionFollower(std::string directory, ShardService& service,
                                 std::function<void(const std::string&)> log)
    : directory_(std::move(directory)), service_(service), log_(std::move(log)) {}

bool VersionFollower::check() {
  std::vector<store::VersionFile> files;
  try {
    files = store::list_version_files(directory_);
    last_listing_error_.clear();
  } catch (const store::StoreError& error) {
    if (last_listing_error_ != error.what()) log_(std::string("cannot follow versions: ") + error.what());
    last_listing_error_ = error.what();
    return false;
  }
  const std::vector<uint64_t> versions = store::restorable_versions(directory_);
  if (versions.empty() || versions.back() <= served_ || versions.back() == refused_) return false;
  const uint64_t version = versions.back();
  int64_t written_unix_ms = 0;
  for (const store::VersionFile& file : files) {
    if (file.version == version) written_unix_ms = file.written_unix_ms;
  }
  const auto started = std::chrono::steady_clock::now();
  try {
    std::vector<store::StagedTable> tables = store::read_version(directory_, version);
    service_.serve_version(tables, version, written_unix_ms);
  } catch (const std::exception& error) {
    refused_ = version;
    log_("version " + std::to_string(version) + " of " + directory_ + " refused: " + error.what() +
         (served_ != 0 ? "; still serving version " + std::to_string(served_) : "; serving none yet"));
    return false;
  }
  served_ = version;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  char took[32];
  std::snprintf(took, sizeof(took), "%.3f", seconds);
  log_("serving version " + std::to_string(version) + " of " + directory_ + " (loaded in " + took + " s)");
  return true;
}

}  // namespace recdev::net
