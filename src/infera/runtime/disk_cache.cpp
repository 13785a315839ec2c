#include "infera/runtime/disk_cache.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "infera/base/error.h"
#include "infera/base/log.h"
#include "infera/io/gguf.h"

namespace infera {

namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'I', 'N', 'F', 'K', 'V', 'B', 'L', 'K'};
constexpr uint32_t kVersion = 1;
constexpr const char* kSuffix = ".ikv";

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t reserved;
  uint64_t fingerprint;
  uint64_t hash;
  uint64_t n_tokens;
  uint64_t kv_bytes;
  uint64_t state_floats;
  uint64_t checksum;  // XXH3 of this header (checksum 0) and the payload
};
static_assert(sizeof(Header) == 64);

// Sizes a sane entry never exceeds (a corrupt header must not make us allocate terabytes).
constexpr uint64_t kMaxTokens = 1 << 16;
constexpr uint64_t kMaxKvBytes = uint64_t{1} << 32;
constexpr uint64_t kMaxStateFloats = uint64_t{1} << 32;

uint64_t checksum_of(Header h, const void* tokens, size_t tb, const void* kv, size_t kb, const void* st, size_t sb) {
  h.checksum = 0;
  XXH3_state_t* s = XXH3_createState();
  XXH3_64bits_reset(s);
  XXH3_64bits_update(s, &h, sizeof(h));
  XXH3_64bits_update(s, tokens, tb);
  XXH3_64bits_update(s, kv, kb);
  XXH3_64bits_update(s, st, sb);
  const uint64_t out = XXH3_64bits_digest(s);
  XXH3_freeState(s);
  return out;
}

}  // namespace

uint64_t model_files_fingerprint(const std::string& dir) {
  std::error_code ec;
  std::vector<fs::path> files;
  if (fs::is_regular_file(dir, ec)) {  // a GGUF file: it and the other parts of a split one
    try {
      for (const std::string& part : gguf::split_paths(dir)) files.emplace_back(part);
    } catch (const Error&) {
      return 0;
    }
  } else {
    for (const auto& de : fs::directory_iterator(dir, ec)) {
      if (de.is_regular_file(ec)) files.push_back(de.path());
    }
    if (ec) return 0;
  }
  std::sort(files.begin(), files.end());
  XXH3_state_t* s = XXH3_createState();
  XXH3_64bits_reset(s);
  std::vector<char> buf(1 << 20);
  for (const fs::path& p : files) {
    const std::string name = p.filename().string();
    const uint64_t size = fs::file_size(p, ec);
    XXH3_64bits_update(s, name.data(), name.size());
    XXH3_64bits_update(s, &size, sizeof(size));
    std::ifstream in(p, std::ios::binary);
    const bool whole = name == "config.json";
    const uint64_t head = whole ? size : std::min<uint64_t>(size, buf.size());
    for (uint64_t done = 0; in && done < head;) {
      const auto n = static_cast<std::streamsize>(std::min<uint64_t>(buf.size(), head - done));
      in.read(buf.data(), n);
      XXH3_64bits_update(s, buf.data(), static_cast<size_t>(in.gcount()));
      done += static_cast<uint64_t>(n);
    }
    if (!whole && size > buf.size()) {
      in.clear();
      in.seekg(static_cast<std::streamoff>(size - std::min<uint64_t>(size - head, buf.size())));
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      XXH3_64bits_update(s, buf.data(), static_cast<size_t>(in.gcount()));
    }
  }
  const uint64_t out = XXH3_64bits_digest(s);
  XXH3_freeState(s);
  return out;
}

