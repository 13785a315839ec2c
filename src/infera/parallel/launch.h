// Starting a group of ranks and checking they agree before any weights are touched.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "infera/parallel/communicator.h"

namespace infera::parallel {

// What a relaunched group does when the launching process gets SIGINT / SIGTERM.
enum class GroupSignals {
  kStop,  // end the group now (infera run)
  kDrain,  // first signal: SIGUSR1 to every rank (mpirun forwards it), which rank 0 of a
           // server takes as "drain, then stop the workers"; a second signal ends the
           // group now (infera serve)
};

// Runs `mpirun -np <ranks> <this binary> <the same arguments>` on this host as a child
// and waits for it: --oversubscribe so more ranks than cores still start, --bind-to none
// so each rank's OpenMP threads may use any core, --allow-run-as-root when running as
// root, --stdin none (infera reads no stdin; mpirun runs in its own process group so
// that a terminal's Ctrl-C reaches only this process, which forwards it as `signals`
// says). The ranks get a private OpenMPI session directory (orte_tmpdir_base), created
// fresh and removed afterwards, so launches running side by side cannot race on the
// shared /tmp/ompi.<host>.<uid>. Returns mpirun's exit status (128 + signal when it was
// killed). Throws infera::Error when mpirun is not on PATH or cannot start. The children
// see OMPI_COMM_WORLD_SIZE and take the MPI path. For several hosts run mpirun yourself
// (docs/parallel.md).
int run_under_mpirun(int ranks, GroupSignals signals);

// A hash of what a rank sees of the model directory: config.json's bytes and the names
// and sizes of the weight files (*.safetensors, the shard index); of a GGUF file, its name and
// size, or those of gguf_parts (every part of a split file) where given. Cheap: no weight
// bytes are read.
uint64_t model_files_fingerprint(const std::string& model_dir, const std::vector<std::string>& gguf_parts = {});

// The files of the GGUF model at a path (a split one's parts, gguf::split_paths; parallel/
// does not read GGUF names itself). Throws infera::Error when a part is missing.
using GgufParts = std::function<std::vector<std::string>(const std::string&)>;

// All-gathers every rank's fingerprint of `model_dir` and throws infera::Error naming the
// ranks whose files differ from rank 0's (same on every rank, so all ranks stop together).
// gguf_parts is called inside, so that a rank missing a part reports it after the collective.
void check_same_model_files(Communicator& comm, const std::string& model_dir, const GgufParts& gguf_parts = {});

// This process's peak resident set (VmHWM) and current resident set (VmRSS), KiB; -1
// when /proc is unavailable.
int64_t peak_rss_kib();
int64_t current_rss_kib();

// For an error one rank caught: prints "error: rank R of N: <what>" and ends the whole
// group (the other ranks may be waiting in a collective for this one).
void abort_group_after_error(Communicator& comm, const char* what);

}  // namespace infera::parallel
