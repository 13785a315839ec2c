#include "infera/runtime/disk_shards.h"

#include <xxhash.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "infera/base/error.h"
#include "infera/base/log.h"
#include "infera/parallel/communicator.h"

namespace infera {

namespace {

// The messages' first word.
enum Op : int32_t { kOpen = 1, kSpill = 2, kRead = 3, kTake = 4, kInstall = 5, kDrop = 6 };

void push64(std::vector<int32_t>& w, uint64_t v) {
  w.push_back(static_cast<int32_t>(static_cast<uint32_t>(v)));
  w.push_back(static_cast<int32_t>(static_cast<uint32_t>(v >> 32)));
}

uint64_t read64(const std::vector<int32_t>& w, size_t at) {
  if (at + 1 >= w.size()) fail("a disk tier message from rank 0 is too short (mismatched infera versions?)");
  return static_cast<uint64_t>(static_cast<uint32_t>(w[at])) |
         (static_cast<uint64_t>(static_cast<uint32_t>(w[at + 1])) << 32);
}

int32_t word(const std::vector<int32_t>& w, size_t at) {
  if (at >= w.size()) fail("a disk tier message from rank 0 is too short (mismatched infera versions?)");
  return w[at];
}

// A read or a take: the op, the ticket, then the entries' hashes.
void pack_hashes(std::vector<int32_t>& w, Op op, uint64_t ticket, const std::vector<uint64_t>& hashes) {
  w = {op};
  push64(w, ticket);
  w.push_back(static_cast<int32_t>(hashes.size()));
  for (uint64_t h : hashes) push64(w, h);
}

std::pair<uint64_t, std::vector<uint64_t>> unpack_hashes(const std::vector<int32_t>& w) {
  const uint64_t ticket = read64(w, 1);
  const int32_t n = word(w, 3);
  std::vector<uint64_t> hashes;
  for (int32_t i = 0; i < n; ++i) hashes.push_back(read64(w, static_cast<size_t>(4 + 2 * i)));
  return {ticket, std::move(hashes)};
}

// Calls `move(pool_base, bytes)` for each of the block's parts, in the entries' order.
template <typename Pool, typename Move>
void for_each_part(Pool& pool, Move&& move) {
  const KvPoolShape& s = pool.shape();
  const size_t data = static_cast<size_t>(s.n_kv_heads * s.block_size * s.head_dim) * dtype_size(s.dtype);
  const size_t scales = s.dtype == DType::kI8 ? static_cast<size_t>(s.n_kv_heads * s.block_size) * sizeof(float) : 0;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    move(pool.k_data(l), data);
    move(pool.v_data(l), data);
    if (scales > 0) {
      move(pool.k_scales(l), scales);
      move(pool.v_scales(l), scales);
    }
  }
}

}  // namespace

void copy_kv_block_out(const KvPool& pool, int32_t block, uint8_t* out) {
  for_each_part(pool, [&](const void* base, size_t n) {
    std::memcpy(out, static_cast<const uint8_t*>(base) + static_cast<size_t>(block) * n, n);
    out += n;
  });
}

void copy_kv_block_in(KvPool& pool, int32_t block, const uint8_t* in) {
  for_each_part(pool, [&](void* base, size_t n) {
    std::memcpy(static_cast<uint8_t*>(base) + static_cast<size_t>(block) * n, in, n);
    in += n;
  });
}

std::string shard_dir(const std::string& dir, int rank, int ranks) {
  return (std::filesystem::path(dir) / fmt::format("rank{}of{}", rank, ranks)).string();
}

uint64_t shard_fingerprint(uint64_t fingerprint, int rank, int ranks) {
  const int64_t parts[] = {rank, ranks, 2 /* sharded entries */};
  return XXH3_64bits_withSeed(parts, sizeof(parts), fingerprint);
}

// ---- Rank 0 ----

DiskShards::DiskShards(GroupChannel& channel, const KvPool& kv, const std::string& dir, int64_t max_bytes,
                       uint64_t fingerprint)
    : channel_(channel), kv_(kv) {
  words_ = {kOpen};
  push64(words_, static_cast<uint64_t>(max_bytes));
  push64(words_, fingerprint);
  words_.push_back(static_cast<int32_t>(dir.size()));
  for (size_t i = 0; i < dir.size(); i += 4) {
    uint32_t packed = 0;
    std::memcpy(&packed, dir.data() + i, std::min<size_t>(4, dir.size() - i));
    words_.push_back(static_cast<int32_t>(packed));
  }
  channel_.post(words_, kv_);
}

void DiskShards::spill(int32_t block, uint64_t hash, std::span<const int32_t> tokens, bool wait) {
  words_ = {kSpill, wait ? 1 : 0, block};
  push64(words_, hash);
  words_.push_back(static_cast<int32_t>(tokens.size()));
  words_.insert(words_.end(), tokens.begin(), tokens.end());
  channel_.post(words_, kv_);
}

void DiskShards::read(uint64_t ticket, const std::vector<uint64_t>& hashes) {
  pack_hashes(words_, kRead, ticket, hashes);
  channel_.post(words_, kv_);
}

std::vector<bool> DiskShards::take(uint64_t ticket, const std::vector<uint64_t>& hashes) {
  pack_hashes(words_, kTake, ticket, hashes);
  channel_.post(words_, kv_);
  parallel::Communicator& comm = channel_.comm();
  const size_t n = hashes.size();
  const std::vector<uint8_t> mine(n, 1);
  std::vector<uint8_t> all(n * static_cast<size_t>(comm.size()));
  if (n > 0) comm.gather(mine.data(), static_cast<int64_t>(n), all.data(), 0);
  std::vector<bool> whole(n, true);
  for (size_t r = 0; r < static_cast<size_t>(comm.size()); ++r) {
    for (size_t i = 0; i < n; ++i) whole[i] = whole[i] && all[r * n + i] != 0;
  }
  return whole;
}

