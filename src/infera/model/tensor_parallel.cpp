#include "infera/model/tensor_parallel.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "infera/base/error.h"
#include "infera/io/gguf.h"
#include "infera/kernels/ggml_quants.h"
#include "infera/model/gguf_loader.h"
#include "infera/model/quantized_weights.h"
#include "infera/model/tensor_dump.h"

namespace infera {

using parallel::Range;

namespace {

// Column and multi-range shards of a matrix with pre-quantized extras (act-order permutation,
// zero points, static activations) are not built: they would need the extras split too.
void refuse_extras(const kernels::LinearWeight& w, const char* what) {
  if (w.quantized && w.quant.extras) {
    fail(
        "tensor '{}': a {} shard of a pre-quantized layer with zero points, act-order or static activations is "
        "not supported (run it without tensor parallelism)",
        w.name, what);
  }
}

// Drops this process's mapping of the weight bytes [p, p + n) once they were copied: clean
// file-backed pages leave the resident set (and would be read again from the page cache
// if touched). Recent kernels map page-cache folios of up to 2 MiB whole, so pages this
// rank never asked for (its neighbours' rows, the next tensor) come along with the ones it
// read; the range is widened to 2 MiB boundaries, clipped to the file's mapping, to drop
// them too. A file read into memory: its whole pages in the range mapped back from the file
// (release_file_pages; MADV_DONTNEED would zero anonymous memory).
void release_mapped_pages(const void* p, int64_t n) {
  const FileMappings maps = FileMappings::current();
  const auto [map_begin, map_end] = maps.range_of(p);
  if (map_begin == 0) {
    release_file_pages(p, static_cast<size_t>(n), maps);
    return;
  }
  constexpr uintptr_t kFolio = uintptr_t{2} << 20;
  const auto a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t begin = std::max(map_begin, a / kFolio * kFolio);
  const uintptr_t end = std::min(map_end, (a + static_cast<uintptr_t>(n) + kFolio - 1) / kFolio * kFolio);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

// Bytes per row of a quantized matrix's weights and scales.
int64_t qweight_row_bytes(const kernels::QuantMatRef& w) {
  return kernels::scheme_is_int4(w.scheme) ? w.cols / 2 : w.cols;
}
int64_t scale_row_bytes(const kernels::QuantMatRef& w) {
  return kernels::scheme_is_int4(w.scheme) ? w.groups_per_row() * 2 : static_cast<int64_t>(sizeof(float));
}

// What else a GGUF matrix whose split falls inside its blocks could do: a MoE's experts split
// whole with --ep; its shared expert splits over every rank under --ep too, and is kept whole
// by all-to-all dispatch.
enum class BlockHint { kNone, kExperts, kSharedExpert };

// A GGUF matrix's input columns c of cols, split on the blocks of its type.
void check_whole_blocks(std::string_view name, int64_t cols, Range c, uint32_t ggml_type, BlockHint hint) {
  const int64_t block = kernels::ggml::block_size(ggml_type);
  if (c.begin % block == 0 && c.end % block == 0) return;
  fail(
      "{}: tensor parallelism splits its {} input columns at [{}, {}), inside the {}-column blocks of its GGUF type "
      "{}; pick a --tp that gives each rank whole blocks{}",
      name, cols, c.begin, c.end, block, gguf::ggml_type_traits(static_cast<gguf::GgmlType>(ggml_type)).name,
      hint == BlockHint::kExperts        ? " (or split the experts with --ep)"
      : hint == BlockHint::kSharedExpert ? " (the shared expert splits over every rank, also with --ep; "
                                           "--ep N --ep-dispatch all-to-all keeps it whole)"
                                         : "");
}

// A GGUF file's row-parallel matrices (inspect_gguf_weights), each rank's columns as the
// binding cuts them (shard_layer, shard_moe, shard_gdn): attention outputs and GDN's out_proj by
// heads, the dense and shared MLPs' and (TP without EP) the experts' down projections by
// columns; each must be whole blocks of its type.
void check_gguf_columns(const ModelConfig& cfg, int tp, int ep,
                        const std::vector<GgufWeightsSummary::ColumnSplit>& gguf_columns, bool ep_all_to_all) {
  for (const GgufWeightsSummary::ColumnSplit& m : gguf_columns) {
    int64_t units = m.cols;
    int parts = tp;
    if (m.slot == "attn_output") {
      units = cfg.num_heads;
    } else if (m.slot == "gdn_out") {
      units = cfg.linear_num_key_heads;
    } else if (m.slot == "ffn_down_exps") {
      if (ep > 1) continue;
    } else if (m.slot == "ffn_down_shexp") {
      if (ep_all_to_all) continue;
      parts = std::max(tp, ep);
    }
    if (parts <= 1 || units <= 0) continue;
    const int64_t width = m.cols / units;
    for (int r = 0; r < parts; ++r) {
      const Range u = parallel::split_range(units, parts, r);
      check_whole_blocks(m.gguf, m.cols, Range{u.begin * width, u.end * width}, m.ggml_type,
                         m.slot == "ffn_down_shexp" ? BlockHint::kSharedExpert
                         : cfg.num_experts > 0      ? BlockHint::kExperts
                                                    : BlockHint::kNone);
    }
  }
}

}  // namespace

void TensorShard::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

TensorShard::TensorShard(const parallel::ParallelPlan& plan, const ModelConfig& cfg, const std::string& where)
    : plan_(plan) {
  if (plan.distributed()) parallel::validate_plan(plan);
  tp_ = plan.distributed() ? plan.tp : 1;
  ep_ = plan.distributed() ? plan.ep : 1;
  const int r = plan.rank();
  check_split(cfg, tp_, ep_, where);
  heads = parallel::split_range(cfg.num_heads, tp_, tp_ > 1 ? r : 0);
  kv_heads = parallel::split_range(cfg.num_kv_heads, tp_, tp_ > 1 ? r : 0);
  ffn = parallel::split_range(cfg.intermediate_size, tp_, tp_ > 1 ? r : 0);
  vocab = parallel::split_range(cfg.vocab_size, tp_, tp_ > 1 ? r : 0);
  vocab_size_ = cfg.vocab_size;
  if (cfg.linear_num_key_heads > 0) {
    gdn_key_heads = parallel::split_range(cfg.linear_num_key_heads, tp_, tp_ > 1 ? r : 0);
    const int64_t per_key = cfg.linear_num_value_heads / cfg.linear_num_key_heads;
    gdn_value_heads = {gdn_key_heads.begin * per_key, gdn_key_heads.end * per_key};
  }
  if (cfg.num_experts > 0) {
    experts = parallel::split_range(cfg.num_experts, ep_, ep_ > 1 ? r : 0);
    for (int owner = 0; owner < ep_; ++owner) {
      const Range mine = parallel::split_range(cfg.num_experts, ep_, owner);
      expert_owner_.insert(expert_owner_.end(), static_cast<size_t>(mine.size()), owner);
    }
    // TP without EP splits every expert's intermediate dimension instead.
    const int inner = ep_ > 1 ? 1 : tp_;
    expert_ffn = parallel::split_range(cfg.moe_intermediate_size, inner, inner > 1 ? r : 0);
  }
}

void TensorShard::check_split(const ModelConfig& cfg, int tp, int ep, const std::string& where) {
  if (cfg.num_heads % tp != 0 || cfg.num_kv_heads % tp != 0) {
    fail("{}: --tp {} must divide num_attention_heads ({}) and num_key_value_heads ({}); pick a divisor of both", where,
         tp, cfg.num_heads, cfg.num_kv_heads);
  }
  if (ep > 1 && cfg.num_experts == 0) {
    fail("{}: --ep {} splits experts, but this {} model has none; use --tp", where, ep, cfg.model_type);
  }
  if (ep > cfg.num_experts && cfg.num_experts > 0)
    fail("{}: --ep {} exceeds the model's {} experts", where, ep, cfg.num_experts);
  if (cfg.linear_num_key_heads > 0 && tp > cfg.linear_num_key_heads) {
    fail(
        "{}: --tp {} exceeds the model's {} linear-attention key heads (linear_num_key_heads); each rank needs at "
        "least one",
        where, tp, cfg.linear_num_key_heads);
  }
}

void TensorShard::check_split(const std::string& path, int tp, int ep, bool ep_all_to_all) {
  parallel::validate_sizes(tp, ep, std::max(tp, ep));
  ModelConfig cfg = load_model_config(path);
  check_split(cfg, tp, ep, path);
  if (!is_gguf_path(path) || std::max(tp, ep) <= 1) return;
  cfg.gdn_value_heads_tiled = false;  // (as load_model binds a GGUF file for a group)
  check_gguf_columns(cfg, tp, ep, inspect_gguf_weights(path, cfg).column_splits, ep_all_to_all);
}

uint8_t* TensorShard::allocate(int64_t bytes) {
  const size_t total = static_cast<size_t>(std::max<int64_t>(bytes, 1));
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, (total + 63) / 64 * 64));
  if (p == nullptr) fail("out of memory: {} bytes for this rank's weight shard", bytes);
  owned_.emplace_back(p);
  return p;
}

