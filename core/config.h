// The context configuration: one JSON object, nothing read from the environment.
#pragma once

#include <string>

#include "backends/status.h"

namespace qlink {

enum class P2PMode { kAuto, kOn, kOff };

// GPTQModel's P2PConfig (docs/HOSTS.md), field for field.
struct P2PConfig {
  P2PMode mode = P2PMode::kAuto;
  bool probe = false;      // time each pair before accepting it
  int probe_mib = 64;      // bytes per probe copy, MiB
  double min_gbps = 0.0;   // a probed pair below this is rejected
  double min_ratio = 0.8;  // ... or below this ratio to the regular path (noise allowed)
};

// How hessian_accumulate sums bf16/fp16 activations' products (qlink_hessian_precision).
enum class HessianPrecision { kIeeeFp32, kTensor, kTensorGemm };

struct Config {
  std::string backend = "auto";    // auto | cuda | hip | cpu | path to a backend .so
  std::string log_level = "warn";  // trace | debug | info | warn | error | off
  int cpu_devices = 4;             // virtual devices of the CPU backend
  std::string nccl_library;        // NCCL/RCCL for multi-process collectives; "" = the backend's default
  // The GPTQ engine's BLAS and LAPACK-style solver libraries, handed to the backend;
  // "" = the backend's default.
  std::string blas_library;
  std::string solver_library;
  HessianPrecision hessian_precision = HessianPrecision::kIeeeFp32;  // when a call does not say
  // Backend-specific settings, as a JSON object's text: core only checks that it is an
  // object and hands it to the backend, which owns its keys.
  std::string backend_options = "{}";
  P2PConfig p2p;
};

// Parses `json` (NULL or empty gives the defaults). Unknown keys, wrong types and
// out-of-range values are refused with INVALID_ARGUMENT naming the field.
Status ParseConfig(const char* json, Config* out);

const char* ToString(P2PMode mode);

}  // namespace qlink
