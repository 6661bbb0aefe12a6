#include "backend/cuda/runtime_switches.h"

#include <algorithm>
#include <cstdlib>

namespace ember::cuda {
namespace {

std::string EnvString(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

}  // namespace

RuntimeSwitches RuntimeSwitches::FromEnvironment() {
  RuntimeSwitches s;
  if (const char* moe_mma = std::getenv("EMBER_MOE_MMA"); moe_mma != nullptr) {
    const int mode = std::atoi(moe_mma);  // (set but not a number: 0)
    s.moe_mma = mode == 0 ? MoeMma::kNever : mode == 1 ? MoeMma::kAlways : MoeMma::kAuto;
  }
  s.gemm_tiled_variant = std::atoi(EnvString("EMBER_GEMM_VARIANT").c_str());
  if (const char* fold = std::getenv("EMBER_LORA_BIAS_FOLD"); fold != nullptr)
    s.lora_bias_fold = std::atoi(fold) != 0;
  if (const std::string fused = EnvString("EMBER_LORA_GEMV_FUSED"); !fused.empty())
    s.lora_gemv_fused = std::atoi(fused.c_str()) != 0;
  if (const std::string order = EnvString("EMBER_LORA_ROW_ORDER"); !order.empty())
    s.lora_row_order = std::atoi(order.c_str()) != 0;
  if (const std::string rows = EnvString("EMBER_LORA_GEMM_ROWS"); !rows.empty())
    s.lora_gemm_rows = std::atoll(rows.c_str());
  if (const std::string rows = EnvString("EMBER_LORA_STACKED_ROWS"); !rows.empty())
    s.lora_stacked_rows = std::atoll(rows.c_str());
  if (const std::string rows = EnvString("EMBER_LORA_UPDATE_FIRST_ROWS"); !rows.empty())
    s.lora_update_first_rows = std::atoll(rows.c_str());
  if (const std::string flash = EnvString("EMBER_MLA_FLASH"); !flash.empty())
    s.mla_flash = std::atoi(flash.c_str()) != 0;
  s.mla_flash_m_tiles = std::atoi(EnvString("EMBER_MLA_M_TILES").c_str());
  if (const std::string keys = EnvString("EMBER_MLA_SPLIT_KEYS"); !keys.empty())
    s.mla_split_keys = std::max(0, std::atoi(keys.c_str())) / 32 * 32;
  if (const std::string chunked = EnvString("EMBER_DELTA_CHUNKED"); !chunked.empty())
    s.delta_chunked = std::atoi(chunked.c_str()) != 0;
  if (const std::string direct = EnvString("EMBER_KV_DIRECT"); !direct.empty())
    s.kv_direct = std::atoi(direct.c_str()) != 0;
  if (const std::string graphs = EnvString("EMBER_CUDA_GRAPHS"); !graphs.empty())
    s.graphs = std::atoi(graphs.c_str()) != 0;
  s.profile_out = EnvString("EMBER_CUDA_PROFILE_OUT");
  s.trace_out = EnvString("EMBER_CUDA_TRACE_OUT");
  return s;
}

}  // namespace ember::cuda