kernels::MatRef TensorShard::gathered(kernels::MatRef shape, const std::function<void(uint8_t*)>& gather) {
  const int64_t bytes = shape.rows * kernels::row_bytes(shape);
  if (!takes_panels(shape)) {
    uint8_t* dst = allocate(bytes);
    gather(dst);
    shape.data = dst;
    return shape;
  }
  // A GGUF matrix of a panel type: packed from a scratch copy, then held as panels only.
  std::vector<uint8_t> scratch(static_cast<size_t>(bytes));
  gather(scratch.data());
  shape.data = scratch.data();
  kernels::MatRef m = with_panels(shape);
  m.data = nullptr;
  return m;
}

kernels::MatRef TensorShard::packed(const kernels::MatRef& w) const {
  return distributed() && !w.panels && takes_panels(w) ? with_panels(w) : w;
}

kernels::LinearWeight TensorShard::replicated(const kernels::LinearWeight& w) const {
  return w.quantized ? w : kernels::dense_linear(packed(w.dense), w.name);
}

kernels::MatRef TensorShard::rows(const kernels::MatRef& w, Range r, bool own) {
  const bool whole = r.begin == 0 && r.end == w.rows;
  if (whole && !own) return packed(w);
  const kernels::MatRef view = whole ? w : kernels::row_slice(w, r.begin, r.end);
  // One process: a view. A group: a copy, because the kernel maps page-cache folios whole, so
  // a view would keep neighbouring ranks' rows resident too (and, read into memory, every
  // rank would keep the whole file).
  if (!distributed()) return packed(view);
  kernels::MatRef out = view;
  if (takes_panels(view)) {
    // A GGUF matrix computes from its panels: they are this rank's copy, and the rows stay a
    // view of the file (read back from it only by the scalar path), their pages dropped.
    out = with_panels(view);
  } else {
    const int64_t bytes = view.rows * kernels::row_bytes(w);
    uint8_t* dst = allocate(bytes);
    std::memcpy(dst, view.data, static_cast<size_t>(bytes));
    out.data = dst;
  }
  release_mapped_pages(w.data, w.rows * kernels::row_bytes(w));
  return out;
}

