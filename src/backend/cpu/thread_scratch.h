// The calling thread's scratch buffer per tag type (one buffer per tag, so a kernel can hold
// several at once): 64-byte aligned, grows, never shrinks. The pool's threads live as long as the
// backend, so calls reuse their buffers instead of allocating (a per-call malloc of a large
// buffer is an mmap plus page faults).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <utility>

#include "util/check.h"

namespace ember::cpu {

struct ThreadScratchFree {
  void operator()(void* p) const { std::free(p); }
};

template <typename Tag>
uint8_t* ThreadScratch(size_t bytes) {
  thread_local std::pair<std::unique_ptr<uint8_t, ThreadScratchFree>, size_t> buffer;
  if (buffer.second < bytes) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    buffer.first.reset(static_cast<uint8_t*>(std::aligned_alloc(64, rounded)));
    CHECK(buffer.first != nullptr)
        << "out of memory allocating " << rounded << " bytes of kernel scratch";
    buffer.second = bytes;
  }
  return buffer.first.get();
}

}  // namespace ember::cpu
