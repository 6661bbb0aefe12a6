// CudaBackend's recurrent ops (qwen3_next's gated DeltaNet layers): the state slots in one device
// buffer (CopyStateSlot: one device-to-device copy on the step stream), CausalConv1dSilu and
// GatedDeltaRule as one launch each (recurrent.cu), and SigmoidGateMul. Each launch reads the
// sequences' state and snapshot slots from the uploaded plan, so a decode graph replays them for
// any slots; whether the step's sequences share a slot (padding rows, walked in plan order) is
// part of the graph key.
#include <string>

#include "backend/cuda/cuda_backend_impl.h"

namespace ember::cuda {

Status CudaBackend::AllocateStateSlots(int32_t num_slots, int64_t floats_per_slot) {
  if (state_.data() != nullptr) return Status::Error("the state slots are already allocated");
  if (num_slots <= 0 || floats_per_slot <= 0)
    return Status::Error("AllocateStateSlots needs positive num_slots and floats_per_slot");
  Flush();
  const size_t bytes =
      static_cast<size_t>(num_slots) * static_cast<size_t>(floats_per_slot) * sizeof(float);
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (bytes > free_bytes)
    return Status::Error("state slots: " + std::to_string(bytes) + " bytes requested, only " +
                         std::to_string(free_bytes) + " free on cuda:" + std::to_string(device_));
  state_ = DeviceBuffer(bytes);
  CUDA_CHECK(cudaMemsetAsync(state_.data(), 0, bytes, stream_.get()));
  state_slots_ = num_slots;
  state_floats_ = floats_per_slot;
  return Status::Ok();
}

Status CudaBackend::CopyStateSlot(int32_t src, int32_t dst) {
  if (state_.data() == nullptr) return Status::Error("CopyStateSlot before AllocateStateSlots");
  if (src < 0 || src >= state_slots_ || dst < 0 || dst >= state_slots_)
    return Status::Error("CopyStateSlot: slot " + std::to_string(src) + " -> " +
                         std::to_string(dst) + " outside the " + std::to_string(state_slots_) +
                         " allocated");
  if (src == dst) return Status::Ok();
  Flush();  // after every op recorded so far; later ops are launched after it on the stream
  const size_t n = static_cast<size_t>(state_floats_);
  CUDA_CHECK(cudaMemcpyAsync(state_.as<float>() + static_cast<size_t>(dst) * n,
                             state_.as<float>() + static_cast<size_t>(src) * n, n * sizeof(float),
                             cudaMemcpyDeviceToDevice, stream_.get()));
  return Status::Ok();
}

// The prompt cache's tiers (engine/state_tier.h): one slot's floats to or from host memory, after
// every op recorded so far; both return once the host buffer may be read or reused.
Status CudaBackend::CopyStateSlotToHost(int32_t slot, std::span<uint8_t> out) {
  if (state_.data() == nullptr) return Status::Error("state slot copy before AllocateStateSlots");
  EMBER_RETURN_IF_ERROR(CheckStateSlotCopy(slot, out.size(), state_slots_, state_floats_));
  Flush();
  const float* from = state_.as<float>() + static_cast<size_t>(slot) * state_floats_;
  CUDA_CHECK(cudaMemcpyAsync(out.data(), from, out.size(), cudaMemcpyDeviceToHost, stream_.get()));
  CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  return Status::Ok();
}

Status CudaBackend::CopyStateSlotFromHost(int32_t slot, std::span<const uint8_t> in) {
  if (state_.data() == nullptr) return Status::Error("state slot copy before AllocateStateSlots");
  EMBER_RETURN_IF_ERROR(CheckStateSlotCopy(slot, in.size(), state_slots_, state_floats_));
  Flush();
  CUDA_CHECK(cudaMemcpyAsync(state_.as<float>() + static_cast<size_t>(slot) * state_floats_,
                             in.data(), in.size(), cudaMemcpyHostToDevice, stream_.get()));
  CUDA_CHECK(cudaStreamSynchronize(stream_.get()));  // `in` may be reused once this returns
  return Status::Ok();
}

Status CudaBackend::CausalConv1dSilu(Tensor x, const Tensor& weight, int64_t state_offset) {
  if (state_.data() == nullptr) return Status::Error("CausalConv1dSilu before AllocateStateSlots");
  const int64_t channels = x.cols();
  const int32_t kernel = static_cast<int32_t>(weight.cols());
  CHECK(x.dtype == DType::kF32 && weight.dtype == DType::kF32);
  CHECK_EQ(weight.rows(), channels);
  CHECK_EQ(x.rows(), plan_.num_tokens);
  if (kernel < 1 || kernel > kMaxConvKernel)
    return Status::Error("CausalConv1dSilu: the cuda backend takes conv kernels of 1 to " +
                         std::to_string(kMaxConvKernel) + " taps, not " + std::to_string(kernel));
  CHECK(state_offset >= 0 && state_offset + (kernel - 1) * channels <= state_floats_);
  const PlanView plan = plan_;
  const bool serial = state_slots_shared_;
  float* state = state_.as<float>();
  const int64_t slot_floats = state_floats_;
  recorder_.Record(OpKind::kCausalConv1dSilu,
                   {KeyOf(x.data), KeyOf(weight.data), U(channels), U(kernel), KeyOf(state),
                    U(slot_floats), U(state_offset), KeyOf(plan.seqs), U(plan.num_seqs),
                    U(serial)},
                   [=](cudaStream_t st) {
                     LaunchCausalConv1dSilu(static_cast<float*>(x.data), channels,
                                            static_cast<const float*>(weight.data), kernel, state,
                                            slot_floats, state_offset, plan, serial, st);
                   });
  return Status::Ok();
}

Status CudaBackend::GatedDeltaRule(const GatedDeltaParams& p, const Tensor& qkv, const Tensor& ba,
                                   Tensor out) {
  if (state_.data() == nullptr) return Status::Error("GatedDeltaRule before AllocateStateSlots");
  if (p.k_head_dim < 1 || p.k_head_dim > kMaxDeltaKeyDim || p.num_k_heads < 1 ||
      p.num_v_heads % p.num_k_heads != 0)
    return Status::Error("GatedDeltaRule: the cuda backend takes key heads of up to " +
                         std::to_string(kMaxDeltaKeyDim) + " dims (this layer: " +
                         std::to_string(p.k_head_dim) + ") and value heads a multiple of them");
  const int64_t stride = 2 * int64_t{p.num_k_heads} * p.k_head_dim +
                         int64_t{p.num_v_heads} * p.v_head_dim;
  CHECK(qkv.dtype == DType::kF32 && ba.dtype == DType::kF32 && out.dtype == DType::kF32);
  CHECK_EQ(qkv.cols(), stride);
  CHECK_EQ(qkv.rows(), plan_.num_tokens);
  CHECK_EQ(ba.cols(), 2 * p.num_v_heads);
  CHECK_EQ(out.cols(), int64_t{p.num_v_heads} * p.v_head_dim);
  CHECK(p.a_log != nullptr && p.dt_bias != nullptr && p.a_log->dtype == DType::kF32 &&
        p.dt_bias->dtype == DType::kF32 && p.a_log->numel() == p.num_v_heads &&
        p.dt_bias->numel() == p.num_v_heads);
  const int64_t head_floats = int64_t{p.k_head_dim} * p.v_head_dim;
  CHECK(p.state_offset >= 0 && p.state_offset + p.num_v_heads * head_floats <= state_floats_);
  GatedDeltaArgs a;
  a.num_k_heads = p.num_k_heads;
  a.num_v_heads = p.num_v_heads;
  a.k_dim = p.k_head_dim;
  a.v_dim = p.v_head_dim;
  a.qkv = static_cast<const float*>(qkv.data);
  a.ba = static_cast<const float*>(ba.data);
  a.a_log = static_cast<const float*>(p.a_log->data);
  a.dt_bias = static_cast<const float*>(p.dt_bias->data);
  a.state = state_.as<float>();
  a.slot_floats = state_floats_;
  a.state_offset = p.state_offset;
  a.out = static_cast<float*>(out.data);
  const PlanView plan = plan_;
  const bool serial = state_slots_shared_;
  // The chunked form for long sequences where the step need not be batch-invariant (its values
  // depend in the last bits on how a sequence's rows fall into steps) and outside the parity mode.
  const int32_t min_rows = GatedDeltaChunkedMinRows(a.k_dim);
  if (switches_.delta_chunked && !f32_compute_ && !batch_invariant_ && !serial && min_rows > 0 &&
      max_query_len_ >= min_rows)
    a.chunked_min_rows = min_rows;
  recorder_.Record(
      OpKind::kGatedDeltaRule,
      {U(a.num_k_heads), U(a.num_v_heads), U(a.k_dim), U(a.v_dim), KeyOf(a.qkv), KeyOf(a.ba),
       KeyOf(a.a_log), KeyOf(a.dt_bias), KeyOf(a.state), U(a.slot_floats), U(a.state_offset),
       KeyOf(a.out), KeyOf(plan.seqs), U(plan.num_seqs), U(serial), U(a.chunked_min_rows)},
      [=](cudaStream_t st) { LaunchGatedDeltaRule(a, plan, serial, st); });
  return Status::Ok();
}

Status CudaBackend::SigmoidGateMul(Tensor x, const Tensor& gate) {
  CHECK(x.dtype == DType::kF32 && gate.dtype == DType::kF32);
  const int64_t rows = x.rows(), cols = x.cols(), groups = gate.cols();
  CHECK_EQ(gate.rows(), rows);
  CHECK(groups > 0 && cols % groups == 0) << ShapeString(x) << " gated by " << ShapeString(gate);
  recorder_.Record(OpKind::kSigmoidGateMul,
                   {KeyOf(x.data), KeyOf(gate.data), U(rows), U(cols), U(groups)},
                   [=](cudaStream_t st) {
                     LaunchSigmoidGateMul(static_cast<float*>(x.data),
                                          static_cast<const float*>(gate.data), rows, cols, groups,
                                          st);
                   });
  return Status::Ok();
}

}  // namespace ember::cuda
