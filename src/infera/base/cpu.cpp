#include "infera/base/cpu.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "infera/base/options.h"

namespace infera {
namespace {

uint64_t xgetbv0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d)) {
    char vendor[13] = {};
    std::memcpy(vendor, &b, 4);
    std::memcpy(vendor + 4, &d, 4);
    std::memcpy(vendor + 8, &c, 4);
    f.amd = std::strcmp(vendor, "AuthenticAMD") == 0;
  }
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27);
  const bool fma = c & (1u << 12);
  const bool f16c = c & (1u << 29);
  if (!osxsave) return f;
  const uint64_t xcr0 = xgetbv0();
  const bool ymm_os = (xcr0 & 0x6) == 0x6;
  const bool zmm_os = (xcr0 & 0xe6) == 0xe6;
  unsigned a7 = 0, b7 = 0, c7 = 0, d7 = 0;
  __get_cpuid_count(7, 0, &a7, &b7, &c7, &d7);
  unsigned a71 = 0, b71 = 0, c71 = 0, d71 = 0;
  __get_cpuid_count(7, 1, &a71, &b71, &c71, &d71);
  if (ymm_os) {
    f.avx2 = b7 & (1u << 5);
    f.fma = fma;
    f.f16c = f16c;
    f.avxvnni = a71 & (1u << 4);
  }
  if (zmm_os) {
    f.avx512f = b7 & (1u << 16);
    f.avx512dq = b7 & (1u << 17);
    f.avx512bw = b7 & (1u << 30);
    f.avx512vl = b7 & (1u << 31);
    f.avx512vnni = c7 & (1u << 11);
    f.avx512bf16 = a71 & (1u << 5);
    f.amx_bf16 = d7 & (1u << 22);
    f.amx_tile = d7 & (1u << 24);
    f.amx_int8 = d7 & (1u << 25);
  }
  const std::string cap = option_env("isa", BadEnvValue::kWarnAndIgnore);  // INFERA_ISA
  if (cap == "scalar") f = CpuFeatures{};
  if (cap == "avx2") {
    f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = f.avx512vnni = f.avx512bf16 = false;
    f.amx_tile = f.amx_int8 = f.amx_bf16 = false;
  }
  return f;
}

}  // namespace

std::string CpuFeatures::describe() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512vnni, "avx512vnni");
  add(avx512bf16, "avx512bf16");
  add(avxvnni, "avxvnni");
  add(amx_tile, "amx_tile");
  add(amx_int8, "amx_int8");
  add(amx_bf16, "amx_bf16");
  return s.empty() ? "none" : s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

const char* amx_unavailable_reason() {
  static const char* const why = []() -> const char* {
    if (option_env("amx", BadEnvValue::kWarnAndIgnore) == "0") return "off (INFERA_AMX=0)";  // A/B runs
    const CpuFeatures& f = cpu_features();
    if (!f.has_avx512_path() || !f.amx_tile || !f.amx_int8 || !f.amx_bf16) return "not on this CPU";
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;  // asm/prctl.h
    if (syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) != 0) return "not granted by the kernel";
    return nullptr;
  }();
  return why;
}

Isa best_isa() {
  const auto& f = cpu_features();
  if (f.has_avx512_path()) return Isa::kAvx512;
  if (f.has_avx2_path()) return Isa::kAvx2;
  return Isa::kScalar;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    case Isa::kScalar: return "scalar";
  }
  return "?";
}

}  // namespace infera
