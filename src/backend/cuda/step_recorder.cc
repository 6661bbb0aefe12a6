#include "backend/cuda/step_recorder.h"

#include <bit>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace ember::cuda {

uint64_t KeyOf(float f) { return std::bit_cast<uint32_t>(f); }

const char* OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kEmbedding: return "Embedding";
    case OpKind::kRmsNorm: return "RmsNorm";
    case OpKind::kAddRmsNorm: return "AddRmsNorm";
    case OpKind::kMatMulCublas: return "MatMul(cublas)";
    case OpKind::kRope: return "Rope";
    case OpKind::kWriteKv: return "WriteKv";
    case OpKind::kAttention: return "Attention";
    case OpKind::kSiluMul: return "SiluMul";
    case OpKind::kGeluTanhMul: return "GeluTanhMul";
    case OpKind::kAdd: return "Add";
    case OpKind::kSoftcap: return "Softcap";
    case OpKind::kGatherLogitsRows: return "GatherLogitsRows";
    case OpKind::kMatMulGemv: return "MatMul(gemv)";
    case OpKind::kMatMulGemm: return "MatMul(gemm)";
    case OpKind::kRopeWriteKv: return "RopeWriteKv";
    case OpKind::kMatMulGemvActivation: return "MatMul(gemv)+act";
    case OpKind::kRopeAttention: return "RopeAttention";
    case OpKind::kMoeMlp: return "MoeMlp";
    case OpKind::kArgmaxRows: return "ArgmaxRows";
    case OpKind::kLoraDelta: return "LoraDelta";
    case OpKind::kCausalConv1dSilu: return "CausalConv1dSilu";
    case OpKind::kGatedDeltaRule: return "GatedDeltaRule";
    case OpKind::kSigmoidGateMul: return "SigmoidGateMul";
    case OpKind::kMlaAttention: return "MlaAttention";
    case OpKind::kHadamardRows: return "HadamardRows";
    case OpKind::kLoraGemm:
      return "LoraGemm";
    case OpKind::kLoraStacked:
      return "LoraStacked";
  }
  return "?";
}

StepRecorder::~StepRecorder() {
  for (Graph& g : graphs_) CUDA_CHECK(cudaGraphExecDestroy(g.exec));
  for (cudaEvent_t e : events_) CUDA_CHECK(cudaEventDestroy(e));
}

void StepRecorder::Record(OpKind kind, std::initializer_list<uint64_t> key, Op op) {
  Record(kind, std::span<const uint64_t>(key.begin(), key.size()), std::move(op));
}

void StepRecorder::Record(OpKind kind, std::span<const uint64_t> key, Op op) {
  // The op boundary (so keys cannot alias across ops), the kind, then the op's words.
  key_.push_back(0xC0FFEEull + 1 + key.size());
  key_.push_back(static_cast<uint64_t>(kind));
  key_.insert(key_.end(), key.begin(), key.end());
  kinds_.push_back(kind);
  ops_.push_back(std::move(op));
}

void StepRecorder::FlushProfiled() {
  while (events_.size() < 2 * ops_.size()) {
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  LaunchSpin(20'000'000, stream_);  // 20 ms: the host queues the whole step before it runs
  for (size_t i = 0; i < ops_.size(); ++i) {
    CUDA_CHECK(cudaEventRecord(events_[2 * i], stream_));
    ops_[i](stream_);
    CUDA_CHECK(cudaEventRecord(events_[2 * i + 1], stream_));
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (size_t i = 0; i < ops_.size(); ++i) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, events_[2 * i], events_[2 * i + 1]));
    auto it = op_times_.begin();
    while (it != op_times_.end() && it->kind != kinds_[i]) ++it;
    if (it == op_times_.end()) it = op_times_.insert(op_times_.end(), OpTime{kinds_[i], 0, 0});
    it->total_ms += ms;
    ++it->calls;
  }
}

void StepRecorder::Flush(bool use_graph) {
  if (ops_.empty()) return;
  if (profiling_) {
    FlushProfiled();
  } else if (!use_graph) {
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
  kinds_.clear();
}

}  // namespace ember::cuda
