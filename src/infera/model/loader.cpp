#include <map>
#include <string>

#include <fmt/format.h>

#include "infera/base/error.h"
#include "infera/base/load_progress.h"
#include "infera/base/log.h"
#include "infera/base/timer.h"
#include "infera/io/safetensors.h"
#include "infera/model/arch_registry.h"
#include "infera/model/gguf_loader.h"
#include "infera/model/model.h"
#include "infera/model/prequant.h"
#include "infera/model/weights.h"

namespace infera {

int32_t ForwardBatch::num_logit_rows() const {
  int32_t r = 0;
  for (const SeqChunk& s : seqs) r += s.all_logits ? s.n_tokens : (s.last_logits ? 1 : 0);
  return r;
}

std::unique_ptr<Model> load_model(const std::string& dir, const LoadOptions& options) {
  Timer timer;
  ModelConfig cfg = load_model_config(dir);
  const bool gguf = is_gguf_path(dir);
  // A group splits the Gated DeltaNet projections by Hugging Face's value-head ranges: the
  // GGUF loader moves them into that order (a copy) instead of leaving them tiled.
  if (options.parallel.distributed()) cfg.gdn_value_heads_tiled = false;
  LoadProgress* progress = options.progress.get();
  // A published pre-quantized checkpoint (FP8, compressed-tensors, ...) binds through its
  // format, converted to the native schemes (model/prequant.h). Format detection reads only
  // JSON files, so the plan is known before any weight file is read.
  const bool prequantized = !gguf && detect_prequant(dir) != nullptr;
  if (progress) progress->plan((options.load_into_memory ? 1 : 0) + (gguf ? 1 : 0) + 1);
  std::unique_ptr<PrequantSource> prequant =
      prequantized ? PrequantSource::open(dir, options.load_into_memory, progress) : nullptr;
  // A GGUF file (llama.cpp's format) binds like a checkpoint directory: its tensors under
  // their Hugging Face names (model/gguf_loader.h).
  std::unique_ptr<SafetensorsSource> source;
  if (!prequant) {
    source = gguf ? std::make_unique<SafetensorsSource>(open_gguf_weights(dir, cfg, options.load_into_memory, progress),
                                                        QuantizationConfig{})
                  : SafetensorsSource::open(dir, options.load_into_memory, progress);
  }
  const WeightStore& store = prequant ? prequant->store() : source->store();
  const size_t mapped = store.mapped_bytes();
  // "bf16" or "f32+bf16": the dtypes the weights are stored (and computed) in.
  std::map<std::string, size_t> dtype_bytes;
  for (const auto& name : store.names()) {
    const TensorInfo& t = store.get(name);
    dtype_bytes[std::string(dtype_name(t.dtype))] += t.nbytes;
  }
  std::string dtypes;
  for (const auto& [name, bytes] : dtype_bytes) dtypes += (dtypes.empty() ? "" : "+") + name;
  const ArchInfo& info = arch_info(cfg.arch);
  if (!info.runnable()) {
    fail("{}: architecture '{}' is recognised but not implemented yet (supported: {})", dir, cfg.model_type,
         runnable_arch_names());
  }
  // The model file binds its weights by role from the architecture's tensor table.
  std::unique_ptr<Model> model;
  if (prequant) {
    prequant->set_plain_fallback(info.traits.plain_fallback);
    const PrequantSource* pq = prequant.get();  // the model keeps it alive
    ModelWeights weights(cfg, std::move(prequant));
    weights.report_progress(options.progress);
    model = info.create(cfg, std::move(weights), options);
    const PrequantStats st = pq->stats();
    LOG_INFO(
        "{}: {}: {} weights converted to native schemes ({} exact, {} in place), {:.1f} MiB stored -> {:.1f} MiB{}",
        dir, pq->format().summary(), st.weights, st.exact, st.in_place, st.stored_bytes / 1048576.0,
        st.native_bytes / 1048576.0,
        st.weights > st.exact
            ? fmt::format("; requantized: worst |W - W'| / max|W row| {:.4f} ({})", st.max_rel_error, st.worst)
            : std::string());
  } else {
    source->set_plain_fallback(info.traits.plain_fallback);
    if (options.parallel.distributed()) source->defer_panels();
    ModelWeights weights(cfg, std::move(source));
    weights.report_progress(options.progress);
    model = info.create(cfg, std::move(weights), options);
  }
  if (progress) progress->end();
  LOG_INFO("loaded {} ({}): {} layers, hidden {}, {:.2f} M parameters, {}, {:.1f} MiB {} in {:.2f} s", dir,
           arch_name(cfg.arch), cfg.num_layers, cfg.hidden_size, model->num_parameters() / 1e6, dtypes,
           mapped / 1048576.0, options.load_into_memory ? "read into memory" : "mapped", timer.seconds());
  return model;
}

}  // namespace infera
