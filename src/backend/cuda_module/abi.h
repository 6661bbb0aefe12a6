// The C entry points of libember_cuda.so (the CUDA backend module) that cuda_loader.cc looks up
// with dlsym. The module and the executable are built from the same tree; kEmberCudaModuleAbi and
// sizeof(CudaBackendOptions) catch a module left over from another build.
#pragma once

#include <string>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"

namespace ember {
inline constexpr int kEmberCudaModuleAbi = 4;
}  // namespace ember

extern "C" {
using EmberCudaAbiFn = int (*)(int* options_size);
// Returns the device count (0 on any runtime error).
using EmberCudaDeviceCountFn = int (*)();
// On success stores a new backend in *out (the caller owns it) and returns true; otherwise
// stores the reason in *error.
using EmberCudaCreateFn = bool (*)(int device, const ember::CudaBackendOptions* options,
                                   ember::Backend** out, std::string* error);
}