DiskCache::DiskCache(std::string dir, int64_t max_bytes, uint64_t fingerprint, int32_t max_queue,
                     int64_t max_ready_bytes)
    : dir_(std::move(dir)),
      max_bytes_(max_bytes),
      fingerprint_(fingerprint),
      max_queue_(static_cast<size_t>(std::max(max_queue, 1))),
      max_ready_bytes_(max_ready_bytes) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_)) fail("--cache-dir: cannot create the directory '{}': {}", dir_, ec.message());
  // Index what is there, least recently written first; leftovers of interrupted writes go.
  std::vector<std::pair<fs::file_time_type, std::string>> found;
  for (const auto& de : fs::directory_iterator(dir_, ec)) {
    const std::string name = de.path().filename().string();
    if (name.ends_with(".tmp")) {
      fs::remove(de.path(), ec);
      continue;
    }
    if (!name.ends_with(kSuffix) || !de.is_regular_file(ec)) continue;
    found.emplace_back(de.last_write_time(ec), name);
  }
  if (ec) fail("--cache-dir: cannot read the directory '{}': {}", dir_, ec.message());
  std::sort(found.begin(), found.end());
  std::lock_guard lock(mutex_);
  for (const auto& [time, name] : found) {
    const auto size = fs::file_size(fs::path(dir_) / name, ec);
    if (ec) continue;
    FileInfo& f = files_[name];
    f.bytes = static_cast<int64_t>(size);
    f.lru = lru_.insert(lru_.end(), name);
    stats_.bytes += f.bytes;
  }
  stats_.entries = static_cast<int64_t>(files_.size());
  enforce_limit_locked();
  writer_ = std::thread([this] { writer_loop(); });
  reader_ = std::thread([this] { reader_loop(); });
  LOG_INFO("prefix cache on disk: {} ({} entries, {} MiB of {} MiB)", dir_, stats_.entries, stats_.bytes >> 20,
           max_bytes_ >> 20);
}

DiskCache::~DiskCache() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  queue_cv_.notify_all();
  read_cv_.notify_all();
  if (reader_.joinable()) reader_.join();
  if (writer_.joinable()) writer_.join();
}

uint64_t DiskCache::read_async(std::vector<uint64_t> hashes) {
  uint64_t ticket = 0;
  {
    std::lock_guard lock(mutex_);
    ticket = next_ticket_++;
    reads_[ticket];
    read_queue_.push_back(ReadJob{ticket, std::move(hashes)});
  }
  read_cv_.notify_one();
  return ticket;
}

std::optional<std::vector<DiskCacheEntry>> DiskCache::take_read(uint64_t ticket) {
  std::lock_guard lock(mutex_);
  const auto it = reads_.find(ticket);
  if (it == reads_.end() || !it->second.done) return std::nullopt;
  std::vector<DiskCacheEntry> out = std::move(it->second.entries);
  ready_bytes_ -= it->second.bytes;
  --ready_;
  reads_.erase(it);
  read_cv_.notify_one();  // room for the next prefix
  return out;
}

void DiskCache::drop_read(uint64_t ticket) {
  std::lock_guard lock(mutex_);
  const auto it = reads_.find(ticket);
  if (it == reads_.end()) return;
  if (it->second.done) {
    ready_bytes_ -= it->second.bytes;
    --ready_;
    read_cv_.notify_one();
  }
  // A queued job finds its ticket gone and is skipped; one under way is discarded at its end.
  reads_.erase(it);
}

bool DiskCache::wait_read(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return read_done_cv_.wait_for(lock, timeout, [&] { return ready_ > 0 || stop_; }) && ready_ > 0;
}

int32_t DiskCache::reads_pending() const {
  std::lock_guard lock(mutex_);
  return static_cast<int32_t>(reads_.size());
}

void DiskCache::set_read_hook(std::function<void(uint64_t)> hook) {
  std::lock_guard lock(mutex_);
  read_hook_ = std::move(hook);
}

void DiskCache::reader_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    // The next prefix once what was read and not taken is under the limit (or nothing is).
    read_cv_.wait(lock,
                  [&] { return stop_ || (!read_queue_.empty() && (ready_ == 0 || ready_bytes_ < max_ready_bytes_)); });
    if (stop_) return;
    ReadJob job = std::move(read_queue_.front());
    read_queue_.pop_front();
    if (!reads_.contains(job.ticket)) continue;  // dropped while queued
    std::vector<DiskCacheEntry> entries;
    int64_t bytes = 0;
    for (const uint64_t h : job.hashes) {
      const std::function<void(uint64_t)> hook = read_hook_;
      lock.unlock();
      if (hook) hook(h);
      std::optional<DiskCacheEntry> e = get(h);
      lock.lock();
      if (stop_ || !reads_.contains(job.ticket)) break;
      if (!e) continue;
      bytes += e->bytes();
      entries.push_back(std::move(*e));
    }
    const auto it = reads_.find(job.ticket);
    if (stop_ || it == reads_.end()) continue;
    it->second.done = true;
    it->second.bytes = bytes;
    it->second.entries = std::move(entries);
    ready_bytes_ += bytes;
    ++ready_;
    read_done_cv_.notify_all();
  }
}

