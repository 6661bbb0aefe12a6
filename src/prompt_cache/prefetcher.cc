#include "prompt_cache/prefetcher.h"

#include <algorithm>

#include "util/check.h"

namespace ember::prompt_cache {

Prefetcher::Prefetcher(RamStore* ram, DiskStore* disk, int64_t max_queued_blocks)
    : ram_(ram), disk_(disk), max_queued_blocks_(max_queued_blocks) {
  CHECK(ram_ != nullptr && disk_ != nullptr);
  CHECK_GT(max_queued_blocks, 0);
  worker_ = std::thread([this] { Loop(); });
}

Prefetcher::~Prefetcher() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    queue_.clear();
    queued_blocks_ = 0;
  }
  cv_.NotifyAll();
  worker_.join();
}

bool Prefetcher::Enqueue(std::vector<PrefetchBlock> blocks) {
  if (blocks.empty()) return true;
  {
    MutexLock lock(&mu_);
    const auto n = static_cast<int64_t>(blocks.size());
    if (stop_ || queued_blocks_ + n > max_queued_blocks_) {
      ++dropped_jobs_;
      return false;
    }
    queued_blocks_ += n;
    queue_.push_back(std::move(blocks));
  }
  cv_.NotifyAll();
  return true;
}

bool Prefetcher::WaitIfFetching(const Key& key) {
  MutexLock lock(&mu_);
  bool waited = false;
  while (!stop_) {
    size_t at = fetched_in_job_;
    while (at < fetching_.size() && fetching_[at] != key) ++at;
    const uint64_t job = job_number_;
    if (at < fetching_.size()) {
      cv_.Wait(&mu_, [&]() REQUIRES(mu_) {
        return stop_ || job_number_ != job || fetched_in_job_ > at || !busy_;
      });
      return true;
    }
    // The next job to start (the worker takes it as soon as it is free): wait for it to start,
    // or to be dropped.
    auto next_has_key = [&]() REQUIRES(mu_) {
      return !queue_.empty() &&
             std::ranges::any_of(queue_.front(), [&](const auto& b) { return b.key == key; });
    };
    if (!next_has_key()) break;
    cv_.Wait(&mu_, [&]() REQUIRES(mu_) {
      return stop_ || job_number_ != job || !next_has_key();
    });
    waited = true;
  }
  return waited;
}

void Prefetcher::Advance(size_t next) {
  {
    MutexLock lock(&mu_);
    fetched_in_job_ = next;
  }
  cv_.NotifyAll();
}

void Prefetcher::DropQueued() {
  {
    MutexLock lock(&mu_);
    queue_.clear();
    queued_blocks_ = 0;
  }
  cv_.NotifyAll();  // WaitIfFetching on a dropped job
}

void Prefetcher::Drain() {
  MutexLock lock(&mu_);
  cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return queue_.empty() && !busy_; });
}

PrefetcherStats Prefetcher::Stats() const {
  PrefetcherStats s;
  s.fetched = fetched_.load();
  s.failed = failed_.load();
  s.dropped_jobs = dropped_jobs_.load();
  s.spills = spills_.load();
  MutexLock lock(&mu_);
  s.queued_blocks = queued_blocks_;
  return s;
}

void Prefetcher::Loop() {
  RecordBuffer buffer;
  while (true) {
    std::vector<PrefetchBlock> job;
    {
      MutexLock lock(&mu_);
      busy_ = false;
      cv_.NotifyAll();  // Drain
      cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return stop_ || !queue_.empty(); });
      if (stop_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      queued_blocks_ -= static_cast<int64_t>(job.size());
      busy_ = true;
      fetching_.clear();
      for (const PrefetchBlock& b : job) fetching_.push_back(b.key);
      fetched_in_job_ = 0;
      ++job_number_;
    }
    Fetch(job, buffer);
    Advance(job.size());
  }
}

void Prefetcher::Fetch(const std::vector<PrefetchBlock>& job, RecordBuffer& buffer) {
  const Key& fingerprint = ram_->config().fingerprint;
  for (size_t i = 0; i < job.size(); ++i) {
    const PrefetchBlock& b = job[i];
    if (ram_->Refresh(b.key)) {  // there already (a pool eviction, or another job)
      Advance(i + 1);
      continue;
    }
    const BlockIdentity id{fingerprint, b.parent, b.key, b.ns, b.tokens};
    if (!buffer) buffer = ram_->NewRecord();  // (kept across a failed read)
    if (!disk_->ReadRecord(id, buffer.bytes())) {  // gone, or refused (removed and counted)
      ++failed_;
      return;
    }
    // A verified record of the same identity: Insert writes the same header again.
    spills_ += SpillToDisk(ram_->Insert(id, std::move(buffer)), *disk_);
    ++fetched_;
    Advance(i + 1);
  }
}

}  // namespace ember::prompt_cache
