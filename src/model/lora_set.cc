#include "model/lora_set.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "util/check.h"

namespace ember {

Result<std::unique_ptr<LoraSet>> LoraSet::Create(Backend* backend, const ModelConfig* config,
                                                 int32_t max_loras, int32_t max_rank) {
  if (const std::string why = backend->LoraUnsupported(); !why.empty())
    return Status::Error("--lora: " + why);
  if (const std::string why = LoraUnsupportedModel(*config); !why.empty())
    return Status::Error("--lora: " + why);
  if (max_loras < 1 || max_loras > 1024) return Status::Error("--max-loras: must be 1..1024");
  if (max_rank < 1 || max_rank > kMaxLoraRankLimit)
    return Status::Error("--max-lora-rank: must be 1.." + std::to_string(kMaxLoraRankLimit));
  return std::unique_ptr<LoraSet>(new LoraSet(backend, config, max_loras, max_rank));
}

LoraSet::LoraSet(Backend* backend, const ModelConfig* config, int32_t max_loras, int32_t max_rank)
    : backend_(backend),
      config_(config),
      max_rank_(max_rank),
      slots_(static_cast<size_t>(max_loras)) {}

Result<std::optional<int32_t>> LoraSet::Acquire(uint64_t digest, const std::string& dir) {
  CHECK_NE(digest, 0u);
  int32_t chosen = SlotOf(digest);
  if (chosen < 0) {
    // A free slot, else the least recently used idle one.
    for (size_t i = 0; i < slots_.size() && chosen < 0; ++i) {
      if (slots_[i].users == 0 && slots_[i].digest == 0) chosen = static_cast<int32_t>(i);
    }
    if (chosen < 0) {
      for (size_t i = 0; i < slots_.size(); ++i) {
        if (slots_[i].users > 0) continue;
        if (chosen < 0 || slots_[i].last_used < slots_[static_cast<size_t>(chosen)].last_used)
          chosen = static_cast<int32_t>(i);
      }
    }
    if (chosen < 0) return std::optional<int32_t>();
    EMBER_RETURN_IF_ERROR(Load(chosen, dir, digest));
  }
  Slot& slot = slots_[static_cast<size_t>(chosen)];
  ++slot.users;
  slot.last_used = ++clock_;
  return std::optional<int32_t>(chosen);
}

bool LoraSet::Prepared(uint64_t digest, const std::string& dir) {
  CHECK_NE(digest, 0u);
  if (SlotOf(digest) >= 0) return true;
  if (const auto it = FindPreparation(digest, dir); it != preparing_.end())
    return it->adapter.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  for (auto it = preparing_.begin();
       preparing_.size() >= MaxHeldReads() && it != preparing_.end();) {
    if (it->adapter.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      it = preparing_.erase(it);
    } else {
      ++it;
    }
  }
  StartRead(digest, dir);
  return false;
}

void LoraSet::Prefetch(uint64_t digest, const std::string& dir) {
  CHECK_NE(digest, 0u);
  if (SlotOf(digest) >= 0 || FindPreparation(digest, dir) != preparing_.end() ||
      preparing_.size() >= MaxHeldReads())
    return;
  StartRead(digest, dir);
}

int32_t LoraSet::SlotOf(uint64_t digest) const {
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].digest == digest) return static_cast<int32_t>(i);
  return -1;
}

void LoraSet::StartRead(uint64_t digest, const std::string& dir) {
  const ModelConfig* config = config_;
  const int32_t max_rank = max_rank_;
  preparing_.push_back(
      Preparation{digest, dir, std::async(std::launch::async, [dir, config, max_rank] {
                    return LoadLoraAdapter(dir, *config, max_rank);
                  })});
}

std::deque<LoraSet::Preparation>::iterator LoraSet::FindPreparation(uint64_t digest,
                                                                    const std::string& dir) {
  return std::find_if(preparing_.begin(), preparing_.end(),
                      [&](const Preparation& p) { return p.digest == digest && p.dir == dir; });
}

void LoraSet::Release(int32_t slot) {
  Slot& s = slots_[static_cast<size_t>(slot)];
  CHECK_GT(s.users, 0);
  --s.users;
  s.last_used = ++clock_;
}

