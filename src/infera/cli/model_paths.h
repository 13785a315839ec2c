// Where the built-in default model lives when no -m is given.
#pragma once

#include <string>

namespace infera::cli {

// INFERA_DEFAULT_MODEL if set, else models/infera-default found beside (or above) the
// directory of the running executable. Throws infera::Error with a hint when absent.
std::string default_model_dir();

}  // namespace infera::cli
