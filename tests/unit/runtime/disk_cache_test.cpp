// The prefix cache's disk tier: entries round-trip, survive a restart, and a corrupt,
// truncated or foreign file is a miss; the size limit holds under a flood of entries; an
// engine restarted over the same directory resumes a conversation from disk with the same
// greedy tokens (dense and hybrid); a slow read holds up only the request that waits for it.
#include "infera/runtime/disk_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>

#include "../test_support.h"
#include "infera/base/threads.h"
#include "infera/runtime/engine.h"
#include "test_models.h"

using namespace infera;

namespace {

namespace fs = std::filesystem;

DiskCacheEntry entry_of(uint64_t hash, int32_t kv_bytes = 256, int32_t state = 8) {
  DiskCacheEntry e;
  e.hash = hash;
  for (int32_t i = 0; i < 16; ++i) e.tokens.push_back(static_cast<int32_t>(hash % 1000) + i);
  for (int32_t i = 0; i < kv_bytes; ++i) e.kv.push_back(static_cast<uint8_t>(hash * 7 + i));
  for (int32_t i = 0; i < state; ++i) e.state.push_back(static_cast<float>(hash) + 0.5f * i);
  return e;
}

int64_t dir_bytes(const fs::path& dir) {
  int64_t n = 0;
  for (const auto& de : fs::directory_iterator(dir)) n += static_cast<int64_t>(de.file_size());
  return n;
}

void flip_byte(const std::string& path, int64_t offset_from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const auto size = static_cast<int64_t>(f.tellg());
  f.seekg(size - offset_from_end);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x40);
  f.seekp(size - offset_from_end);
  f.write(&c, 1);
}

struct OneThread {
  int saved = num_threads();
  OneThread() { set_num_threads(1); }
  ~OneThread() { set_num_threads(saved); }
};

}  // namespace

TEST(DiskCache, RoundTripRestartAndBadFilesAreMisses) {
  test::TempDir scratch("infera_disk_cache");
  const std::string dir = (scratch.path() / "cache").string();
  {
    DiskCache cache(dir, 1 << 20, 42);
    for (uint64_t h = 1; h <= 4; ++h) EXPECT_TRUE(cache.put(entry_of(h)));
    EXPECT_FALSE(cache.put(entry_of(1)));  // queued or written already
    cache.flush();
    EXPECT_TRUE(cache.contains(3));
    EXPECT_FALSE(cache.contains(9));
    const auto e = cache.get(2);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->tokens, entry_of(2).tokens);
    EXPECT_EQ(e->kv, entry_of(2).kv);
    EXPECT_EQ(e->state, entry_of(2).state);
    EXPECT_EQ(cache.stats().writes, 4);
    EXPECT_EQ(cache.stats().reads, 1);
  }
  // A restart finds them; a flipped byte, a truncated file and another model's file are misses.
  DiskCache cache(dir, 1 << 20, 42);
  EXPECT_EQ(cache.stats().entries, 4);
  ASSERT_TRUE(cache.get(1).has_value());
  flip_byte(cache.path_of(2), 5);  // inside the state
  EXPECT_FALSE(cache.get(2).has_value());
  fs::resize_file(cache.path_of(3), fs::file_size(cache.path_of(3)) - 3);
  EXPECT_FALSE(cache.get(3).has_value());
  {
    DiskCache other(dir, 1 << 20, 43);  // another model's fingerprint, same directory
    EXPECT_FALSE(other.get(4).has_value());
    fs::copy_file(cache.path_of(4), other.path_of(4));  // a foreign entry under this model's name
  }
  DiskCache other(dir, 1 << 20, 43);
  EXPECT_FALSE(other.get(4).has_value());
  EXPECT_EQ(other.stats().rejected, 1);
  EXPECT_EQ(cache.stats().rejected, 2);
  EXPECT_FALSE(fs::exists(cache.path_of(2)));  // rejected files are deleted
  EXPECT_TRUE(cache.get(4).has_value());
}

