// The AMX tile configuration (palette 1) that the tile kernels load: W8A8 prefill
// (quant_impl.h), bf16 / f16 prefill (kernels_impl.h) and the GGUF block types' prefill
// (ggml_matmul_vnni.h). Each sets the shapes of the tiles it uses and calls load_tiles.
#pragma once

#include <cstdint>

namespace infera::kernels::amx_tiles {

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};

  // Tile t: `nrows` rows of `bytes` bytes each.
  void set(int t, int nrows, int bytes) {
    rows[t] = static_cast<uint8_t>(nrows);
    colsb[t] = static_cast<uint16_t>(bytes);
  }
};

// Every one of the 8 tiles 16 rows of 64 bytes.
inline TileConfig all_16x64() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.set(t, 16, 64);
  return cfg;
}

// Not _tile_loadconfig: GCC 12's declares only the first 8 bytes read, and drops the stores
// to the rest of cfg.
__attribute__((target("amx-tile"))) inline void load_tiles(const TileConfig& cfg) {
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
}

}  // namespace infera::kernels::amx_tiles
