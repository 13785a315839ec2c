// One rank's part of a transformer under a parallel::ParallelPlan: which heads, KV heads,
// MLP columns, vocabulary rows and experts it holds, the weight views for them, and the
// collectives that put partial results back together. With no plan (one process) every
// range is whole and every collective is a no-op, so an architecture has one code path.
//
// Weight layout choices (W is [out, in] row-major, the Hugging Face layout):
//   column-parallel (q/k/v/gate/up, lm_head by vocabulary): a rank's output rows [r0, r1)
//     are contiguous (kernels::row_slice).
//   row-parallel (o_proj/down): a rank needs input columns [c0, c1) of every row, which are
//     strided.
// In a group every rank copies its slices once at load into memory it owns (the stored
// dtype, [rows, cols] of the slice) and releases the file's pages right after each copy, one
// tensor at a time: a mapping's dropped (MADV_DONTNEED: clean file pages, nothing is lost), a
// file read into memory's mapped back from the file (release_file_pages), as are the other
// ranks' experts.
// Net resident weights per rank ~ 1/TP; peak at load = that + about one full matrix. Views
// into the mapping would avoid the copy, but recent kernels map page-cache folios (up to
// 2 MiB) whole, so the neighbouring ranks' rows, and for row-parallel layers the whole
// matrix, would stay resident in every rank (measured: a TP 2 rank kept 83% of the TP 1
// weights). A strided matmul has the same problem. One process keeps plain views (no
// copy). The embedding table is not split: each rank reads the rows of its tokens.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "infera/kernels/kernels.h"
#include "infera/kernels/quant.h"
#include "infera/model/blocks.h"
#include "infera/model/config.h"
#include "infera/model/expert_dispatch.h"
#include "infera/parallel/plan.h"

namespace infera {

class TensorShard {
 public:
  TensorShard() = default;
  // Throws infera::Error (naming `where`) when tp does not divide the attention and KV
  // heads. In a group, row-parallel slices are this rank's copies, and the checkpoint's
  // pages they were read from are given back (mapped or read into memory alike:
  // release_file_pages).
  TensorShard(const parallel::ParallelPlan& plan, const ModelConfig& cfg, const std::string& where);
  // The checks the constructor makes, without loading anything (a launcher checks a
  // deployment before it starts the ranks). Throws infera::Error naming `where`.
  static void check_split(const ModelConfig& cfg, int tp, int ep, const std::string& where);
  // check_split for the model at `path` (a Hugging Face directory or a GGUF file), after the
  // tp / ep sizes; for a GGUF file also that each rank's input columns of its row-parallel
  // matrices are whole blocks of their type, from the headers (the binding checks again:
  // columns()).
  static void check_split(const std::string& path, int tp, int ep, bool ep_all_to_all);
  TensorShard(TensorShard&&) = default;
  TensorShard& operator=(TensorShard&&) = default;

  bool tensor_parallel() const { return tp_ > 1; }
  bool expert_parallel() const { return ep_ > 1; }
  bool distributed() const { return plan_.distributed(); }
  int rank() const { return plan_.rank(); }
  bool merged_sync() const { return plan_.merged_sync; }

  // This rank's ranges (whole when the dimension is not split).
  parallel::Range heads;  // attention heads
  parallel::Range kv_heads;  // KV heads (KvPool holds these only)
  parallel::Range ffn;  // dense MLP intermediate columns
  parallel::Range vocab;  // output-head rows
  parallel::Range experts;  // MoE experts this rank computes (ep > 1)
  parallel::Range expert_ffn;  // columns of each expert's intermediate (tp > 1, ep == 1)

  // Column-parallel: output rows r of w (a view in one process, a copy in a group; a
  // whole matrix stays a view unless `own`: expert-parallel ranks own their experts).
  // GGUF matrices: a rank's group binds them without panels (SafetensorsSource::defer_panels)
  // and packs here only the slices it keeps; their panels are then the copy it owns, the rows
  // a view of the file whose pages are dropped.
  kernels::MatRef rows(const kernels::MatRef& w, parallel::Range r, bool own = false);
  kernels::LinearWeight rows(const kernels::LinearWeight& w, parallel::Range r);
  // Row-parallel: input columns c of w, copied once into memory this shard owns. A GGUF
  // matrix's split must fall on its blocks (infera::Error naming `name` otherwise) and the
  // copy is kept as panels only (MatRef::data null) where its type has them.
  // (shared_expert: a MoE's shared expert, for the error's hint)
  kernels::MatRef columns(const kernels::MatRef& w, parallel::Range c, std::string_view name = {},
                          bool shared_expert = false);
  kernels::LinearWeight columns(const kernels::LinearWeight& w, parallel::Range c, bool shared_expert = false);
  // A matrix every rank keeps whole (DeepSeek's latent projections, the shared expert under
  // all-to-all dispatch, the output head without TP): in a group, a GGUF matrix gets the
  // panels binding left out; otherwise w as it is.
  kernels::LinearWeight replicated(const kernels::LinearWeight& w) const;
  kernels::MatRef packed(const kernels::MatRef& w) const;
  static std::vector<float> slice(const std::vector<float>& v, parallel::Range r);
  // Column-parallel over several row ranges, concatenated in the given order (a fused
  // projection whose parts each split by head: GDN's q | k | v rows). A copy this shard
  // owns; the matrix itself when the ranges cover it in order.
  kernels::MatRef rows(const kernels::MatRef& w, const std::vector<parallel::Range>& ranges);
  kernels::LinearWeight rows(const kernels::LinearWeight& w, const std::vector<parallel::Range>& ranges);
  // Rows of a [rows, width] vector-of-rows (a per-channel table such as GDN's conv
  // weights), the same ranges concatenated.
  static std::vector<float> slice_rows(const std::vector<float>& v, int64_t width,
                                       const std::vector<parallel::Range>& ranges);

