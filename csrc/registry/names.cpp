// The names of the registry's kinds and sync modes, as reports and the CLI write them.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <string_view>

#include "registry/registry.h"

namespace brick::registry {

const char* kind_name(Kind kind) noexcept {
  switch (kind) {
    case Kind::Op:
      return "op";
    case Kind::Range:
      return "range";
    case Kind::Host:
      return "host";
  }
  return "unknown";
}

const char* sync_mode_name(SyncMode mode) noexcept {
  switch (mode) {
    case SyncMode::Immediate:
      return "immediate";
    case SyncMode::Deferred:
      return "deferred";
    case SyncMode::Event:
      return "event";
  }
  return "unknown";
}

SyncMode parse_sync_mode(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) {
    return static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  });
  for (SyncMode mode : {SyncMode::Immediate, SyncMode::Deferred, SyncMode::Event}) {
    if (lower == sync_mode_name(mode)) return mode;
  }
  throw std::invalid_argument("brick registry: invalid sync mode '" + std::string(text) +
                              "' (valid: immediate, deferred, event)");
}

}  // namespace brick::registry