kernels::LinearWeight TensorShard::rows(const kernels::LinearWeight& w, Range r) {
  if (!w.quantized) return kernels::dense_linear(rows(w.dense, r), w.name);
  if (r.begin == 0 && r.end == w.rows()) return w;
  // Quantized: rows of qweight and of the scales are contiguous in the stored layout (the
  // fields every path keeps valid); a repacked copy is rebuilt from the slice.
  const kernels::QuantMatRef& q = w.quant;
  const int64_t qb = qweight_row_bytes(q), sb = scale_row_bytes(q);
  const auto* qw = static_cast<const uint8_t*>(q.qweight) + r.begin * qb;
  const auto* sc = static_cast<const uint8_t*>(q.scales) + r.begin * sb;
  kernels::LinearWeight out = w;
  if (distributed()) {
    uint8_t* dq = allocate(r.size() * qb);
    uint8_t* ds = allocate(r.size() * sb);
    std::memcpy(dq, qw, static_cast<size_t>(r.size() * qb));
    std::memcpy(ds, sc, static_cast<size_t>(r.size() * sb));
    release_mapped_pages(q.qweight, q.rows * qb);
    release_mapped_pages(q.scales, q.rows * sb);
    qw = dq;
    sc = ds;
  }
  out.quant = kernels::QuantMatRef(q.scheme, r.size(), q.cols, q.group_size, qw, sc);
  out.quant.extras = q.extras;  // indexed by row: the shard reads its rows of them
  out.quant.extras_row0 = q.extras_row0 + r.begin;
  if (q.packed) out.quant.packed = kernels::pack_quant_matrix(out.quant);
  return out;
}

