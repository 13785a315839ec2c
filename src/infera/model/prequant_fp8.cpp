// quant_method "fp8": float8 e4m3fn weights with float scales (DeepSeek-V3/R1, Qwen3-FP8,
// Kimi-K2; docs/quantization.md "FP8"). Per weight "<m>.weight" F8_E4M3 [O, I] and
//   block ("weight_block_size": [bn, bk]): <m>.weight_scale_inv [ceil(O/bn), ceil(I/bk)],
//     W[i, j] = w[i, j] * scale_inv[i / bn, j / bk] (multiplied, despite the name);
//   otherwise <m>.weight_scale (or weight_scale_inv): one value (per tensor) or [O] / [O, 1]
//     (per channel).
// Scales in any float dtype. A static scheme's <m>.input_scale is read by nothing (Infera
// quantizes activations per token). Which matrices are FP8 is what the files store (every
// F8_E4M3 matrix has a scale); ignored_layers / modules_to_not_convert name the others and
// `infera check` reports a disagreement.
#include <fmt/format.h>

#include "infera/base/error.h"
#include "infera/model/prequant_formats.h"

namespace infera {

namespace {

using json = nlohmann::json;

struct Fp8State {
  const TensorInfo* weight = nullptr;
  const TensorInfo* scale = nullptr;
  enum class Grain { kTensor, kChannel, kBlock } grain = Grain::kTensor;
  int64_t bn = 0, bk = 0;  // block
  int64_t scale_rows = 0, scale_cols = 0;  // block grid per expert
};

class Fp8Format final : public PrequantFormat {
 public:
  explicit Fp8Format(const PrequantFiles& files) {
    const json& qc = files.quantization_config;
    const std::string where = files.dir + "/config.json: quantization_config";
    activation_scheme_ = qc.value("activation_scheme", std::string("dynamic"));
    if (activation_scheme_ != "dynamic" && activation_scheme_ != "static")
      fail("{}.activation_scheme '{}' is not 'dynamic' or 'static'", where, activation_scheme_);
    const std::string fmt_name = qc.value("fmt", std::string("e4m3"));
    if (fmt_name != "e4m3") fail("{}.fmt '{}' is not supported (only e4m3 weights)", where, fmt_name);
    if (auto it = qc.find("weight_block_size"); it != qc.end() && !it->is_null()) {
      if (!it->is_array() || it->size() != 2 || !(*it)[0].is_number_integer() || !(*it)[1].is_number_integer() ||
          (*it)[0].get<int64_t>() <= 0 || (*it)[1].get<int64_t>() <= 0) {
        fail("{}.weight_block_size must be two positive integers [rows, cols], got {}", where, it->dump());
      }
      bn_ = (*it)[0].get<int64_t>();
      bk_ = (*it)[1].get<int64_t>();
    }
    for (const char* key : {"ignored_layers", "modules_to_not_convert"}) {
      if (auto it = qc.find(key); it != qc.end() && it->is_array()) {
        for (const auto& e : *it) {
          if (e.is_string()) ignored_.push_back(e.get<std::string>());
        }
      }
    }
  }

  std::string method() const override { return "fp8"; }

  std::string summary() const override {
    return fmt::format("fp8 e4m3, {}, {} activations",
                       bn_ > 0 ? fmt::format("block {}x{}", bn_, bk_) : std::string("per tensor / per channel"),
                       activation_scheme_);
  }

  bool quantizes(const WeightStore& store, const std::string& name) const override {
    const TensorInfo* t = store.find(name);
    return t != nullptr && t->dtype == DType::kF8E4M3;
  }

  // Whether config.json lists the module as left unquantized (for `infera check`).
  bool ignored(const std::string& name) const {
    const std::string m = prequant_module(name);
    for (const std::string& e : ignored_) {
      if (m == e || m.ends_with("." + e) || m.starts_with(e + ".")) return true;
    }
    return false;
  }