void DiskShards::install(const std::vector<std::pair<uint64_t, int32_t>>& loaded) {
  words_ = {kInstall, static_cast<int32_t>(loaded.size())};
  for (const auto& [hash, block] : loaded) {
    push64(words_, hash);
    words_.push_back(block);
  }
  channel_.post(words_, kv_);
}

void DiskShards::drop(uint64_t ticket) {
  words_ = {kDrop};
  push64(words_, ticket);
  channel_.post(words_, kv_);
}

// ---- The other ranks ----

void DiskShardWorker::handle(const std::vector<int32_t>& w, KvPool& kv, parallel::Communicator& comm) {
  switch (word(w, 0)) {
    case kOpen: {
      const auto max_bytes = static_cast<int64_t>(read64(w, 1));
      const uint64_t fingerprint = read64(w, 3);
      const int32_t len = word(w, 5);
      if (len < 0 || static_cast<size_t>(6 + (len + 3) / 4) > w.size()) fail("a bad disk tier message from rank 0");
      std::string dir(static_cast<size_t>(len), '\0');
      for (int32_t i = 0; i < len; i += 4) {
        const auto packed = static_cast<uint32_t>(w[static_cast<size_t>(6 + i / 4)]);
        std::memcpy(dir.data() + i, &packed, static_cast<size_t>(std::min(4, len - i)));
      }
      disk_.reset();
      tickets_.clear();
      stash_.clear();
      taken_.clear();
      try {
        disk_ = std::make_unique<DiskCache>(shard_dir(dir, comm.rank(), comm.size()), max_bytes,
                                            shard_fingerprint(fingerprint, comm.rank(), comm.size()));
      } catch (const std::exception& e) {
        // Every read of this rank misses, so every rank misses: slower, never wrong.
        LOG_WARN("rank {}: the prefix cache's disk tier is off on this rank: {}", comm.rank(), e.what());
      }
      return;
    }
    case kSpill: {
      const bool wait = word(w, 1) != 0;
      const int32_t block = word(w, 2);
      const uint64_t hash = read64(w, 3);
      const int32_t n = word(w, 5);
      if (n < 0 || static_cast<size_t>(6 + n) > w.size() || block < 0 || block >= kv.shape().num_blocks)
        fail("a bad disk tier message from rank 0");
      if (!disk_ || disk_->contains(hash)) return;
      DiskCacheEntry e;
      e.hash = hash;
      e.tokens.assign(w.begin() + 6, w.begin() + 6 + n);
      e.kv.resize(static_cast<size_t>(kv.bytes_per_block()));
      copy_kv_block_out(kv, block, e.kv.data());
      disk_->put(std::move(e), wait);
      return;
    }
    case kRead: {
      auto [ticket, hashes] = unpack_hashes(w);
      if (disk_) tickets_[ticket] = disk_->read_async(std::move(hashes));
      return;
    }
    case kTake: {
      const auto [ticket, hashes] = unpack_hashes(w);
      const auto n = static_cast<int32_t>(hashes.size());
      // Rank 0's read of the same entries is done; this rank's ran at the same time.
      std::vector<DiskCacheEntry> entries;
      if (disk_ && tickets_.contains(ticket)) {
        for (;;) {
          // Reads done for other tickets are taken aside: the reader starts the next prefix
          // only while what was read and not taken stays under its limit.
          for (auto& [t, own] : tickets_) {
            if (own == 0) continue;
            if (std::optional<std::vector<DiskCacheEntry>> done = disk_->take_read(own)) {
              stash_[t] = std::move(*done);
              own = 0;
            }
          }
          if (tickets_.at(ticket) == 0) break;
          if (disk_->wait_read(std::chrono::milliseconds(10)))
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        entries = std::move(stash_[ticket]);
        stash_.erase(ticket);
        tickets_.erase(ticket);
      }
      taken_.clear();
      for (DiskCacheEntry& e : entries) {
        if (e.kv.size() == static_cast<size_t>(kv.bytes_per_block())) taken_[e.hash] = std::move(e);
      }
      std::vector<uint8_t> mine(static_cast<size_t>(n), 0);
      for (int32_t i = 0; i < n; ++i) mine[static_cast<size_t>(i)] = taken_.contains(hashes[static_cast<size_t>(i)]);
      if (n > 0) comm.gather(mine.data(), n, nullptr, 0);
      return;
    }
    case kInstall: {
      const int32_t n = word(w, 1);
      for (int32_t i = 0; i < n; ++i) {
        const uint64_t hash = read64(w, static_cast<size_t>(2 + 3 * i));
        const int32_t block = word(w, static_cast<size_t>(4 + 3 * i));
        const auto it = taken_.find(hash);
        // Rank 0 installs only what every rank reported read whole.
        if (it == taken_.end() || block < 0 || block >= kv.shape().num_blocks)
          fail("rank {}: rank 0 installs a disk entry this rank did not read", comm.rank());
        copy_kv_block_in(kv, block, it->second.kv.data());
      }
      taken_.clear();
      return;
    }
    case kDrop: {
      const uint64_t ticket = read64(w, 1);
      const auto it = tickets_.find(ticket);
      if (it == tickets_.end()) return;
      if (disk_ && it->second != 0) disk_->drop_read(it->second);
      tickets_.erase(it);
      stash_.erase(ticket);
      return;
    }
    default: fail("rank {}: unknown disk tier message {} from rank 0 (mismatched infera versions?)", comm.rank(), w[0]);
  }
}

}  // namespace infera