kernels::MatRef TensorShard::columns(const kernels::MatRef& w, Range c, std::string_view name, bool shared_expert) {
  if (c.begin == 0 && c.end == w.cols) return packed(w);
  INFERA_ASSERT(0 <= c.begin && c.begin <= c.end && c.end <= w.cols);
  // GGUF blocks run along the input columns: a rank takes whole blocks of every row.
  if (w.dtype == DType::kGgml)
    check_whole_blocks(name.empty() ? std::string_view("a GGUF matrix") : name, w.cols, c, w.ggml_type,
                       shared_expert            ? BlockHint::kSharedExpert
                       : !expert_owner_.empty() ? BlockHint::kExperts
                                                : BlockHint::kNone);
  const int64_t src_row = kernels::row_bytes(w);
  const kernels::MatRef shape{nullptr, w.dtype, w.rows, c.size(), w.ggml_type};
  const int64_t row = kernels::row_bytes(shape);
  const int64_t offset = w.dtype == DType::kGgml ? kernels::ggml::row_bytes(w.ggml_type, c.begin)
                                                 : c.begin * static_cast<int64_t>(dtype_size(w.dtype));
  const auto gather = [&](uint8_t* dst) {
    const auto* src = static_cast<const uint8_t*>(w.data);
    for (int64_t i = 0; i < w.rows; ++i)
      std::memcpy(dst + i * row, src + i * src_row + offset, static_cast<size_t>(row));
  };
  const kernels::MatRef out = gathered(shape, gather);
  release_mapped_pages(w.data, w.rows * src_row);
  return out;
}

kernels::LinearWeight TensorShard::columns(const kernels::LinearWeight& w, Range c, bool shared_expert) {
  if (!w.quantized) return kernels::dense_linear(columns(w.dense, c, w.name, shared_expert), w.name);
  if (c.begin == 0 && c.end == w.cols()) return w;
  refuse_extras(w, "column");
  // Quantized, row-parallel: W8A8 has one scale per row, which stays exact for any column
  // slice (the slice is one group of its own width). int4 groups run along k, so a rank's
  // columns must be whole groups; the packing (runs of 32 columns) then splits on bytes.
  const kernels::QuantMatRef& q = w.quant;
  const bool int4 = kernels::scheme_is_int4(q.scheme);
  if (int4 && (c.begin % q.group_size != 0 || c.end % q.group_size != 0)) {
    fail(
        "{}: tensor parallelism splits its {} input columns at [{}, {}), which is not a multiple of the "
        "quantization group size {}; pick a --tp that gives each rank whole groups, or quantize with a smaller "
        "--group-size",
        w.name, q.cols, c.begin, c.end, q.group_size);
  }
  const int64_t qb = qweight_row_bytes(q), sb = scale_row_bytes(q);
  const int64_t q0 = int4 ? c.begin / 2 : c.begin, qn = int4 ? c.size() / 2 : c.size();
  const int64_t s0 = int4 ? c.begin / q.group_size * 2 : 0, sn = int4 ? c.size() / q.group_size * 2 : sb;
  uint8_t* dq = allocate(q.rows * qn);
  uint8_t* ds = allocate(q.rows * sn);
  const auto* qw = static_cast<const uint8_t*>(q.qweight);
  const auto* sc = static_cast<const uint8_t*>(q.scales);
  for (int64_t i = 0; i < q.rows; ++i) {
    std::memcpy(dq + i * qn, qw + i * qb + q0, static_cast<size_t>(qn));
    std::memcpy(ds + i * sn, sc + i * sb + s0, static_cast<size_t>(sn));
  }
  release_mapped_pages(q.qweight, q.rows * qb);
  release_mapped_pages(q.scales, q.rows * sb);
  kernels::LinearWeight out = w;
  out.quant = kernels::QuantMatRef(q.scheme, q.rows, c.size(), int4 ? q.group_size : c.size(), dq, ds);
  if (q.packed) out.quant.packed = kernels::pack_quant_matrix(out.quant);
  return out;
}

