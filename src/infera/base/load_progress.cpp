#include "infera/base/load_progress.h"

#include <algorithm>

namespace infera {

LoadProgress::LoadProgress(std::function<void(const Snapshot&)> on_update) : on_update_(std::move(on_update)) {}

void LoadProgress::plan(int steps) {
  std::lock_guard lock(mutex_);
  s_.steps += std::max(steps, 0);
  publish_locked();
}

void LoadProgress::begin(std::string_view step, int64_t total) {
  std::lock_guard lock(mutex_);
  if (open_) ++s_.steps_done;
  open_ = true;
  s_.step = step;
  s_.total = std::max<int64_t>(total, 0);
  s_.done = 0;
  publish_locked();
}

void LoadProgress::advance(int64_t bytes) {
  std::lock_guard lock(mutex_);
  if (!open_ || bytes <= 0 || s_.done >= s_.total) return;
  s_.done = std::min(s_.total, s_.done + bytes);
  publish_locked();
}

void LoadProgress::end() {
  std::lock_guard lock(mutex_);
  if (!open_) return;
  open_ = false;
  s_.done = s_.total;
  ++s_.steps_done;
  publish_locked();
}

LoadProgress::Snapshot LoadProgress::snapshot() const {
  std::lock_guard lock(mutex_);
  return s_;
}

double LoadProgress::fraction_locked() const {
  if (s_.steps <= 0) return 0;
  double steps = s_.steps_done;
  if (open_ && s_.total > 0) steps += static_cast<double>(s_.done) / static_cast<double>(s_.total);
  return std::min(1.0, steps / s_.steps);
}

void LoadProgress::publish_locked() {
  // A step planned after others ended would lower the fraction: it never goes back.
  s_.fraction = std::max(s_.fraction, fraction_locked());
  if (on_update_) on_update_(s_);
}

}  // namespace infera
