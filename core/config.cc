#include "core/config.h"

#include <cmath>
#include <cstring>
#include <string>

#include <boost/json.hpp>

namespace qlink {
namespace {

namespace json = boost::json;

std::string KindName(json::kind k) { return std::string(json::to_string(k)); }

Status WrongType(const std::string& field, const char* want, const json::value& v) {
  return InvalidArgument("config field '" + field + "' must be " + want + ", got " + KindName(v.kind()));
}

Status ReadString(const json::value& v, const std::string& field, std::string* out) {
  if (!v.is_string()) return WrongType(field, "a string", v);
  *out = std::string(v.get_string());
  return Status::Ok();
}

Status ReadBool(const json::value& v, const std::string& field, bool* out) {
  if (!v.is_bool()) return WrongType(field, "a boolean", v);
  *out = v.get_bool();
  return Status::Ok();
}

Status ReadInt(const json::value& v, const std::string& field, int lo, int hi, int* out) {
  if (!v.is_int64() && !v.is_uint64()) return WrongType(field, "an integer", v);
  bool in_range =
      v.is_int64() ? (v.get_int64() >= lo && v.get_int64() <= hi) : v.get_uint64() <= static_cast<uint64_t>(hi);
  if (!in_range) {
    return InvalidArgument("config field '" + field + "' = " + json::serialize(v) + " is out of range [" +
                           std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  *out = static_cast<int>(v.to_number<int64_t>());
  return Status::Ok();
}

Status ReadDouble(const json::value& v, const std::string& field, double lo, double hi, double* out) {
  if (!v.is_number()) return WrongType(field, "a number", v);
  double d = v.to_number<double>();
  if (!std::isfinite(d) || d < lo || d > hi) {
    return InvalidArgument("config field '" + field + "' = " + json::serialize(v) + " is out of range [" +
                           std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  *out = d;
  return Status::Ok();
}

Status ReadChoice(const json::value& v, const std::string& field, std::initializer_list<const char*> choices,
                  std::string* out) {
  QLINK_RETURN_IF_ERROR(ReadString(v, field, out));
  std::string all;
  for (const char* c : choices) {
    if (*out == c) return Status::Ok();
    all += all.empty() ? c : std::string(", ") + c;
  }
  return InvalidArgument("config field '" + field + "' = \"" + *out + "\" is not one of: " + all);
}

Status ParseP2P(const json::object& obj, P2PConfig* p2p) {
  for (const auto& [key, v] : obj) {
    std::string field = "p2p." + std::string(key);
    if (key == "mode") {
      std::string mode;
      QLINK_RETURN_IF_ERROR(ReadChoice(v, field, {"auto", "on", "off"}, &mode));
      p2p->mode = mode == "on" ? P2PMode::kOn : mode == "off" ? P2PMode::kOff : P2PMode::kAuto;
    } else if (key == "probe") {
      QLINK_RETURN_IF_ERROR(ReadBool(v, field, &p2p->probe));
    } else if (key == "probe_mib") {
      QLINK_RETURN_IF_ERROR(ReadInt(v, field, 1, 4096, &p2p->probe_mib));
    } else if (key == "min_gbps") {
      QLINK_RETURN_IF_ERROR(ReadDouble(v, field, 0.0, 1e5, &p2p->min_gbps));
    } else if (key == "min_ratio") {
      QLINK_RETURN_IF_ERROR(ReadDouble(v, field, 0.0, 1e3, &p2p->min_ratio));
    } else {
      return InvalidArgument("config has unknown field '" + field +
                             "' (known: mode, probe, probe_mib, min_gbps, min_ratio)");
    }
  }
  return Status::Ok();
}

}  // namespace

const char* ToString(P2PMode mode) {
  switch (mode) {
    case P2PMode::kOn:
      return "on";
    case P2PMode::kOff:
      return "off";
    default:
      return "auto";
  }
}

Status ParseConfig(const char* text, Config* out) {
  *out = Config();
  if (text == nullptr || *text == '\0') return Status::Ok();
  boost::system::error_code ec;
  json::value root = json::parse(json::string_view(text, std::strlen(text)), ec);
  if (ec) return InvalidArgument("config is not valid JSON: " + ec.message());
  if (!root.is_object()) return InvalidArgument("config must be a JSON object, got " + KindName(root.kind()));
  for (const auto& [key, v] : root.get_object()) {
    std::string field(key);
    if (key == "backend") {
      QLINK_RETURN_IF_ERROR(ReadString(v, field, &out->backend));
      if (out->backend.empty()) return InvalidArgument("config field 'backend' is empty");
    } else if (key == "log_level") {
      QLINK_RETURN_IF_ERROR(ReadChoice(v, field, {"trace", "debug", "info", "warn", "error", "off"}, &out->log_level));
    } else if (key == "cpu_devices") {
      QLINK_RETURN_IF_ERROR(ReadInt(v, field, 1, 256, &out->cpu_devices));
    } else if (key == "nccl_library") {
      QLINK_RETURN_IF_ERROR(ReadString(v, field, &out->nccl_library));
    } else if (key == "blas_library") {
      QLINK_RETURN_IF_ERROR(ReadString(v, field, &out->blas_library));
    } else if (key == "solver_library") {
      QLINK_RETURN_IF_ERROR(ReadString(v, field, &out->solver_library));
    } else if (key == "hessian_precision") {
      std::string precision;
      QLINK_RETURN_IF_ERROR(ReadChoice(v, field, {"ieee_fp32", "tensor", "tensor_gemm"}, &precision));
      out->hessian_precision = precision == "tensor"        ? HessianPrecision::kTensor
                               : precision == "tensor_gemm" ? HessianPrecision::kTensorGemm
                                                            : HessianPrecision::kIeeeFp32;
    } else if (key == "backend_options") {
      if (!v.is_object()) return WrongType(field, "an object", v);
      out->backend_options = json::serialize(v);
    } else if (key == "p2p") {
      if (!v.is_object()) return WrongType(field, "an object", v);
      QLINK_RETURN_IF_ERROR(ParseP2P(v.get_object(), &out->p2p));
    } else {
      return InvalidArgument("config has unknown field '" + field +
                             "' (known: backend, backend_options, log_level, cpu_devices, nccl_library, blas_library, "
                             "solver_library, hessian_precision, p2p)");
    }
  }
  return Status::Ok();
}

}  // namespace qlink