std::vector<float> TensorShard::slice(const std::vector<float>& v, Range r) {
  if (v.empty()) return v;
  return std::vector<float>(v.begin() + r.begin, v.begin() + r.end);
}

kernels::MatRef TensorShard::rows(const kernels::MatRef& w, const std::vector<Range>& ranges) {
  int64_t total = 0, next = 0;
  bool in_order = true;
  for (const Range& r : ranges) {
    INFERA_ASSERT(0 <= r.begin && r.begin <= r.end && r.end <= w.rows, "row range outside the matrix");
    in_order = in_order && r.begin == next;
    next = r.end;
    total += r.size();
  }
  if (in_order && next == w.rows) return packed(w);
  const int64_t row_bytes = kernels::row_bytes(w);
  const auto gather = [&](uint8_t* dst) {
    int64_t at = 0;
    for (const Range& r : ranges) {
      std::memcpy(dst + at * row_bytes, static_cast<const uint8_t*>(w.data) + r.begin * row_bytes,
                  static_cast<size_t>(r.size() * row_bytes));
      at += r.size();
    }
  };
  const kernels::MatRef out = gathered({nullptr, w.dtype, total, w.cols, w.ggml_type}, gather);
  release_mapped_pages(w.data, w.rows * row_bytes);
  return out;
}

kernels::LinearWeight TensorShard::rows(const kernels::LinearWeight& w, const std::vector<Range>& ranges) {
  if (!w.quantized) return kernels::dense_linear(rows(w.dense, ranges), w.name);
  int64_t total = 0, next = 0;
  bool in_order = true;
  for (const Range& r : ranges) {
    INFERA_ASSERT(0 <= r.begin && r.begin <= r.end && r.end <= w.rows(), "row range outside the matrix");
    in_order = in_order && r.begin == next;
    next = r.end;
    total += r.size();
  }
  if (in_order && next == w.rows()) return w;
  refuse_extras(w, "multi-range row");
  // Quantized rows (qweight and scales) are contiguous, so the ranges copy like dense rows.
  const kernels::QuantMatRef& q = w.quant;
  const int64_t qb = qweight_row_bytes(q), sb = scale_row_bytes(q);
  uint8_t* dq = allocate(total * qb);
  uint8_t* ds = allocate(total * sb);
  int64_t at = 0;
  for (const Range& r : ranges) {
    std::memcpy(dq + at * qb, static_cast<const uint8_t*>(q.qweight) + r.begin * qb,
                static_cast<size_t>(r.size() * qb));
    std::memcpy(ds + at * sb, static_cast<const uint8_t*>(q.scales) + r.begin * sb, static_cast<size_t>(r.size() * sb));
    at += r.size();
  }
  release_mapped_pages(q.qweight, q.rows * qb);
  release_mapped_pages(q.scales, q.rows * sb);
  kernels::LinearWeight out = w;
  out.quant = kernels::QuantMatRef(q.scheme, total, q.cols, q.group_size, dq, ds);
  if (q.packed) out.quant.packed = kernels::pack_quant_matrix(out.quant);
  return out;
}

std::vector<float> TensorShard::slice_rows(const std::vector<float>& v, int64_t width,
                                           const std::vector<Range>& ranges) {
  std::vector<float> out;
  for (const Range& r : ranges) out.insert(out.end(), v.begin() + r.begin * width, v.begin() + r.end * width);
  return out;
}

