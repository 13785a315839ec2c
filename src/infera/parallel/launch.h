// Starting a group of ranks and checking they agree before any weights are touched.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "infera/parallel/communicator.h"

namespace infera::parallel {

// Replaces this process with `mpirun -np <ranks> <this binary> <the same arguments>` on
// this host (--oversubscribe so more ranks than cores still start, --bind-to none so each
// rank's OpenMP threads may use any core, --allow-run-as-root when running as root). The
// children see OMPI_COMM_WORLD_SIZE and take the MPI path. Throws infera::Error when
// mpirun is not on PATH or exec fails. For several hosts run mpirun yourself
// (docs/parallel.md).
[[noreturn]] void relaunch_under_mpirun(int ranks);

// A hash of what a rank sees of the model directory: config.json's bytes and the names
// and sizes of the weight files (*.safetensors, the shard index). Cheap: no weight bytes
// are read.
uint64_t model_files_fingerprint(const std::string& model_dir);

// All-gathers every rank's fingerprint of `model_dir` and throws infera::Error naming the
// ranks whose files differ from rank 0's (same on every rank, so all ranks stop together).
void check_same_model_files(Communicator& comm, const std::string& model_dir);

// This process's peak resident set (VmHWM) and current resident set (VmRSS), KiB; -1
// when /proc is unavailable.
int64_t peak_rss_kib();
int64_t current_rss_kib();

}  // namespace infera::parallel
