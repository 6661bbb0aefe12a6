#include "backend/cuda/step_recorder.h"

#include <bit>

#include "backend/cuda/cuda_check.h"

namespace ember::cuda {

uint64_t KeyOf(float f) { return std::bit_cast<uint32_t>(f); }

StepRecorder::~StepRecorder() {
  for (Graph& g : graphs_) CUDA_CHECK(cudaGraphExecDestroy(g.exec));
}

void StepRecorder::Record(std::initializer_list<uint64_t> key, Op op) {
  key_.push_back(0xC0FFEEull + key.size());  // op boundary, so keys cannot alias across ops
  key_.insert(key_.end(), key.begin(), key.end());
  ops_.push_back(std::move(op));
}

void StepRecorder::Flush(bool use_graph) {
  if (ops_.empty()) return;
  if (!use_graph) {
    for (Op& op : ops_) op(stream_);
  } else {
    auto it = graphs_.begin();
    while (it != graphs_.end() && it->key != key_) ++it;
    if (it != graphs_.end()) {
      graphs_.splice(graphs_.begin(), graphs_, it);  // move to front (LRU)
      ++graph_replays_;
    } else {
      cudaGraph_t graph = nullptr;
      CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      for (Op& op : ops_) op(stream_);
      CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
      Graph g;
      g.key = key_;
      CUDA_CHECK(cudaGraphInstantiate(&g.exec, graph, 0));
      CUDA_CHECK(cudaGraphDestroy(graph));
      graphs_.push_front(std::move(g));
      ++graph_captures_;
      while (graphs_.size() > max_graphs_) {
        CUDA_CHECK(cudaGraphExecDestroy(graphs_.back().exec));  // freed after in-flight launches
        graphs_.pop_back();
      }
    }
    CUDA_CHECK(cudaGraphLaunch(graphs_.front().exec, stream_));
  }
  ops_.clear();
  key_.clear();
}

}  // namespace ember::cuda