void TensorShard::shard_moe(MoeWeights& w) {
  if (!distributed()) return;
  for (int64_t e = 0; e < w.n_experts(); ++e) {
    if (!experts.contains(e)) {  // another rank's expert: MoeFfn skips it
      // Its stored rows, read into memory with the file, given back (mapped: untouched).
      for (const kernels::LinearWeight* m : {&w.gate[e], &w.up[e], &w.down[e]})
        if (!m->quantized && m->dense.data)
          release_mapped_pages(m->dense.data, m->dense.rows * kernels::row_bytes(m->dense));
      w.drop_expert(e);
      continue;
    }
    if (w.gate[e].quantized) {  // EP: whole quantized experts stay views (no row-range copy needed)
      w.gate[e] = rows(w.gate[e], expert_ffn);
      w.up[e] = rows(w.up[e], expert_ffn);
      if (!expert_parallel()) w.down[e] = columns(w.down[e], expert_ffn);
      continue;
    }
    kernels::MatRef &gate = w.gate[e].dense, &up = w.up[e].dense, &down = w.down[e].dense;
    gate = rows(gate, expert_ffn, expert_parallel());
    up = rows(up, expert_ffn, expert_parallel());
    down = expert_parallel() ? rows(down, {0, down.rows}, /*own=*/true) : columns(down, expert_ffn, w.down[e].name);
  }
  if (w.shared.empty()) return;
  // All-to-all dispatch: each rank runs the shared expert whole, for its own tokens.
  if (plan_.ep_all_to_all) {
    for (kernels::LinearWeight* m : {&w.shared.gate, &w.shared.up, &w.shared.down}) *m = replicated(*m);
    return;
  }
  const Range cols = parallel::split_range(w.shared.inter(), plan_.world(), rank());
  w.shared.gate = rows(w.shared.gate, cols);
  w.shared.up = rows(w.shared.up, cols);
  w.shared.down = columns(w.shared.down, cols, /*shared_expert=*/true);
}

GdnDims TensorShard::gdn_dims(const GdnDims& whole) const {
  if (!tensor_parallel()) return whole;
  GdnDims d = whole;
  d.n_k_heads = gdn_key_heads.size();
  d.n_v_heads = gdn_value_heads.size();
  return d;
}

void TensorShard::shard_gdn(GdnWeights& w, const GdnDims& d) {
  if (!tensor_parallel()) return;
  INFERA_ASSERT(!w.value_heads_tiled, "a group's GDN projections are bound in Hugging Face's value-head order");
  const Range kh = gdn_key_heads, vh = gdn_value_heads;
  const int64_t kd = d.key_dim(), per_key = d.n_v_heads / d.n_k_heads;
  // Conv channels and the split in_proj_qkv rows: q | k | v, each cut to this rank's heads.
  const std::vector<Range> channels = {{kh.begin * d.dk, kh.end * d.dk},
                                       {kd + kh.begin * d.dk, kd + kh.end * d.dk},
                                       {2 * kd + vh.begin * d.dv, 2 * kd + vh.end * d.dv}};
  const Range values{vh.begin * d.dv, vh.end * d.dv};
  if (w.fused()) {
    // Qwen3-Next: rows grouped per key head, so this rank's groups are one block.
    const int64_t group_rows = 2 * d.dk + 2 * per_key * d.dv;
    w.in_qkvz = rows(w.in_qkvz, Range{kh.begin * group_rows, kh.end * group_rows});
    w.in_ba = rows(w.in_ba, Range{kh.begin * 2 * per_key, kh.end * 2 * per_key});
  } else {
    w.in_qkv = rows(w.in_qkv, channels);
    w.in_z = rows(w.in_z, values);
    w.in_b = rows(w.in_b, vh);
    w.in_a = rows(w.in_a, vh);
  }
  w.out = columns(w.out, values);
  w.conv_w = slice_rows(w.conv_w, d.kernel, channels);
  w.neg_exp_a = slice(w.neg_exp_a, vh);
  w.dt_bias = slice(w.dt_bias, vh);
}

void TensorShard::moe(MoeFfn& ffn, const MoeWeights& w, const float* x, int64_t T, int64_t H, float* y,
                      uint64_t* counts) {
  if (!(expert_parallel() && plan_.ep_all_to_all)) {
    ffn.forward(w, x, T, H, y, counts);
    all_reduce(y, T * H, tensor_parallel() || expert_parallel());  // partial sums: experts or their columns
    return;
  }
  const int P = plan_.world();
  const Range own = parallel::split_range(T, P, rank());
  const int64_t chunk = (T + P - 1) / P;  // rows per rank in the all-gather (the last ones may be short)
  own_rows_.assign(static_cast<size_t>(chunk * H), 0.0f);
  dispatch_.forward(*plan_.comm, expert_owner_, w, x + own.begin * H, own.size(), H, own_rows_.data(), counts);
  // Attention is replicated in this layout: every rank needs every token's output.
  all_rows_.resize(static_cast<size_t>(P * chunk * H));
  plan_.comm->all_gather(own_rows_.data(), chunk * H * static_cast<int64_t>(sizeof(float)), all_rows_.data());
  for (int r = 0; r < P; ++r) {
    const Range rows = parallel::split_range(T, P, r);
    std::memcpy(y + rows.begin * H, all_rows_.data() + r * chunk * H,
                static_cast<size_t>(rows.size() * H) * sizeof(float));
  }
}

