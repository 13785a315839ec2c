// The pre-quantized formats detect_prequant() knows (model/prequant.h), one factory each,
// defined in the format's own file (model/prequant_<format>.cpp). A factory parses and checks
// the format's config once; it throws infera::Error naming the file and the field for a
// variant it does not support.
#pragma once

#include <memory>

#include "infera/model/prequant.h"

namespace infera {}  // namespace infera
