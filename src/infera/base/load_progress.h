// How far a model's load has come: what the loaders report while a model loads, and what
// the server shows (/v1/stats, the status page) while it does.
//
// A load runs as planned steps, each over a known amount of work in bytes: "reading" the
// weight files into memory (--no-mmap), "converting" a GGUF file's tensors, "binding" the
// weights to the model (quantized layers are repacked then), and the server's "starting"
// the engine. Each planned step is an equal share of the whole, so the fraction moves
// monotonically from 0 to 1 and reaches 1 when every planned step has ended. Loaders plan
// their steps before the first one begins; a step's work grows the fraction only within
// its share, so work reported past a step's total (a tensor bound twice) changes nothing.
//
// Thread-safe: the loading thread reports, any thread reads a snapshot.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>

namespace infera {

class LoadProgress {
 public:
  struct Snapshot {
    std::string step;  // the current (or last) step's name; "" before the first
    int64_t done = 0;  // bytes of the current step done
    int64_t total = 0;  // bytes of the current step
    int steps_done = 0;  // planned steps that have ended
    int steps = 0;  // planned steps
    double fraction = 0;  // of the whole load, 0..1
  };
  // on_update, when given, sees every new snapshot, in order, on the reporting thread and
  // with the progress locked (it must not call back into this object).
  explicit LoadProgress(std::function<void(const Snapshot&)> on_update = {});

  // Adds `steps` steps to the plan; call before the first step begins.
  void plan(int steps);
  // Begins the next step: `total` bytes of work. The previous step, if still open, ends.
  void begin(std::string_view step, int64_t total);
  // `bytes` more of the current step are done (clamped to its total).
  void advance(int64_t bytes);
  // The current step ends (all of its work counts as done).
  void end();

  Snapshot snapshot() const;

 private:
  double fraction_locked() const;
  void publish_locked();

  mutable std::mutex mutex_;
  std::function<void(const Snapshot&)> on_update_;
  Snapshot s_;
  bool open_ = false;  // a step has begun and not ended
};

}  // namespace infera