// The entries' model id for a GGUF file: not 0 (the id every unreadable directory shares),
// the same for the same file, another for another file or other bytes, and a split GGUF's
// other parts count.
TEST(DiskCache, ModelFingerprintOfGgufFiles) {
  const fs::path dir = fs::temp_directory_path() / ("infera_fp_gguf_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "a.gguf") << std::string(100, 'a');
  std::ofstream(dir / "b.gguf") << std::string(100, 'b');
  const uint64_t a = model_files_fingerprint((dir / "a.gguf").string());
  EXPECT_NE(a, 0u);
  EXPECT_EQ(a, model_files_fingerprint((dir / "a.gguf").string()));
  EXPECT_NE(a, model_files_fingerprint((dir / "b.gguf").string()));
  std::ofstream(dir / "a.gguf") << std::string(100, 'c');
  EXPECT_NE(a, model_files_fingerprint((dir / "a.gguf").string()));
  const fs::path first = dir / "m-00001-of-00002.gguf", second = dir / "m-00002-of-00002.gguf";
  std::ofstream(first) << std::string(64, 'x');
  std::ofstream(second) << std::string(64, 'y');
  const uint64_t split = model_files_fingerprint(first.string());
  EXPECT_NE(split, 0u);
  std::ofstream(second) << std::string(64, 'z');
  EXPECT_NE(split, model_files_fingerprint(first.string()));
  fs::remove(second);
  EXPECT_EQ(model_files_fingerprint(first.string()), 0u);  // a part missing: unreadable
  fs::remove_all(dir);
}

TEST(DiskCache, SizeLimitHoldsUnderAFlood) {
  test::TempDir scratch("infera_disk_cache_flood");
  const std::string dir = (scratch.path() / "cache").string();
  const int64_t limit = 20 * 1024;
  {
    DiskCache cache(dir, limit, 7, /*max_queue=*/8);
    int64_t dropped = 0;
    for (uint64_t h = 1; h <= 300; ++h) dropped += cache.put(entry_of(h, 1000)) ? 0 : 1;
    cache.flush();
    const DiskCacheStats s = cache.stats();
    EXPECT_LE(s.bytes, limit);
    EXPECT_LE(dir_bytes(dir), limit);
    EXPECT_EQ(s.dropped, dropped);
    EXPECT_EQ(s.writes + s.dropped, 300);
    for (uint64_t h = 1; h <= 300; ++h) dropped += cache.put(entry_of(1000 + h, 1000), /*wait=*/true) ? 0 : 1;
    cache.flush();
    EXPECT_LE(dir_bytes(dir), limit);
    EXPECT_LE(cache.stats().bytes, limit);
    EXPECT_GT(cache.stats().evictions, 0);
    EXPECT_TRUE(cache.contains(1300));  // the most recent stays
  }
  DiskCache smaller(dir, limit / 2, 7);  // a restart with a smaller limit trims at once
  EXPECT_LE(dir_bytes(dir), limit / 2);
}

namespace {

// Two turns of a conversation on `model`: turn 1 in one engine, turn 2 in a second engine
// over the same cache directory (a restart). Returns turn 2's tokens and stats.
struct TurnOutcome {
  std::vector<int32_t> tokens;
  int32_t cached = 0;
  EngineStats stats;
};

TurnOutcome run_turn(Model& model, const EngineConfig& c, const std::vector<int32_t>& prompt) {
  EngineCore core(model, c);
  TurnOutcome out;
  Request r;
  r.prompt_ids = prompt;
  r.max_tokens = 8;
  r.ignore_eos = true;
  core.add_request(r, [&](const Event& e) {
    if (!e.is_final())
      out.tokens.push_back(e.token);
    else
      out.cached = e.usage.cached_tokens;
  });
  while (core.has_work()) core.step();
  out.stats = core.stats();
  return out;
}

// A conversation's second turn after a restart: an engine with its disk tier in `dir` ran the
// first turn (a 90-token prompt; its blocks are written at shutdown); `next` is that turn
// plus its answer and 20 new tokens, `ref` its output with no cache at all.
struct SecondTurn {
  EngineConfig c;
  std::vector<int32_t> next;
  TurnOutcome ref;
};

SecondTurn second_turn_after_restart(Model& model, const fs::path& dir) {
  SecondTurn t;
  EngineConfig& c = t.c;
  c.block_size = 16;
  c.max_batch_tokens = 128;
  c.max_num_seqs = 2;
  c.prefill_chunk = 64;
  c.kv_cache_bytes = 64 << 20;
  c.cache_dir = (dir / "cache").string();
  c.cache_model_id = 99;
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 90; ++i) prompt.push_back(3 + (i * 53) % 250);
  const TurnOutcome first = run_turn(model, c, prompt);  // writes its blocks at shutdown
  t.next = prompt;
  t.next.insert(t.next.end(), first.tokens.begin(), first.tokens.end());
  for (int32_t i = 0; i < 20; ++i) t.next.push_back(7 + i);
  EngineConfig off = c;
  off.cache_dir.clear();
  off.enable_prefix_cache = false;
  t.ref = run_turn(model, off, t.next);
  return t;
}

void expect_restart_resumes_from_disk(Model& model, const std::string& what) {
  OneThread one;
  test::TempDir scratch("infera_disk_engine");
  const auto [c, next, ref] = second_turn_after_restart(model, scratch.path());
  const TurnOutcome resumed = run_turn(model, c, next);  // a fresh engine: only the disk has it
  EXPECT_EQ(resumed.tokens, ref.tokens) << what;
  EXPECT_GE(resumed.cached, 80) << what;
  EXPECT_GT(resumed.stats.disk_reads, 0) << what;
  // Every entry file corrupted: misses, and still the same tokens.
  for (const auto& de : fs::directory_iterator(c.cache_dir)) flip_byte(de.path().string(), 9);
  const TurnOutcome corrupt = run_turn(model, c, next);
  EXPECT_EQ(corrupt.tokens, ref.tokens) << what;
  EXPECT_EQ(corrupt.cached, 0) << what;
  EXPECT_GT(corrupt.stats.disk_rejected, 0) << what;
}

}  // namespace

