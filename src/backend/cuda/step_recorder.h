// StepRecorder: defers one step's kernel launches so that a repeated step (a decode step of the
// same batch shape) replays as one CUDA graph instead of hundreds of launches. Each op is
// recorded with a key — every scalar and pointer its launch depends on — and a closure that
// launches it. Flush() either runs the closures eagerly, or looks the full key sequence up in a
// cache of instantiated graphs (exact comparison, so a replay launches exactly what the closures
// would) and captures a new graph on a miss. Per-step inputs must live at stable device
// addresses that are written before Flush (the plan upload). Not thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <list>
#include <span>
#include <vector>

namespace ember::cuda {

class StepRecorder {
 public:
  using Op = std::function<void(cudaStream_t)>;

  StepRecorder(cudaStream_t stream, size_t max_graphs) : stream_(stream), max_graphs_(max_graphs) {}
  ~StepRecorder();
  StepRecorder(const StepRecorder&) = delete;
  StepRecorder& operator=(const StepRecorder&) = delete;

  void Record(std::initializer_list<uint64_t> key, Op op);
  void Record(std::span<const uint64_t> key, Op op);
  // Replaces the most recently recorded op (its key and closure), to merge adjacent launches.
  // Only valid while !empty().
  void ReplaceLast(std::span<const uint64_t> key, Op op);
  bool empty() const { return ops_.empty(); }
  // Ops recorded since creation (ReplaceLast does not count): identifies "the last op".
  uint64_t records() const { return records_; }
  // Enqueues the recorded ops on the stream (as a graph when use_graph) and clears them.
  void Flush(bool use_graph);

  // Profiling: eager flushes time each op with events, accumulated per op tag (the first word
  // of its key). Costs a sync per flush; graphs are not used while profiling.
  void set_profiling(bool on) { profiling_ = on; }
  bool profiling() const { return profiling_; }
  struct OpTime {
    uint64_t tag = 0;
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
  std::vector<uint64_t> tags_;
  std::vector<cudaEvent_t> events_;  // reused; 2 per op
  std::vector<OpTime> op_times_;
  int64_t graph_replays_ = 0, graph_captures_ = 0;
  uint64_t records_ = 0;
  size_t last_key_start_ = 0;
};

// Key helpers: pointers and floats as 64-bit words.
inline uint64_t KeyOf(const void* p) { return reinterpret_cast<uintptr_t>(p); }
uint64_t KeyOf(float f);

}  // namespace ember::cuda
