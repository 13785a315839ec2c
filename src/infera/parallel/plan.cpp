#include "infera/parallel/plan.h"

#include <algorithm>

#include "infera/base/error.h"

namespace infera::parallel {

Range split_range(int64_t n, int parts, int part) {
  INFERA_ASSERT(parts >= 1 && part >= 0 && part < parts && n >= 0);
  const int64_t base = n / parts, extra = n % parts;
  const int64_t begin = part * base + std::min<int64_t>(part, extra);
  return Range{begin, begin + base + (part < extra ? 1 : 0)};
}

void validate_sizes(int tp, int ep, int world) {
  if (tp < 1 || ep < 1) fail("--tp and --ep must be at least 1 (got {} and {})", tp, ep);
  if (std::max(tp, ep) != world)
    fail("the group has {} ranks but --tp {} --ep {} needs {}; start max(tp, ep) ranks", world, tp, ep,
         std::max(tp, ep));
  if ((tp != 1 && tp != world) || (ep != 1 && ep != world)) {
    fail("--tp {} --ep {}: each must be 1 or the group size {} (attention and experts are split over the same ranks)",
         tp, ep, world);
  }
}

void validate_plan(const ParallelPlan& plan) {
  const int world = plan.world();
  validate_sizes(plan.tp, plan.ep, world);
  if (plan.ep_all_to_all && (plan.ep == 1 || plan.tp != 1)) {
    fail(
        "--ep-dispatch all-to-all needs --ep N without --tp (tokens split across ranks); with tensor-parallel "
        "attention every rank holds every token and the dispatch is local");
  }
}

}  // namespace infera::parallel
