// Error model: INFERA_ASSERT for broken invariants (a bug in Infera), infera::Error for
// everything a user or a file can cause. Errors carry one clear message naming the thing
// and, where there is one, the fix.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace infera {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

[[noreturn]] void assert_failed(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace infera

#define INFERA_ASSERT(cond, ...)                                                                 \
  do {                                                                                           \
    if (!(cond)) ::infera::assert_failed(#cond, __FILE__, __LINE__, ::std::string{__VA_ARGS__}); \
  } while (0)