std::string DiskCache::name_of(uint64_t hash) const {
  return fmt::format("{:016x}-{:016x}{}", fingerprint_, hash, kSuffix);
}

std::string DiskCache::path_of(uint64_t hash) const { return (fs::path(dir_) / name_of(hash)).string(); }

bool DiskCache::contains(uint64_t hash) const {
  std::lock_guard lock(mutex_);
  return queued_.contains(hash) || files_.contains(name_of(hash));
}

int64_t DiskCache::file_bytes(uint64_t hash) const {
  std::lock_guard lock(mutex_);
  const auto it = files_.find(name_of(hash));
  return it == files_.end() ? -1 : it->second.bytes;
}

int64_t DiskCache::file_bytes_for(int64_t n_tokens, int64_t kv_bytes, int64_t state_floats) {
  return static_cast<int64_t>(sizeof(Header)) + n_tokens * static_cast<int64_t>(sizeof(int32_t)) + kv_bytes +
         state_floats * static_cast<int64_t>(sizeof(float));
}

bool DiskCache::put(DiskCacheEntry entry, bool wait) {
  {
    std::unique_lock lock(mutex_);
    if (stop_ || queued_.contains(entry.hash) || files_.contains(name_of(entry.hash))) return false;
    if (entry.bytes() > max_bytes_) return false;
    if (wait) idle_cv_.wait(lock, [&] { return queue_.size() < max_queue_ || stop_; });
    if (queue_.size() >= max_queue_ || stop_) {
      ++stats_.dropped;
      return false;
    }
    queued_[entry.hash] = true;
    queue_.push_back(std::move(entry));
  }
  queue_cv_.notify_one();
  return true;
}

void DiskCache::flush() {
  std::unique_lock lock(mutex_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !writing_; });
}

DiskCacheStats DiskCache::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void DiskCache::writer_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    queue_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) {
      if (stop_) return;
      continue;
    }
    DiskCacheEntry e = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    lock.unlock();
    write_entry(e);
    lock.lock();
    queued_.erase(e.hash);
    writing_ = false;
    idle_cv_.notify_all();  // flush() and waiting put()s
  }
}

void DiskCache::write_entry(const DiskCacheEntry& e) {
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = kVersion;
  h.fingerprint = fingerprint_;
  h.hash = e.hash;
  h.n_tokens = e.tokens.size();
  h.kv_bytes = e.kv.size();
  h.state_floats = e.state.size();
  h.checksum = checksum_of(h, e.tokens.data(), e.tokens.size() * sizeof(int32_t), e.kv.data(), e.kv.size(),
                           e.state.data(), e.state.size() * sizeof(float));
  const std::string name = name_of(e.hash);
  const fs::path final_path = fs::path(dir_) / name;
  const fs::path tmp = fs::path(dir_) / (name + ".tmp");
  bool ok = false;
  if (std::FILE* f = std::fopen(tmp.c_str(), "wb")) {
    ok = std::fwrite(&h, sizeof(h), 1, f) == 1;
    if (ok && !e.tokens.empty())
      ok = std::fwrite(e.tokens.data(), sizeof(int32_t), e.tokens.size(), f) == e.tokens.size();
    if (ok && !e.kv.empty()) ok = std::fwrite(e.kv.data(), 1, e.kv.size(), f) == e.kv.size();
    if (ok && !e.state.empty()) ok = std::fwrite(e.state.data(), sizeof(float), e.state.size(), f) == e.state.size();
    ok = std::fclose(f) == 0 && ok;
  }
  std::error_code ec;
  if (ok) {
    fs::rename(tmp, final_path, ec);
    ok = !ec;
  }
  if (!ok) {
    fs::remove(tmp, ec);
    LOG_WARN("prefix cache on disk: could not write {} (disk full or not writable?)", final_path.string());
    return;
  }
  const int64_t bytes = static_cast<int64_t>(sizeof(h)) + e.bytes();
  std::lock_guard lock(mutex_);
  if (auto it = files_.find(name); it != files_.end()) forget_locked(name);
  FileInfo& fi = files_[name];
  fi.bytes = bytes;
  fi.lru = lru_.insert(lru_.end(), name);
  stats_.bytes += bytes;
  stats_.entries = static_cast<int64_t>(files_.size());
  ++stats_.writes;
  stats_.write_bytes += bytes;
  enforce_limit_locked();
}

