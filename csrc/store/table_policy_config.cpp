#include "table_policy_config.h"

#include <cmath>
#include <limits>
#include <string>

#include "errors.h"

namespace recdev::store {
namespace {

constexpr uint32_t kMaxAdmitAfter = std::numeric_limits<uint16_t>::max();
constexpr uint32_t kMinSketchWidth = 16;
constexpr uint32_t kMaxSketchWidth = 1u << 26;

std::string format_seconds(double seconds) {
  std::string text = std::to_string(seconds);
  while (text.size() > 1 && text.back() == '0') text.pop_back();
  if (!text.empty() && text.back() == '.') text.pop_back();
  return text;
}

}  // namespace

bool operator==(const TablePolicyConfig& lhs, const TablePolicyConfig& rhs) {
  return lhs.max_rows == rhs.max_rows && lhs.max_bytes == rhs.max_bytes && lhs.evict == rhs.evict &&
         lhs.half_life == rhs.half_life && lhs.ttl_steps == rhs.ttl_steps && lhs.ttl_seconds == rhs.ttl_seconds &&
         lhs.admit_after == rhs.admit_after && lhs.sketch_width == rhs.sketch_width && lhs.spill == rhs.spill &&
         lhs.max_disk_bytes == rhs.max_disk_bytes;
}

std::string evict_name(EvictKind kind) {
  switch (kind) {
    case EvictKind::None: return "none";
    case EvictKind::Lru: return "lru";
    case EvictKind::Lfu: return "lfu";
    case EvictKind::Ttl: return "ttl";
  }
  return "unknown";
}

std::string describe(const TablePolicyConfig& config) {
  std::string text = "TablePolicy(max_rows=" + std::to_string(config.max_rows) +
                     ", max_bytes=" + std::to_string(config.max_bytes) + ", evict=" + evict_name(config.evict);
  if (config.evict == EvictKind::Lfu) text += ", half_life=" + format_seconds(config.half_life);
  if (config.ttl_steps != 0) text += ", ttl=" + std::to_string(config.ttl_steps) + " steps";
  if (config.ttl_seconds != 0) text += ", ttl=" + format_seconds(config.ttl_seconds) + " s";
  text += ", admit_after=" + std::to_string(config.admit_after);
  if (config.spill) text += ", spill=True";
  if (config.max_disk_bytes != 0) text += ", max_disk_bytes=" + std::to_string(config.max_disk_bytes);
  return text + ")";
}

void validate_policy(const TablePolicyConfig& config) {
  const auto invalid = [&](const std::string& problem) {
    throw StoreError(ErrorCode::InvalidArgument, "invalid " + describe(config) + ": " + problem);
  };
  if (uint8_t(config.evict) > uint8_t(EvictKind::Ttl)) invalid("unknown evict policy; use lru, lfu, ttl or none");
  const bool has_ttl = config.ttl_steps != 0 || config.ttl_seconds != 0;
  if (config.evict == EvictKind::Ttl) {
    if (!has_ttl) invalid("evict='ttl' needs a ttl (steps, or seconds)");
    if (config.ttl_steps != 0 && config.ttl_seconds != 0) invalid("give the ttl in steps or in seconds, not both");
    if (!(config.ttl_seconds >= 0) || !std::isfinite(config.ttl_seconds)) invalid("ttl seconds must be finite and > 0");
  } else if (has_ttl) {
    invalid("a ttl needs evict='ttl'");
  }
  if ((config.evict == EvictKind::Lru || config.evict == EvictKind::Lfu) && config.max_rows == 0 &&
      config.max_bytes == 0) {
    invalid("evict='" + evict_name(config.evict) + "' needs a budget: max_rows or max_bytes");
  }
  if (config.evict == EvictKind::Lfu && !(config.half_life > 0 && std::isfinite(config.half_life))) {
    invalid("lfu's half_life (in steps) must be finite and > 0");
  }
  if (config.admit_after < 1 || config.admit_after > kMaxAdmitAfter) {
    invalid("admit_after must be in [1, " + std::to_string(kMaxAdmitAfter) + "]");
  }
  if (config.spill && config.evict == EvictKind::None) {
    invalid("spill=True keeps the rows a budget evicts on disk: give it evict='lru', 'lfu' or 'ttl' (and a budget)");
  }
  if (config.max_disk_bytes != 0 && !config.spill) invalid("max_disk_bytes bounds the disk tier: it needs spill=True");
  const uint32_t width = config.sketch_width;
  if (width != 0 && (width < kMinSketchWidth || width > kMaxSketchWidth || (width & (width - 1)) != 0)) {
    invalid("sketch_width must be 0 (sized from the budget) or a power of two in [" + std::to_string(kMinSketchWidth) +
            ", " + std::to_string(kMaxSketchWidth) + "]");
  }
}

}  // namespace recdev::store