Status LoraSet::Load(int32_t index, const std::string& dir, uint64_t digest) {
  Slot& slot = slots_[static_cast<size_t>(index)];
  CHECK_EQ(slot.users, 0);
  // The files as Prepared's thread read them, else read here.
  const auto preparation = FindPreparation(digest, dir);
  const bool prepared = preparation != preparing_.end();
  Result<LoraAdapter> read =
      prepared ? preparation->adapter.get() : LoadLoraAdapter(dir, *config_, max_rank_);
  if (prepared) preparing_.erase(preparation);
  EMBER_ASSIGN_OR_RETURN(LoraAdapter adapter, std::move(read));
  if (adapter.digest != digest)
    return Status::Error("LoRA adapter " + dir +
                         ": its files changed since it was registered (register it again)");
  if (slot.digest != 0) ++evictions_;
  slot.digest = 0;
  slot.tensors.clear();
  slot.host = std::move(adapter);
  // Every matrix of the adapter in one upload (the backend reuses the slot's storage).
  std::vector<LoraHostMatrix> matrices;
  const int64_t r = slot.host.config.rank;
  for (size_t l = 0; l < slot.host.layers.size(); ++l) {
    for (size_t t = 0; t < kNumLoraTargets; ++t) {
      LoraMatrices& m = slot.host.layers[l][t];
      if (m.empty()) continue;
      const auto site = static_cast<int64_t>(l * kNumLoraTargets + t);
      matrices.push_back(LoraHostMatrix{m.a.data(), r, m.in, site});
      matrices.push_back(LoraHostMatrix{m.b.data(), m.out, r, site});
    }
  }
  EMBER_ASSIGN_OR_RETURN(std::vector<Tensor> tensors, backend_->UploadLoraSlot(index, matrices));
  CHECK_EQ(tensors.size(), matrices.size());
  slot.tensors.resize(slot.host.layers.size());
  size_t next = 0;
  for (size_t l = 0; l < slot.host.layers.size(); ++l) {
    for (size_t t = 0; t < kNumLoraTargets; ++t) {
      LoraMatrices& m = slot.host.layers[l][t];
      if (m.empty()) continue;
      slot.tensors[l][t] = Weights{tensors[next], tensors[next + 1]};
      next += 2;
    }
  }
  // A backend that copied the matrices no longer reads them.
  if (!backend_->KeepsHostWeights()) slot.host.layers = {};
  slot.digest = digest;
  ++loads_;
  if (prepared) ++prepared_loads_;
  return Status::Ok();
}

void LoraSet::BeginStep(const BatchPlan& plan) {
  runs_.clear();
  for (const SequenceSlice& s : plan.seqs) {
    if (s.lora_slot < 0 || s.query_len == 0) continue;
    CHECK_LT(s.lora_slot, max_loras());
    CHECK_NE(slots_[static_cast<size_t>(s.lora_slot)].digest, 0u);
    if (!runs_.empty() && runs_.back().slot == s.lora_slot &&
        runs_.back().first_row + runs_.back().rows == s.query_start) {
      runs_.back().rows += s.query_len;
    } else {
      runs_.push_back(Run{s.query_start, s.query_len, s.lora_slot});
    }
  }
}

bool LoraSet::StepTargets(LoraTarget target) const {
  for (const Run& run : runs_) {
    for (const auto& layer : slots_[static_cast<size_t>(run.slot)].tensors) {
      if (layer[static_cast<size_t>(target)].a) return true;
    }
  }
  return false;
}

std::span<const LoraSegment> LoraSet::Segments(int32_t layer, LoraTarget target) {
  std::vector<LoraSegment>& segments = segments_[static_cast<size_t>(target)];
  segments.clear();
  for (const Run& run : runs_) {
    const Weights& w = slots_[static_cast<size_t>(run.slot)]
                           .tensors[static_cast<size_t>(layer)][static_cast<size_t>(target)];
    if (w.a) segments.push_back(LoraSegment{run.first_row, run.rows, &*w.a, &*w.b});
  }
  return segments;
}

}  // namespace ember
