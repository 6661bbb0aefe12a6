// StepRecorder: defers one step's kernel launches so that a repeated step (a decode step of the
// same batch shape) replays as one CUDA graph instead of hundreds of launches. Each op is
// recorded with its OpKind and a key — every scalar and pointer its launch depends on — and a
// closure that launches it. Ops are only ever appended: a fusion is a backend op of its own. Flush() either runs the closures eagerly, or looks the full key sequence up in a
// cache of instantiated graphs (exact comparison, so a replay launches exactly what the closures
// would) and captures a new graph on a miss. Per-step inputs must live at stable device
// addresses that are written before Flush (the plan upload). Not thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <list>
#include <new>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cuda/op_kind.h"

namespace ember::cuda {

// A launch closure stored in place (no heap allocation: a decode step records ~150 of them
// while the GPU waits). Move-only; F must fit kCapacity bytes.
class InlineOp {
 public:
  static constexpr size_t kCapacity = 288;
  InlineOp() = default;
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, InlineOp>>>
  InlineOp(F&& f) {  // NOLINT(google-explicit-constructor): lambdas convert as to std::function
    using Fn = std::decay_t<F>;
    static_assert(sizeof(Fn) <= kCapacity, "launch closure too large for InlineOp");
    static_assert(alignof(Fn) <= alignof(std::max_align_t));
    ::new (static_cast<void*>(storage_)) Fn(std::forward<F>(f));
    call_ = [](void* p, cudaStream_t st) { (*static_cast<Fn*>(p))(st); };
    move_ = [](void* dst, void* src) {
      if (dst != nullptr) ::new (dst) Fn(std::move(*static_cast<Fn*>(src)));
      static_cast<Fn*>(src)->~Fn();
    };
  }
  InlineOp(InlineOp&& o) noexcept { MoveFrom(o); }
  InlineOp& operator=(InlineOp&& o) noexcept {
    if (this != &o) {
      Reset();
      MoveFrom(o);
    }
    return *this;
  }
  InlineOp(const InlineOp&) = delete;
  InlineOp& operator=(const InlineOp&) = delete;
  ~InlineOp() { Reset(); }
  void operator()(cudaStream_t st) { call_(storage_, st); }

 private:
  void Reset() {
    if (move_ != nullptr) move_(nullptr, storage_);  // destroys
    call_ = nullptr;
    move_ = nullptr;
  }
  void MoveFrom(InlineOp& o) {
    if (o.move_ == nullptr) return;
    o.move_(storage_, o.storage_);
    call_ = o.call_;
    move_ = o.move_;
    o.call_ = nullptr;
    o.move_ = nullptr;
  }
  alignas(std::max_align_t) unsigned char storage_[kCapacity];
  void (*call_)(void*, cudaStream_t) = nullptr;
  void (*move_)(void* dst, void* src) = nullptr;  // dst null: only destroy src
};

class StepRecorder {
 public:
  using Op = InlineOp;

  StepRecorder(cudaStream_t stream, size_t max_graphs) : stream_(stream), max_graphs_(max_graphs) {}
  ~StepRecorder();
  StepRecorder(const StepRecorder&) = delete;
  StepRecorder& operator=(const StepRecorder&) = delete;

  void Record(OpKind kind, std::initializer_list<uint64_t> key, Op op);
  void Record(OpKind kind, std::span<const uint64_t> key, Op op);
  bool empty() const { return ops_.empty(); }
  // Enqueues the recorded ops on the stream (as a graph when use_graph) and clears them.
  void Flush(bool use_graph);

  // Profiling: eager flushes time each op with events, accumulated per OpKind. Costs a sync per
  // flush; graphs are not used while profiling.
  void set_profiling(bool on) { profiling_ = on; }
  bool profiling() const { return profiling_; }
  struct OpTime {
    OpKind kind = OpKind::kEmbedding;
    double total_ms = 0;
    int64_t calls = 0;
  };
  const std::vector<OpTime>& op_times() const { return op_times_; }

  int64_t graph_replays() const { return graph_replays_; }
  int64_t graph_captures() const { return graph_captures_; }

 private:
  struct Graph {
    std::vector<uint64_t> key;
    cudaGraphExec_t exec = nullptr;
  };

  cudaStream_t stream_;
  size_t max_graphs_;
  std::vector<Op> ops_;
  std::vector<uint64_t> key_;
  std::list<Graph> graphs_;  // most recently used first
  void FlushProfiled();
  bool profiling_ = false;
  std::vector<OpKind> kinds_;
  std::vector<cudaEvent_t> events_;  // reused; 2 per op
  std::vector<OpTime> op_times_;
  int64_t graph_replays_ = 0, graph_captures_ = 0;
};

// Key helpers: pointers and floats as 64-bit words.
inline uint64_t KeyOf(const void* p) { return reinterpret_cast<uintptr_t>(p); }
uint64_t KeyOf(float f);

}  // namespace ember::cuda
