// libember_cuda.so: the CUDA backend behind three C entry points (abi.h), loaded at run time by
// backend/cuda_loader.cc. Symbols of the static libraries linked in stay hidden
// (-Wl,--exclude-libs,ALL); only these functions are exported.
#include "backend/cuda_module/abi.h"

#define EMBER_EXPORT extern "C" __attribute__((visibility("default")))

EMBER_EXPORT int ember_cuda_abi(int* options_size) {
  *options_size = static_cast<int>(sizeof(ember::CudaBackendOptions));
  return ember::kEmberCudaModuleAbi;
}

EMBER_EXPORT int ember_cuda_device_count() { return ember::CudaDeviceCount(); }

EMBER_EXPORT bool ember_cuda_create(int device, const ember::CudaBackendOptions* options,
                                    ember::Backend** out, std::string* error) {
  auto created = ember::CreateCudaBackend(device, *options);
  if (!created.ok()) {
    *error = created.status().message();
    return false;
  }
  *out = created.value().release();
  return true;
}