TEST(DiskCacheEngine, RestartResumesDenseFromDisk) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  expect_restart_resumes_from_disk(testing_support::stories_model(), "stories260K");
}

TEST(DiskCacheEngine, RestartResumesHybridFromDisk) {
  expect_restart_resumes_from_disk(testing_support::hybrid_model(), "qwen3_5_moe");
}

TEST(DiskCacheEngine, BlocksInMemoryAreNotReadAgainForNothing) {
  // After a restart the first request reads its prefix from disk; the same prompt again (the
  // next turn of a conversation repeats it) finds every block in memory, and the disk
  // entries of blocks without a state checkpoint are not read again for the hybrid.
  OneThread one;
  Model& model = testing_support::hybrid_model();
  test::TempDir scratch("infera_disk_again");
  const auto [c, next, ref] = second_turn_after_restart(model, scratch.path());
  EngineCore core(model, c);
  auto run = [&] {
    std::vector<int32_t> tokens;
    int32_t cached = -1;
    Request r;
    r.prompt_ids = next;
    r.max_tokens = 8;
    r.ignore_eos = true;
    core.add_request(r, [&](const Event& e) {
      if (!e.is_final())
        tokens.push_back(e.token);
      else
        cached = e.usage.cached_tokens;
    });
    while (core.has_work()) core.step();
    EXPECT_EQ(tokens, ref.tokens);
    return cached;
  };
  EXPECT_GE(run(), 80);
  const int64_t reads = core.stats().disk_reads;
  EXPECT_GT(reads, 0);
  EXPECT_GE(run(), 80);
  EXPECT_EQ(core.stats().disk_reads, reads) << "blocks memory holds were read from disk again";
}

TEST(DiskCacheEngine, ASlowReadHoldsUpOnlyItsOwnRequest) {
  // Reads run on the disk tier's reader thread: while one is held (a slow disk), the request
  // waiting for it is not admitted and another sequence runs to its end step by step; once
  // the read is let go the waiting request resumes from disk with the uncached tokens.
  OneThread one;
  Model& model = testing_support::hybrid_model();
  test::TempDir scratch("infera_disk_slow");
  const auto [c, next, ref] = second_turn_after_restart(model, scratch.path());

  EngineCore core(model, c);
  ASSERT_NE(core.disk_cache(), nullptr);
  std::mutex mutex;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> reads_entered{0};
  core.disk_cache()->set_read_hook([&](uint64_t) {
    ++reads_entered;
    std::unique_lock lock(mutex);
    cv.wait(lock, [&] { return release; });
  });
  std::vector<int32_t> other_tokens, tokens;
  bool other_done = false;
  int32_t cached = -1;
  Request other;
  for (int32_t i = 0; i < 20; ++i) other.prompt_ids.push_back(1 + i % 2);  // nothing of it on disk
  other.max_tokens = 12;
  other.ignore_eos = true;
  core.add_request(other, [&](const Event& e) {
    if (!e.is_final())
      other_tokens.push_back(e.token);
    else
      other_done = true;
  });
  Request r;
  r.prompt_ids = next;
  r.max_tokens = 8;
  r.ignore_eos = true;
  core.add_request(r, [&](const Event& e) {
    if (!e.is_final())
      tokens.push_back(e.token);
    else
      cached = e.usage.cached_tokens;
  });
  ASSERT_TRUE(test::wait_for([&] { return reads_entered.load() > 0; })) << "the reader never started";
  for (int i = 0; i < 100 && !other_done; ++i) core.step();
  EXPECT_TRUE(other_done) << "the other sequence did not finish while the read was held";
  EXPECT_EQ(other_tokens.size(), 12u);
  EXPECT_TRUE(tokens.empty());
  EXPECT_EQ(core.stats().waiting, 1);
  EXPECT_EQ(reads_entered.load(), 1);  // still held in the first entry
  {
    std::lock_guard lock(mutex);
    release = true;
  }
  cv.notify_all();
  while (core.has_work()) core.step();
  EXPECT_EQ(tokens, ref.tokens);
  EXPECT_GE(cached, 80);
  EXPECT_GT(core.stats().disk_reads, 0);
}
