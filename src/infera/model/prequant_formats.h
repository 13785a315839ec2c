// The pre-quantized formats detect_prequant() knows (model/prequant.h), one factory each,
// defined in the format's own file (model/prequant_<format>.cpp). A factory parses and checks
// the format's config once; it throws infera::Error naming the file and the field for a
// variant it does not support.
#pragma once

#include <memory>

#include "infera/model/prequant.h"

namespace infera {

// quant_method "fp8" (model/prequant_fp8.cpp).
std::unique_ptr<PrequantFormat> make_fp8_format(const PrequantFiles& files);
// quant_method "compressed-tensors" (model/prequant_ct.cpp).
std::unique_ptr<PrequantFormat> make_compressed_tensors_format(const PrequantFiles& files);
// GPTQ (quant_method "gptq") and AWQ ("awq"), int4: model/prequant_gptq.cpp.
std::unique_ptr<PrequantFormat> make_gptq_format(const PrequantFiles& files);
// Ascend msModelSlim (quant_model_description.json, no quantization_config): model/prequant_modelslim.cpp.
std::unique_ptr<PrequantFormat> make_modelslim_format(const PrequantFiles& files);

}  // namespace infera
