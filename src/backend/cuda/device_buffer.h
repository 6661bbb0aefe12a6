// DeviceBuffer: a move-only owner of one cudaMalloc allocation (freed in the destructor).
// Size 0 holds no memory. Not thread-safe; the backend's single driving thread owns its buffers.
// Freeing implicitly synchronises the device, so buffers are only replaced between steps.
#pragma once

#include <cstddef>
#include <utility>

#include "backend/cuda/cuda_check.h"

namespace ember::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes_ > 0) CUDA_CHECK(cudaMalloc(&data_, bytes_));
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) CUDA_CHECK(cudaFree(data_));
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      DeviceBuffer dead(std::move(*this));
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace ember::cuda