void DiskCache::forget_locked(const std::string& name) {
  const auto it = files_.find(name);
  if (it == files_.end()) return;
  stats_.bytes -= it->second.bytes;
  lru_.erase(it->second.lru);
  files_.erase(it);
  stats_.entries = static_cast<int64_t>(files_.size());
}

void DiskCache::enforce_limit_locked() {
  while (stats_.bytes > max_bytes_ && !lru_.empty()) {
    const std::string name = lru_.front();
    std::error_code ec;
    fs::remove(fs::path(dir_) / name, ec);
    forget_locked(name);
    ++stats_.evictions;
  }
}

std::optional<DiskCacheEntry> DiskCache::get(uint64_t hash) {
  const std::string name = name_of(hash);
  {
    std::lock_guard lock(mutex_);
    if (!files_.contains(name)) return std::nullopt;  // (a queued entry is not readable yet)
  }
  const fs::path path = fs::path(dir_) / name;
  auto reject = [&](const char* why) -> std::optional<DiskCacheEntry> {
    LOG_WARN("prefix cache on disk: {} is {}; ignored and deleted", path.string(), why);
    std::error_code ec;
    fs::remove(path, ec);
    std::lock_guard lock(mutex_);
    forget_locked(name);
    ++stats_.rejected;
    return std::nullopt;
  };
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::lock_guard lock(mutex_);
    forget_locked(name);  // deleted behind our back
    return std::nullopt;
  }
  Header h{};
  if (!in.read(reinterpret_cast<char*>(&h), sizeof(h))) return reject("truncated");
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 || h.version != kVersion) return reject("not an entry");
  if (h.fingerprint != fingerprint_ || h.hash != hash) return reject("another model's entry");
  if (h.n_tokens > kMaxTokens || h.kv_bytes > kMaxKvBytes || h.state_floats > kMaxStateFloats) {
    return reject("corrupt");
  }
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  const uint64_t expect = sizeof(h) + h.n_tokens * sizeof(int32_t) + h.kv_bytes + h.state_floats * sizeof(float);
  if (ec || size != expect) return reject("truncated");
  DiskCacheEntry e;
  e.hash = hash;
  e.tokens.resize(h.n_tokens);
  e.kv.resize(h.kv_bytes);
  e.state.resize(h.state_floats);
  in.read(reinterpret_cast<char*>(e.tokens.data()), static_cast<std::streamsize>(h.n_tokens * sizeof(int32_t)));
  in.read(reinterpret_cast<char*>(e.kv.data()), static_cast<std::streamsize>(h.kv_bytes));
  in.read(reinterpret_cast<char*>(e.state.data()), static_cast<std::streamsize>(h.state_floats * sizeof(float)));
  if (!in) return reject("truncated");
  if (checksum_of(h, e.tokens.data(), e.tokens.size() * sizeof(int32_t), e.kv.data(), e.kv.size(), e.state.data(),
                  e.state.size() * sizeof(float)) != h.checksum) {
    return reject("corrupt (checksum mismatch)");
  }
  fs::last_write_time(path, fs::file_time_type::clock::now(), ec);  // recency survives a restart
  std::lock_guard lock(mutex_);
  if (auto it = files_.find(name); it != files_.end()) lru_.splice(lru_.end(), lru_, it->second.lru);
  ++stats_.reads;
  stats_.read_bytes += static_cast<int64_t>(expect);
  return e;
}

}  // namespace infera
