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
  // AMX (Sapphire Rapids and later): the tile unit and its int8 / bf16 products. Usable only
  // once Linux grants the process the tile state (amx_unavailable_reason).
  bool amx_tile = false;
  bool amx_int8 = false;
  bool amx_bf16 = false;
  // The vendor is AMD (AuthenticAMD). Zen 4 / 5 issue one 512-bit FMA per cycle (two 256-bit
  // pipes) where Intel's server cores issue two, so there AVX512_BF16's vdpbf16ps (32
  // products an instruction) outruns the f32 FMAs, and on Intel it does not (kernels.h).
  bool amd = false;

  bool has_avx2_path() const { return avx2 && fma && f16c; }
  bool has_avx512_path() const {
    return has_avx2_path() && avx512f && avx512bw && avx512vl && avx512dq && avx512vnni && avx512bf16;
  }
  std::string describe() const;
};

// Detected once. The environment variable INFERA_ISA (scalar|avx2|avx512) caps the
// features reported, so every path can be exercised on one machine.
const CpuFeatures& cpu_features();

// Why the AMX kernels (AVX-512 path) cannot run, or nullptr when they can: "off
// (INFERA_AMX=0)", "not on this CPU" (no AMX tile unit with int8 and bf16 products, or the
// kernel path capped below avx512), "not granted by the kernel" (arch_prctl refused the
// tile state). Asked once; the first call requests the tile state for the process.
const char* amx_unavailable_reason();

enum class Isa { kScalar, kAvx2, kAvx512 };
Isa best_isa();
const char* isa_name(Isa isa);

}  // namespace infera
