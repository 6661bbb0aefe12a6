#include "kv/block_pool.h"

#include <sstream>

#include "util/check.h"

namespace ember::kv {

namespace {
size_t CheckedCount(int32_t num_blocks) {
  CHECK_GE(num_blocks, 0);
  return static_cast<size_t>(num_blocks);
}
}  // namespace

BlockPool::BlockPool(int32_t num_blocks)
    : ref_counts_(CheckedCount(num_blocks), 0), prev_(num_blocks, -1), next_(num_blocks, -1) {
  for (int32_t b = 0; b < num_blocks; ++b) PushBack(b);
}

void BlockPool::Unlink(int32_t b) {
  if (prev_[b] >= 0)
    next_[prev_[b]] = next_[b];
  else
    head_ = next_[b];
  if (next_[b] >= 0)
    prev_[next_[b]] = prev_[b];
  else
    tail_ = prev_[b];
  prev_[b] = next_[b] = -1;
  --num_free_;
}

void BlockPool::PushFront(int32_t b) {
  prev_[b] = -1;
  next_[b] = head_;
  if (head_ >= 0)
    prev_[head_] = b;
  else
    tail_ = b;
  head_ = b;
  ++num_free_;
}

void BlockPool::PushBack(int32_t b) {
  next_[b] = -1;
  prev_[b] = tail_;
  if (tail_ >= 0)
    next_[tail_] = b;
  else
    head_ = b;
  tail_ = b;
  ++num_free_;
}

int32_t BlockPool::PopFront() {
  CHECK_GT(num_free_, 0) << "BlockPool::PopFront with no free block";
  const int32_t b = head_;
  Unlink(b);
  ref_counts_[b] = 1;
  return b;
}

void BlockPool::AddRef(int32_t b) {
  CHECK(b >= 0 && b < num_blocks()) << "block " << b;
  if (ref_counts_[b]++ == 0) Unlink(b);
}

bool BlockPool::Release(int32_t b, FreeEnd end) {
  CHECK(b >= 0 && b < num_blocks()) << "block " << b;
  CHECK_GT(ref_counts_[b], 0) << "double free of block " << b;
  if (--ref_counts_[b] > 0) return false;
  if (end == FreeEnd::kFront)
    PushFront(b);
  else
    PushBack(b);
  return true;
}

std::vector<int32_t> BlockPool::FreeList() const {
  std::vector<int32_t> out;
  out.reserve(num_free_);
  for (int32_t b = head_; b >= 0; b = next_[b]) out.push_back(b);
  return out;
}

std::string BlockPool::CheckInvariants() const {
  std::ostringstream err;
  const int32_t n = num_blocks();
  std::vector<char> seen(n, 0);
  int32_t count = 0;
  int32_t prev = -1;
  for (int32_t b = head_; b >= 0; b = next_[b]) {
    if (b >= n || seen[b]) {
      err << "free list revisits or overruns at block " << b;
      return err.str();
    }
    seen[b] = 1;
    if (prev_[b] != prev)
      err << "block " << b << " prev link " << prev_[b] << " != " << prev << "; ";
    if (ref_counts_[b] != 0)
      err << "free block " << b << " has ref count " << ref_counts_[b] << "; ";
    prev = b;
    ++count;
  }
  if (prev != tail_) err << "tail " << tail_ << " != last listed " << prev << "; ";
  if (count != num_free_)
    err << "free list holds " << count << " but num_free=" << num_free_ << "; ";
  for (int32_t b = 0; b < n; ++b) {
    if (ref_counts_[b] < 0) err << "block " << b << " negative ref count; ";
    if (ref_counts_[b] == 0 && !seen[b]) err << "block " << b << " has ref 0 but is not free; ";
  }
  return err.str();
}

}  // namespace ember::kv