  StoredLinear locate(const WeightStore& store, const std::string& name, int64_t experts, int64_t rows,
                      int64_t cols) const override {
    // A fused expert tensor ("...mlp.experts.gate_up_proj", Qwen3.5's FP8 release) keeps its
    // scales under "<name>.weight_scale_inv".
    const std::string m = prequant_module(name).empty() ? name : prequant_module(name);
    auto st = std::make_shared<Fp8State>();
    const bool fused = experts > 1;
    std::vector<int64_t> wshape = {rows, cols};
    if (fused) wshape.insert(wshape.begin(), experts);
    st->weight = &prequant_need(store, name, "an fp8 checkpoint stores every quantized matrix");
    prequant_expect(store, *st->weight, {DType::kF8E4M3}, wshape);
    const char* primary = bn_ > 0 ? ".weight_scale_inv" : ".weight_scale";
    const char* other = bn_ > 0 ? ".weight_scale" : ".weight_scale_inv";
    st->scale = store.find(m + primary);
    if (st->scale == nullptr) st->scale = store.find(m + other);
    if (st->scale == nullptr) {
      prequant_fail(store, m + primary,
                    fmt::format("is missing ('{}' is float8 e4m3 and needs its scale{})", name,
                                bn_ > 0 ? fmt::format(", a [{}, {}] grid", ceil_div(rows, bn_), ceil_div(cols, bk_))
                                        : std::string()));
    }
    const TensorInfo& s = *st->scale;
    if (s.dtype != DType::kF32 && s.dtype != DType::kBF16 && s.dtype != DType::kF16)
      prequant_fail(store, s.name, fmt::format("has dtype {}, expected a float scale", dtype_name(s.dtype)));
    StoredLinear w;
    w.name = name;
    w.kind = PrequantKind::kFloat;
    w.bits = 8;
    w.experts = experts;
    w.rows = rows;
    w.cols = cols;
    // The scale's shape per expert (a fused tensor's scales lead with E).
    std::vector<int64_t> per = s.shape;
    if (fused) {
      if (per.empty() || per[0] != experts)
        prequant_fail(store, s.name,
                      fmt::format("has shape {}, expected the {} experts first", shape_string(s.shape), experts));
      per.erase(per.begin());
    }
    int64_t n = 1;
    for (int64_t d : per) n *= d;
    if (bn_ > 0) {
      st->grain = Fp8State::Grain::kBlock;
      st->bn = bn_;
      st->bk = bk_;
      st->scale_rows = ceil_div(rows, bn_);
      st->scale_cols = ceil_div(cols, bk_);
      std::vector<int64_t> want = {st->scale_rows, st->scale_cols};
      if (per != want) {
        if (fused) want.insert(want.begin(), experts);
        prequant_fail(store, s.name,
                      fmt::format("has shape {}, expected {} (weight [{}, {}] in blocks of {}x{}, weight_block_size)",
                                  shape_string(s.shape), shape_string(want), rows, cols, bn_, bk_));
      }
      w.label = fmt::format("fp8 block {}x{}", bn_, bk_);
      w.fp8_group = bk_;
    } else if (n == 1 && per.size() <= 1) {
      st->grain = Fp8State::Grain::kTensor;
      w.label = "fp8 per tensor";
      w.fp8_group = cols;
    } else if (per == std::vector<int64_t>{rows} || per == std::vector<int64_t>{rows, 1}) {
      st->grain = Fp8State::Grain::kChannel;
      w.label = "fp8 per channel";
      w.fp8_group = cols;
    } else {
      prequant_fail(store, s.name,
                    fmt::format("has shape {}: expected one value (per tensor) or [{}] / [{}, 1] (per channel) for "
                                "'{}' [{}, {}] (no weight_block_size in config.json)",
                                shape_string(s.shape), rows, rows, name, rows, cols));
    }
    w.parts["weight"] = st->weight;
    w.parts["weight_scale"] = st->scale;
    w.state = st;
    return w;
  }

  void dequantize_rows(const StoredLinear& w, int64_t r0, int64_t r1, float* out) const override {
    const auto& st = *static_cast<const Fp8State*>(w.state.get());
    const uint8_t* wd = st.weight->data;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t e = r / w.rows, rr = r % w.rows;
      const uint8_t* row = wd + r * w.cols;
      float* o = out + (r - r0) * w.cols;
      switch (st.grain) {
        case Fp8State::Grain::kTensor: {
          const float s = prequant_scalar(*st.scale, e);
          for (int64_t c = 0; c < w.cols; ++c) o[c] = fp8_e4m3_to_f32(row[c]) * s;
          break;
        }
        case Fp8State::Grain::kChannel: {
          const float s = prequant_scalar(*st.scale, e * w.rows + rr);
          for (int64_t c = 0; c < w.cols; ++c) o[c] = fp8_e4m3_to_f32(row[c]) * s;
          break;
        }
        case Fp8State::Grain::kBlock: {
          const int64_t base = (e * st.scale_rows + rr / st.bn) * st.scale_cols;
          for (int64_t c = 0; c < w.cols; ++c)
            o[c] = fp8_e4m3_to_f32(row[c]) * prequant_scalar(*st.scale, base + c / st.bk);
          break;
        }
      }
    }
  }

  void fp8_scales(const StoredLinear& w, float* out) const override {
    const auto& st = *static_cast<const Fp8State*>(w.state.get());
    const int64_t ng = (w.cols + w.fp8_group - 1) / w.fp8_group;
    for (int64_t r = 0; r < w.total_rows(); ++r) {
      const int64_t e = r / w.rows, rr = r % w.rows;
      for (int64_t g = 0; g < ng; ++g) {
        const int64_t i = st.grain == Fp8State::Grain::kTensor ? e
                          : st.grain == Fp8State::Grain::kChannel
                              ? e * w.rows + rr
                              : (e * st.scale_rows + rr / st.bn) * st.scale_cols + g;
        out[r * ng + g] = prequant_scalar(*st.scale, i);
      }
    }
  }

  bool is_auxiliary(const std::string& tensor_name) const override {
    return tensor_name.ends_with(".input_scale") || tensor_name.ends_with(".activation_scale");
  }

 private:
  static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

  std::string activation_scheme_;
  int64_t bn_ = 0, bk_ = 0;
  std::vector<std::string> ignored_;
};

}  // namespace

std::unique_ptr<PrequantFormat> make_fp8_format(const PrequantFiles& files) {
  return std::make_unique<Fp8Format>(files);
}

}  // namespace infera
