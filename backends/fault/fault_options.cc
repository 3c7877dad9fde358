#include "backends/fault/fault_options.h"

#include <cstring>
#include <string>

#include <boost/json.hpp>

namespace qlink {
namespace {

namespace json = boost::json;

Status Refuse(const std::string& key, const std::string& why) {
  return InvalidArgument("fault backend: backend_options." + key + " " + why);
}

Status ReadInt(const json::value& v, const std::string& key, int64_t lo, int64_t hi, int64_t* out) {
  if (!v.is_int64() && !v.is_uint64()) return Refuse(key, "must be an integer");
  if (v.is_uint64() || v.get_int64() < lo || v.get_int64() > hi) {
    return Refuse(
        key, "= " + json::serialize(v) + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  *out = v.get_int64();
  return Status::Ok();
}

// [[src, dst], ...]
Status ReadPairs(const json::value& v, const std::string& key, std::set<std::pair<int, int>>* out) {
  if (!v.is_array()) return Refuse(key, "must be an array of [src, dst] pairs");
  for (const json::value& pair : v.get_array()) {
    if (!pair.is_array() || pair.get_array().size() != 2) return Refuse(key, "must be an array of [src, dst] pairs");
    int64_t src = 0, dst = 0;
    QLINK_RETURN_IF_ERROR(ReadInt(pair.get_array()[0], key, 0, 255, &src));
    QLINK_RETURN_IF_ERROR(ReadInt(pair.get_array()[1], key, 0, 255, &dst));
    out->emplace(static_cast<int>(src), static_cast<int>(dst));
  }
  return Status::Ok();
}

Status ReadLostDevice(const json::value& v, FaultOptions* out) {
  if (!v.is_object()) return Refuse("lose_device", "must be an object {device, after_copies}");
  int64_t device = -1, after = 0;
  for (const auto& [key, field] : v.get_object()) {
    if (key == "device") {
      QLINK_RETURN_IF_ERROR(ReadInt(field, "lose_device.device", 0, 255, &device));
    } else if (key == "after_copies") {
      QLINK_RETURN_IF_ERROR(ReadInt(field, "lose_device.after_copies", 0, INT64_MAX, &after));
    } else {
      return Refuse("lose_device." + std::string(key), "is unknown (known: device, after_copies)");
    }
  }
  if (device < 0) return Refuse("lose_device", "needs a device");
  out->lost_device = static_cast<int>(device);
  out->lost_after_copies = after;
  return Status::Ok();
}

Status CheckDevicesExist(const FaultOptions& o) {
  auto exists = [&](int d) { return d < o.devices; };
  auto check_pairs = [&](const std::set<std::pair<int, int>>& pairs, const char* key) {
    for (const auto& [src, dst] : pairs) {
      if (!exists(src) || !exists(dst)) {
        return Refuse(key, "names device pair " + std::to_string(src) + "->" + std::to_string(dst) + " beyond the " +
                               std::to_string(o.devices) + " device(s)");
      }
    }
    return Status::Ok();
  };
  QLINK_RETURN_IF_ERROR(check_pairs(o.unsupported_pairs, "unsupported_pairs"));
  QLINK_RETURN_IF_ERROR(check_pairs(o.enable_failing_pairs, "enable_failing_pairs"));
  if (o.stream_delay_ms.size() > static_cast<size_t>(o.devices)) {
    return Refuse("stream_delay_ms", "lists more delays than the " + std::to_string(o.devices) + " device(s)");
  }
  if (o.lost_device >= o.devices) return Refuse("lose_device.device", "does not exist");
  return Status::Ok();
}

}  // namespace

Status ParseFaultOptions(const char* text, FaultOptions* out) {
  *out = FaultOptions();
  boost::system::error_code ec;
  json::value root = json::parse(json::string_view(text, std::strlen(text)), ec);
  if (ec || !root.is_object()) return InvalidArgument("fault backend: backend_options must be a JSON object");
  for (const auto& [key_view, v] : root.get_object()) {
    const std::string key(key_view);
    int64_t n = 0;
    if (key == "devices") {
      QLINK_RETURN_IF_ERROR(ReadInt(v, key, 1, 64, &n));
      out->devices = static_cast<int>(n);
    } else if (key == "stream_delay_ms") {
      if (!v.is_array()) return Refuse(key, "must be an array of per-device delays");
      for (const json::value& delay : v.get_array()) {
        QLINK_RETURN_IF_ERROR(ReadInt(delay, key, 0, 10000, &n));
        out->stream_delay_ms.push_back(static_cast<int>(n));
      }
    } else if (key == "unsupported_pairs") {
      QLINK_RETURN_IF_ERROR(ReadPairs(v, key, &out->unsupported_pairs));
    } else if (key == "enable_failing_pairs") {
      QLINK_RETURN_IF_ERROR(ReadPairs(v, key, &out->enable_failing_pairs));
    } else if (key == "fail_leaf") {
      QLINK_RETURN_IF_ERROR(ReadInt(v, key, 0, INT64_MAX, &out->fail_leaf));
    } else if (key == "fail_allocation") {
      QLINK_RETURN_IF_ERROR(ReadInt(v, key, 0, INT64_MAX, &out->fail_allocation));
    } else if (key == "lose_device") {
      QLINK_RETURN_IF_ERROR(ReadLostDevice(v, out));
    } else {
      return Refuse(key,
                    "is unknown (known: devices, stream_delay_ms, unsupported_pairs, enable_failing_pairs, "
                    "fail_leaf, fail_allocation, lose_device)");
    }
  }
  return CheckDevicesExist(*out);
}

}  // namespace qlink
