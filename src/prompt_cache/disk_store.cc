#include "prompt_cache/disk_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <tuple>

#include "util/log.h"

namespace ember::prompt_cache {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string ErrnoText() { return std::strerror(errno); }

Status MakeDir(const std::string& path) {
  if (mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) {
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return Status::Ok();
    return Status::Error(path + ": not a directory");
  }
  return Status::Error(path + ": cannot create the directory: " + ErrnoText());
}

// Creates `path` and its missing parents.
Status MakeDirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      const std::string prefix = path.substr(0, i);
      if (!prefix.empty() && prefix.back() != '/') EMBER_RETURN_IF_ERROR(MakeDir(prefix));
    }
  }
  return Status::Ok();
}

bool WriteAll(int fd, const uint8_t* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Reads exactly n bytes; false on an error or a shorter file.
bool ReadAll(int fd, uint8_t* data, size_t n) {
  while (n > 0) {
    const ssize_t r = ::read(fd, data, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    data += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// "<16 hex ns>-<64 hex key>.kv" -> (ns, key).
bool ParseFileName(const std::string& name, uint64_t* ns, Key* key) {
  if (name.size() != 16 + 1 + 64 + 3 || name[16] != '-' || name.compare(81, 3, ".kv") != 0)
    return false;
  uint64_t v = 0;
  for (size_t i = 0; i < 16; ++i) {
    const int h = HexValue(name[i]);
    if (h < 0) return false;
    v = (v << 4) | static_cast<uint64_t>(h);
  }
  for (size_t i = 0; i < 32; ++i) {
    const int hi = HexValue(name[17 + 2 * i]), lo = HexValue(name[18 + 2 * i]);
    if (hi < 0 || lo < 0) return false;
    (*key)[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  *ns = v;
  return true;
}

}  // namespace

Result<std::unique_ptr<DiskStore>> DiskStore::Open(const DiskStoreConfig& config) {
  if (config.dir.empty()) return Status::Error("--prompt-cache-dir: empty path");
  if (config.max_bytes <= 0)
    return Status::Error("--prompt-cache-disk-bytes: must be > 0 with --prompt-cache-dir");
  CHECK_GT(config.block_size, 0);
  CHECK_GT(config.payload_bytes, 0);
  auto store = std::unique_ptr<DiskStore>(new DiskStore(config));
  EMBER_RETURN_IF_ERROR(store->Init());
  return store;
}

DiskStore::DiskStore(const DiskStoreConfig& config)
    : config_(config),
      record_bytes_(RecordBytes(config.block_size, config.payload_bytes)),
      memory_(RecordMemory::Create(static_cast<size_t>(record_bytes_),
                                   config.max_queue_bytes / record_bytes_, config.pinned)) {}

Status DiskStore::Init() {
  path_ = config_.dir;
  while (path_.size() > 1 && path_.back() == '/') path_.pop_back();
  path_.append("/").append(HexOf(config_.fingerprint));
  EMBER_RETURN_IF_ERROR(MakeDirs(path_).WithContext("--prompt-cache-dir"));
  EMBER_RETURN_IF_ERROR(LockDirectory());
  {  // For people: what this directory's fingerprint digests (replaced atomically).
    const std::string tmp = path_ + "/FINGERPRINT.tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      const std::string& text = config_.fingerprint_text;
      const bool ok = WriteAll(fd, reinterpret_cast<const uint8_t*>(text.data()), text.size());
      ::close(fd);
      if (ok) std::rename(tmp.c_str(), (path_ + "/FINGERPRINT").c_str());
    }
  }
  IndexExisting();
  writer_ = std::thread([this] { WriterLoop(); });
  return Status::Ok();
}

Status DiskStore::LockDirectory() {
  const std::string lock_path = path_ + "/LOCK";
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0)
    return Status::Error("--prompt-cache-dir: cannot open " + lock_path + ": " + ErrnoText());
  if (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    char holder[32] = {};
    const ssize_t n = ::pread(lock_fd_, holder, sizeof(holder) - 1, 0);
    ::close(lock_fd_);
    lock_fd_ = -1;
    std::string pid = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "unknown";
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    return Status::Error("--prompt-cache-dir: " + path_ +
                         " is in use by another Ember engine (pid " + pid +
                         "); give each server its own directory");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(lock_fd_, 0) == 0)
    (void)!::pwrite(lock_fd_, pid.data(), pid.size(), 0);
  return Status::Ok();
}

// Lists the directory: temp files go, records whose size is wrong go (corrupt), the rest are
// indexed oldest first by modification time; then the cap is enforced (it may have shrunk).
void DiskStore::IndexExisting() {
  DIR* dir = opendir(path_.c_str());
  if (dir == nullptr) return;
  std::vector<std::tuple<int64_t, Key, uint64_t>> found;  // (mtime ns, key, ns)
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    const std::string full = path_ + "/" + name;
    if (name.find(".tmp") != std::string::npos) {
      if (::unlink(full.c_str()) == 0) ++stale_temps_;
      continue;
    }
    uint64_t ns = 0;
    Key key{};
    if (!ParseFileName(name, &ns, &key)) continue;  // LOCK, FINGERPRINT, foreign files
    struct stat st;
    if (stat(full.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (st.st_size != record_bytes_) {
      if (::unlink(full.c_str()) == 0) ++corrupt_;
      continue;
    }
    found.emplace_back(int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec, key, ns);
  }
  closedir(dir);
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
  MutexLock lock(&mu_);
  for (const auto& [mtime, key, ns] : found) {
    lru_.push_back(key);
    index_[key] = Entry{ns, std::prev(lru_.end())};
    bytes_ += record_bytes_;
  }
  MakeRoom(0);
  if (!found.empty() || stale_temps_ > 0 || corrupt_ > 0) {
    LOG_INFO << "prompt cache " << path_ << ": " << index_.size() << " blocks ("
             << (bytes_ >> 20) << " MiB) indexed, " << corrupt_.load()
             << " of a wrong size removed, " << stale_temps_.load() << " temp files removed";
  }
}

DiskStore::~DiskStore() {
  if (writer_.joinable()) {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.NotifyAll();
    writer_.join();
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

std::string DiskStore::FileName(const Key& key, uint64_t ns) const {
  char tag[17];
  std::snprintf(tag, sizeof(tag), "%016llx", static_cast<unsigned long long>(ns));
  std::string name = path_;
  name.append("/").append(tag).append("-").append(HexOf(key)).append(".kv");
  return name;
}

bool DiskStore::Contains(const Key& key) const {
  MutexLock lock(&mu_);
  return index_.contains(key);
}

void DiskStore::Touch(const Key& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  lru_.splice(lru_.end(), lru_, it->second.lru);
}

void DiskStore::Erase(const Key& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  ::unlink(FileName(key, it->second.ns).c_str());
  lru_.erase(it->second.lru);
  index_.erase(it);
  bytes_ -= record_bytes_;
}

void DiskStore::MakeRoom(int64_t incoming) {
  while (!lru_.empty() && bytes_ + incoming > config_.max_bytes) {
    Erase(lru_.front());
    ++evictions_;
  }
}

std::span<const uint8_t> DiskStore::Read(const BlockIdentity& id) {
  read_buffer_.resize(static_cast<size_t>(record_bytes_));
  if (!ReadRecord(id, read_buffer_)) return {};
  return RecordPayload(read_buffer_, config_.block_size, config_.payload_bytes);
}

bool DiskStore::ReadRecord(const BlockIdentity& id, std::span<uint8_t> record) {
  CHECK_EQ(static_cast<int64_t>(record.size()), record_bytes_);
  const int64_t start = NowNs();
  std::string file;
  {
    MutexLock lock(&mu_);
    auto it = index_.find(id.key);
    if (it == index_.end()) {
      ++misses_;
      return false;
    }
    file = FileName(id.key, it->second.ns);
    Touch(id.key);
  }
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {  // evicted (or cleared) since the lookup
    ++misses_;
    return false;
  }
  struct stat st;
  const bool sized = fstat(fd, &st) == 0 && st.st_size == record_bytes_;
  const bool read_ok = sized && ReadAll(fd, record.data(), record.size());
  ::close(fd);
  const std::string why = read_ok ? VerifyRecord(record, id, config_.payload_bytes)
                                  : std::string(sized ? "short read" : "wrong size");
  if (!why.empty()) {
    LOG_WARN << "prompt cache: dropping " << file << ": " << why;
    ++corrupt_;
    MutexLock lock(&mu_);
    Erase(id.key);
    return false;
  }
  // Recency survives a restart through the file's modification time.
  (void)utimensat(AT_FDCWD, file.c_str(), nullptr, 0);
  ++hits_;
  bytes_read_ += record_bytes_;
  read_ns_ += NowNs() - start;
  return true;
}

DiskStore::WriteResult DiskStore::Write(const BlockIdentity& id, RecordBuffer record) {
  CHECK_EQ(static_cast<int64_t>(record.bytes().size()), record_bytes_);
  CHECK_EQ(static_cast<int32_t>(id.tokens.size()), config_.block_size);
  if (const std::optional<WriteResult> early = Admit(id.key)) return *early;
  WriteRecordHeader(id, record.bytes());  // the writer takes the checksum
  Pending item{id.key, id.ns, std::move(record), nullptr};
  return Enqueue(std::move(item));
}

DiskStore::WriteResult DiskStore::WriteRam(const Key& key, uint64_t ns,
                                           std::shared_ptr<const RecordBuffer> record) {
  CHECK(record != nullptr);
  CHECK_EQ(static_cast<int64_t>(record->bytes().size()), record_bytes_);
  if (const std::optional<WriteResult> early = Admit(key)) return *early;
  Pending item{key, ns, RecordBuffer(), std::move(record)};
  return Enqueue(std::move(item));
}

std::optional<DiskStore::WriteResult> DiskStore::Admit(const Key& key) {
  MutexLock lock(&mu_);
  if (index_.contains(key)) {
    Touch(key);
    return WriteResult::kPresent;
  }
  if (queued_keys_.contains(key)) return WriteResult::kPresent;
  if (queued_bytes_ + record_bytes_ > config_.max_queue_bytes) {
    ++write_drops_;
    return WriteResult::kDropped;
  }
  return std::nullopt;
}

DiskStore::WriteResult DiskStore::Enqueue(Pending item) {
  {
    MutexLock lock(&mu_);
    if (queued_keys_.contains(item.key) || index_.contains(item.key)) return WriteResult::kPresent;
    queued_keys_[item.key] = 1;
    queued_bytes_ += record_bytes_;
    queue_.push_back(std::move(item));
  }
  cv_.NotifyAll();
  return WriteResult::kQueued;
}

void DiskStore::WriterLoop() {
  while (true) {
    Pending item;
    {
      MutexLock lock(&mu_);
      cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      item = std::move(queue_.front());
      queue_.pop_front();
      queued_bytes_ -= record_bytes_;
      if (record_bytes_ > config_.max_bytes) {  // can never fit
        queued_keys_.erase(item.key);
        ++write_drops_;
        cv_.NotifyAll();
        continue;
      }
      MakeRoom(record_bytes_);  // the cap holds before the write
      writing_ = true;
      bytes_ += record_bytes_;   // reserved for the record being written
    }
    const bool ok = WriteFile(item);
    // The record's memory goes back before a Flush returns (a RAM slot, or the queue's).
    item.record = RecordBuffer();
    item.ram.reset();
    {
      MutexLock lock(&mu_);
      writing_ = false;
      // Until now a second write of the key was answered kPresent (queued_keys_ held it while
      // it was written); from now the index does.
      queued_keys_.erase(item.key);
      if (ok && !index_.contains(item.key)) {
        lru_.push_back(item.key);
        index_[item.key] = Entry{item.ns, std::prev(lru_.end())};
      } else {
        bytes_ -= record_bytes_;
      }
    }
    cv_.NotifyAll();
  }
}

bool DiskStore::WriteFile(const Pending& item) {
  // The record's body as it is (a RAM record is shared with its readers: not written to), then
  // its checksum in place of the last 4 bytes.
  const std::span<const uint8_t> bytes =
      item.ram != nullptr ? item.ram->bytes() : item.record.bytes();
  const std::array<uint8_t, 4> tail = ChecksumTail(bytes);
  const std::string final_name = FileName(item.key, item.ns);
  const std::string tmp = final_name + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && WriteAll(fd, bytes.data(), bytes.size() - 4) &&
            WriteAll(fd, tail.data(), tail.size());
  if (fd >= 0) ok = ::close(fd) == 0 && ok;
  ok = ok && std::rename(tmp.c_str(), final_name.c_str()) == 0;
  if (!ok) {
    if (!logged_write_error_) {
      LOG_WARN << "prompt cache: cannot write " << final_name << ": " << ErrnoText()
               << " (further write errors are only counted)";
      logged_write_error_ = true;
    }
    ::unlink(tmp.c_str());
    ++write_errors_;
    return false;
  }
  ++writes_;
  bytes_written_ += record_bytes_;
  return true;
}

int64_t DiskStore::QueueRoom() const {
  MutexLock lock(&mu_);
  return std::max<int64_t>(0, (config_.max_queue_bytes - queued_bytes_) / record_bytes_);
}

int64_t DiskStore::Clear(std::optional<uint64_t> ns) {
  MutexLock lock(&mu_);
  const auto matches = [&](uint64_t record_ns) { return !ns || *ns == record_ns; };
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (matches(it->ns)) {
      queued_keys_.erase(it->key);
      queued_bytes_ -= record_bytes_;
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  // The record being written lands in the index when the writer is done: wait for it.
  cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return !writing_; });
  std::vector<Key> doomed;
  for (const auto& [key, entry] : index_) {
    if (matches(entry.ns)) doomed.push_back(key);
  }
  for (const Key& key : doomed) Erase(key);
  return static_cast<int64_t>(doomed.size());
}

void DiskStore::Flush() {
  MutexLock lock(&mu_);
  cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return queue_.empty() && !writing_; });
}

DiskStoreStats DiskStore::Stats() const {
  DiskStoreStats s;
  {
    MutexLock lock(&mu_);
    s.records = static_cast<int64_t>(index_.size());
    s.bytes = bytes_;
    s.queued_bytes = queued_bytes_;
  }
  s.capacity_bytes = config_.max_bytes;
  s.hits = hits_;
  s.misses = misses_;
  s.writes = writes_;
  s.write_drops = write_drops_;
  s.write_errors = write_errors_;
  s.evictions = evictions_;
  s.corrupt_dropped = corrupt_;
  s.stale_temps_removed = stale_temps_;
  s.bytes_read = bytes_read_;
  s.bytes_written = bytes_written_;
  s.read_ns = read_ns_;
  return s;
}

}  // namespace ember::prompt_cache
