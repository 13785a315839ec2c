// CPU feature detection for runtime kernel dispatch.
#pragma once

#include <string>

namespace infera {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
  bool avxvnni = false;

  bool has_avx2_path() const { return avx2 && fma && f16c; }
  bool has_avx512_path() const {
    return has_avx2_path() && avx512f && avx512bw && avx512vl && avx512dq && avx512vnni && avx512bf16;
  }
  std::string describe() const;
};

// Detected once. The environment variable INFERA_ISA (scalar|avx2|avx512) caps the
// features reported, so every path can be exercised on one machine.
const CpuFeatures& cpu_features();

enum class Isa { kScalar, kAvx2, kAvx512 };
Isa best_isa();
const char* isa_name(Isa isa);

}  // namespace infera