  // ---- whole blocks (blocks.h) ----
  // Mixture of experts: under EP the experts outside this rank's range are dropped (the
  // router still sees them all), the rest kept whole; under TP without EP each expert's
  // intermediate columns are split. The shared expert's intermediate columns are split
  // over the group either way (its sigmoid gate is per token, so the partial outputs still
  // sum to the whole). The caller all-reduces the block's output.
  void shard_moe(MoeWeights& w);
  // Gated DeltaNet under TP: this rank's key heads and the value heads that read them
  // (value head j reads key head j / r, r = Hv / Hk, so a contiguous range of key heads
  // owns a contiguous range of value heads), with their conv channels, decay and gate
  // rows; out_proj by input columns (row-parallel, all-reduced by the caller). Returns
  // nothing; gdn_dims() gives the local shape the sliced weights have.
  void shard_gdn(GdnWeights& w, const GdnDims& whole);
  // The MoE block over the group, combine included: y[T, H] = MoE(x) on every rank. By
  // default MoeFfn on this rank's experts (or expert columns) and one all-reduce; with
  // plan.ep_all_to_all the all-to-all dispatch of this rank's token range
  // (ExpertDispatch), then an all-gather of the rows. One process: MoeFfn alone.
  void moe(MoeFfn& ffn, const MoeWeights& w, const float* x, int64_t T, int64_t H, float* y, uint64_t* counts);
  GdnDims gdn_dims(const GdnDims& whole) const;  // this rank's heads (whole without TP)
  parallel::Range gdn_key_heads;  // set by the constructor for hybrid models
  parallel::Range gdn_value_heads;

  // Sums the ranks' partial outputs x[n] (row-parallel layers, MoE). No-op when the
  // layer is not split (caller says so with `split`).
  void all_reduce(float* x, int64_t n, bool split = true);

  // x[T, H] = embedding rows of tokens[T]; lookup(token, out) reads one row. Merged sync:
  // every rank reads the rows it needs (only those pages become resident; no collective);
  // otherwise vocabulary-parallel: a rank fills the rows of its vocabulary range and an
  // all-reduce completes them.
  template <typename Lookup>
  void embed(const int32_t* tokens, int64_t T, int64_t H, float* x, Lookup&& lookup) {
    const bool vocab_parallel = tensor_parallel() && !merged_sync();
    for (int64_t t = 0; t < T; ++t) {
      if (!vocab_parallel || vocab.contains(tokens[t])) {
        lookup(tokens[t], x + t * H);
      } else {
        std::fill(x + t * H, x + (t + 1) * H, 0.0f);
      }
    }
    if (vocab_parallel) all_reduce(x, T * H);
  }

  // The output head as this rank keeps it: under TP a GGUF head (not tied to the embeddings)
  // is cut to this rank's vocabulary rows, so their panels are its copy; otherwise
  // replicated(w) (under TP a float head stays whole: each rank reads its rows of the file).
  kernels::LinearWeight head(const kernels::LinearWeight& w);
  // logits[R, V] = rows[R, H] · headᵀ, head the whole vocabulary's rows or this rank's
  // (head()). Tensor parallel: each rank computes its vocabulary
  // rows and rank 0 receives the whole [R, V] (merged sync: gather to rank 0 only; else
  // all-gather, every rank's `logits` filled).
  void logits(const float* rows, int64_t R, const kernels::LinearWeight& head, float* logits);
  void logits(const float* rows, int64_t R, const kernels::MatRef& head, float* logits);

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  uint8_t* allocate(int64_t bytes);
  // A slice of `shape` (data unset) whose rows gather(dst) writes: into memory this shard owns,
  // or, for a GGUF matrix with panels, into a scratch copy they are packed from (the result
  // then holds the panels only, MatRef::data null).
  kernels::MatRef gathered(kernels::MatRef shape, const std::function<void(uint8_t*)>& gather);
  parallel::ParallelPlan plan_;
  int tp_ = 1, ep_ = 1;
  int64_t vocab_size_ = 0;
  std::vector<std::unique_ptr<uint8_t, FreeDeleter>> owned_;  // row-parallel weight copies
  std::vector<float> local_logits_, gathered_;  // [R, Vc], [tp, R, Vc]
  std::vector<int32_t> expert_owner_;  // [E] rank holding each expert
  ExpertDispatch dispatch_;
  std::vector<float> own_rows_, all_rows_;  // [ceil(T/p), H], [p, ceil(T/p), H]
};

// ---- A forward's first and last steps, as the model files take them ----

// x[T, H] = the embeddings of the batch's tokens (ids checked; TensorShard::embed, so a
// rank of a vocabulary-parallel group reads only its rows), their positions [T], and the
// dump's forward begun with "embed".
void embed_batch(TensorShard& shard, const ForwardBatch& batch, int64_t vocab_size, const kernels::LinearWeight& embed,
                 int64_t H, float* x, std::vector<int32_t>& positions, TensorDump* dump);

// logits[R, V] of the final-normed rows [R, H] through the head (TensorShard::logits: rank 0
// has them all under TP), with the dump's "final_norm" and "logits".
void head_logits(TensorShard& shard, const float* rows, int64_t R, int64_t H, const kernels::LinearWeight& head,
                 int64_t vocab_size, float* logits, TensorDump* dump);

}  // namespace infera