void TensorShard::all_reduce(float* x, int64_t n, bool split) {
  if (split && distributed()) plan_.comm->all_reduce_sum(x, n);
}

void TensorShard::logits(const float* rows, int64_t R, const kernels::LinearWeight& head, float* out) {
  if (!tensor_parallel()) {
    kernels::linear(rows, R, head, out);
    return;
  }
  if (head.quantized) {
    fail(
        "{}: a quantized output head cannot be split by vocabulary yet; quantize with --embed-head bf16 (the "
        "default) to run this checkpoint with --tp",
        head.name);
  }
  logits(rows, R, head.dense, out);
}

kernels::LinearWeight TensorShard::head(const kernels::LinearWeight& w) {
  if (!tensor_parallel() || w.quantized || w.dense.dtype != DType::kGgml) return replicated(w);
  return rows(w, vocab);
}

void TensorShard::logits(const float* rows, int64_t R, const kernels::MatRef& head, float* out) {
  if (!tensor_parallel()) {
    kernels::matmul(rows, R, head, out);
    return;
  }
  // Ranks' vocabulary ranges differ by at most one row; pad each to the longest so one
  // fixed-size gather carries them.
  const int64_t Vc = (vocab_size_ + tp_ - 1) / tp_;
  local_logits_.assign(static_cast<size_t>(R * Vc), 0.0f);
  const bool sliced = head.rows == vocab.size() && vocab.size() < vocab_size_;  // head(): this rank's rows
  INFERA_ASSERT(sliced || head.rows == vocab_size_, "output head of neither the whole vocabulary nor this rank's rows");
  kernels::matmul_rows(rows, R, head, sliced ? 0 : vocab.begin, sliced ? vocab.size() : vocab.end, local_logits_.data(),
                       Vc);
  const int64_t bytes = R * Vc * static_cast<int64_t>(sizeof(float));
  const bool everyone = !merged_sync();
  if (everyone || rank() == 0) gathered_.resize(static_cast<size_t>(tp_ * R * Vc));
  if (everyone) {
    plan_.comm->all_gather(local_logits_.data(), bytes, gathered_.data());
  } else {
    plan_.comm->gather(local_logits_.data(), bytes, gathered_.data(), 0);
    if (rank() != 0) return;
  }
  for (int r = 0; r < tp_; ++r) {
    const Range vr = parallel::split_range(vocab_size_, tp_, r);
    for (int64_t i = 0; i < R; ++i) {
      std::memcpy(out + i * vocab_size_ + vr.begin, gathered_.data() + (r * R + i) * Vc,
                  static_cast<size_t>(vr.size()) * sizeof(float));
    }
  }
}

void embed_batch(TensorShard& shard, const ForwardBatch& batch, int64_t vocab_size, const kernels::LinearWeight& embed,
                 int64_t H, float* x, std::vector<int32_t>& positions, TensorDump* dump) {
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  for (const int32_t tok : batch.tokens) INFERA_ASSERT(tok >= 0 && tok < vocab_size, "token id out of range");
  shard.embed(batch.tokens.data(), T, H, x, [&](int32_t tok, float* row) { linear_row(embed, tok, row); });
  batch_positions(batch, positions);
  if (dump) {
    dump->begin_forward();
    dump->write("embed", -1, x, T, H);
  }
}

void head_logits(TensorShard& shard, const float* rows, int64_t R, int64_t H, const kernels::LinearWeight& head,
                 int64_t vocab_size, float* logits, TensorDump* dump) {
  if (dump) dump->write("final_norm", -1, rows, R, H);
  shard.logits(rows, R, head, logits);
  if (dump) dump->write("logits", -1, logits, R, vocab_size);
}

}  // namespace infera
