// The prefix cache's disk tier over the ranks of a group (--tp/--ep, docs/parallel.md).
//
// Each rank keeps its own shard of every KV block (its KV heads), so each rank writes and
// reads its own files: rank r of N uses the folder shard_dir(dir, r, N) under the disk
// tier's directory, with a fingerprint that names the rank and the group size besides the
// model (shard_fingerprint), and 1/N of the size limit. Rank 0's entries also carry the
// recurrent-state checkpoints, which it keeps whole (StateTransfer).
//
// Rank 0's engine decides everything and tells the other ranks through the model's
// GroupChannel (DiskShards, on rank 0); their handler (DiskShardWorker) acts on its shard:
//   spill    an evicted block's shard is queued for writing (each rank's writer thread)
//   read     a prompt's prefix is read by each rank's reader thread, as on rank 0
//   take     once rank 0's read is done, each rank waits for its own and reports which
//            entries it read whole (a gather): an entry any rank lacks or found corrupt is
//            a miss on every rank, so the ranks never diverge
//   install  the entries rank 0 loaded, with the block ids it gave them, are copied into
//            each rank's KV pool
//   drop     the request ended while its prefix was read
// Messages travel between forwards, in rank 0's order, so every rank sees the same
// sequence of blocks evicted and loaded.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "infera/model/kv_pool.h"
#include "infera/model/model.h"
#include "infera/runtime/disk_cache.h"

namespace infera {

// Block `block`'s K/V bytes of every layer (KvPool::bytes_per_block) out of `pool`, or into it.
void copy_kv_block_out(const KvPool& pool, int32_t block, uint8_t* out);
void copy_kv_block_in(KvPool& pool, int32_t block, const uint8_t* in);

// The folder of rank `rank` of a group of `ranks` under the disk tier's directory.
std::string shard_dir(const std::string& dir, int rank, int ranks);
// The entries' fingerprint on that rank: the model's, the rank and the group size.
uint64_t shard_fingerprint(uint64_t fingerprint, int rank, int ranks);

// Rank 0's side: posts each step of the disk tier to the other ranks.
class DiskShards {
 public:
  // Tells the other ranks to open their shard folders (each with max_bytes of the disk).
  DiskShards(GroupChannel& channel, const KvPool& kv, const std::string& dir, int64_t max_bytes, uint64_t fingerprint);
  void spill(int32_t block, uint64_t hash, std::span<const int32_t> tokens, bool wait);
  void read(uint64_t ticket, const std::vector<uint64_t>& hashes);
  // Which of `hashes` (read whole on rank 0) every other rank read whole too.
  std::vector<bool> take(uint64_t ticket, const std::vector<uint64_t>& hashes);
  // The entries rank 0 loaded into blocks (hash, block): every rank copies its shard in.
  void install(const std::vector<std::pair<uint64_t, int32_t>>& loaded);
  void drop(uint64_t ticket);

 private:
  GroupChannel& channel_;
  const KvPool& kv_;
  std::vector<int32_t> words_;
};

// The other ranks' side: run_parallel_worker's message handler.
class DiskShardWorker {
 public:
  void handle(const std::vector<int32_t>& words, KvPool& kv, parallel::Communicator& comm);

 private:
  std::unique_ptr<DiskCache> disk_;  // null until opened, or when the folder cannot be used
  std::unordered_map<uint64_t, uint64_t> tickets_;  // rank 0's read ticket -> this rank's (0: in stash_)
  std::unordered_map<uint64_t, std::vector<DiskCacheEntry>> stash_;  // reads done, by rank 0's ticket
  std::unordered_map<uint64_t, DiskCacheEntry> taken_;  // read whole at the last take, until install
};

}  // namespace infera
