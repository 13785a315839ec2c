// The prefix cache's second tier: entries evicted from memory (a full KV block, and the
// recurrent-state checkpoint after it when a hybrid kept one) are written to files in a
// directory and read back on a later hit, also after a restart.
//
// An entry is content-addressed: its file is named by the block's chain hash (which names
// the whole token prefix up to the block, salt included) and the model's fingerprint
// (weights, KV geometry and dtype, state shape, block size, parallel layout), so another
// model's entries are never looked up. Each file holds a header (magic, version,
// fingerprint, hash, sizes) and the payload (the block's tokens, its K/V bytes, the state),
// with an XXH3 checksum over both: a corrupt, truncated or foreign file is a miss (and is
// deleted), never a wrong answer.
//
// Writes go through a bounded queue to one writer thread, so the engine's step never waits
// for the disk: when the queue is full the entry is dropped (counted). Reads of a prompt's
// prefix go to one reader thread (read_async / take_read), so a step does not wait for
// them either: the request waits while others run. Files are written to
// a temporary name and renamed. The directory's size stays within max_bytes: the least
// recently used files (by modification time at start, then by use) are deleted first.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace infera {

struct DiskCacheEntry {
  uint64_t hash = 0;  // the block's chain hash
  std::vector<int32_t> tokens;  // [block_size]
  std::vector<uint8_t> kv;  // the block's K/V bytes, all layers (KvPool::bytes_per_block)
  std::vector<float> state;  // the recurrent state after the block; empty: none
  int64_t bytes() const {
    return static_cast<int64_t>(tokens.size() * sizeof(int32_t) + kv.size() + state.size() * sizeof(float));
  }
};

// A fingerprint of the model files in `dir` (every regular file: its name, size, and the
// XXH3 of its first and last MiB; config.json whole), for the entries' names; `dir` may be a
// GGUF file (it, and every part of a split one, the same way). 0 when they cannot be read.
uint64_t model_files_fingerprint(const std::string& dir);

struct DiskCacheStats {
  int64_t reads = 0;  // entries read back (hits)
  int64_t read_bytes = 0;
  int64_t writes = 0;  // entries written
  int64_t write_bytes = 0;
  int64_t evictions = 0;  // files deleted to stay within the size limit
  int64_t dropped = 0;  // entries not written: the queue was full
  int64_t rejected = 0;  // files found corrupt, truncated or foreign (deleted)
  int64_t entries = 0;  // files now
  int64_t bytes = 0;  // their bytes now
};

class DiskCache {
 public:
  // Opens (creates) `dir` and indexes the entries already there. Throws infera::Error when
  // the directory cannot be created or read.
  DiskCache(std::string dir, int64_t max_bytes, uint64_t fingerprint, int32_t max_queue = 256,
            int64_t max_ready_bytes = int64_t{512} << 20);
  // Writes what is queued, then stops the writer.
  ~DiskCache();
  DiskCache(const DiskCache&) = delete;
  DiskCache& operator=(const DiskCache&) = delete;

  // Queues an entry for writing; false when the queue is full (dropped; with `wait`: waits
  // for room instead) or it is on disk already.
  bool put(DiskCacheEntry entry, bool wait = false);
  // Whether an entry for `hash` is on disk or queued (cheap: the index in memory).
  bool contains(uint64_t hash) const;
  // Bytes of the file of `hash` (-1: none; a queued entry has none yet), and those of an
  // entry of these sizes: a block's file is larger than file_bytes_for(its tokens, its K/V
  // bytes, 0) only when it carries a state, so a hybrid whose memory holds the block reads
  // the entry only for its state.
  int64_t file_bytes(uint64_t hash) const;
  static int64_t file_bytes_for(int64_t n_tokens, int64_t kv_bytes, int64_t state_floats);
  // Reads and checks the entry for `hash`: nullopt when there is none or the file is
  // corrupt, truncated or another model's.
  std::optional<DiskCacheEntry> get(uint64_t hash);
  // Blocks until every queued entry is written.
  void flush();

  // ---- Reads off the caller's thread ----
  // Queues the reads of `hashes` (one prompt's prefix, in chain order) for the reader
  // thread; returns a ticket (never 0) for take_read(). The reader works on one prefix at a
  // time, and starts the next only while the entries read and not yet taken stay under
  // max_ready_bytes (one prefix is always read), so memory held for reads is bounded.
  uint64_t read_async(std::vector<uint64_t> hashes);
  // The entries read for `ticket` (those that were missing or bad left out), once all were
  // tried; nullopt while the read is under way. A taken ticket is forgotten.
  std::optional<std::vector<DiskCacheEntry>> take_read(uint64_t ticket);
  // Forgets a ticket (its request ended): queued, it is not read; done, its entries go.
  void drop_read(uint64_t ticket);
  // Waits until some read is done and not taken, at most `timeout`; true when one is.
  bool wait_read(std::chrono::milliseconds timeout);
  // Reads queued or under way, and done but not taken.
  int32_t reads_pending() const;
  // Tests: called on the reader thread before each entry is read (may block: a slow disk).
  void set_read_hook(std::function<void(uint64_t hash)> hook);
  DiskCacheStats stats() const;
  const std::string& dir() const { return dir_; }
  uint64_t fingerprint() const { return fingerprint_; }
  // The file of `hash` under this fingerprint (tests corrupt it).
  std::string path_of(uint64_t hash) const;

 private:
  struct FileInfo {
    int64_t bytes = 0;
    std::list<std::string>::iterator lru;
  };
  void writer_loop();
  void reader_loop();
  void write_entry(const DiskCacheEntry& e);
  // Deletes least recently used files until the total fits max_bytes. Holds mutex_.
  void enforce_limit_locked();
  void forget_locked(const std::string& name);
  std::string name_of(uint64_t hash) const;

  std::string dir_;
  int64_t max_bytes_;
  uint64_t fingerprint_;
  size_t max_queue_;
  mutable std::mutex mutex_;
  std::condition_variable queue_cv_, idle_cv_;
  std::deque<DiskCacheEntry> queue_;
  std::unordered_map<uint64_t, bool> queued_;  // hashes in the queue
  bool writing_ = false;
  bool stop_ = false;
  std::unordered_map<std::string, FileInfo> files_;  // every entry file of the directory
  std::list<std::string> lru_;  // front = least recently used
  DiskCacheStats stats_;
  std::thread writer_;
  // Reads: jobs in order; results until taken.
  struct ReadJob {
    uint64_t ticket = 0;
    std::vector<uint64_t> hashes;
  };
  struct ReadResult {
    bool done = false;
    int64_t bytes = 0;
    std::vector<DiskCacheEntry> entries;
  };
  int64_t max_ready_bytes_;
  std::condition_variable read_cv_, read_done_cv_;
  std::deque<ReadJob> read_queue_;
  std::unordered_map<uint64_t, ReadResult> reads_;  // by ticket: queued, under way or done
  int64_t ready_bytes_ = 0;  // entries of done reads not yet taken
  int32_t ready_ = 0;  // done reads not yet taken
  uint64_t next_ticket_ = 1;
  std::function<void(uint64_t)> read_hook_;
  std::thread reader_;
};

}  // namespace infera
