#include "backend/cuda_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda_module/abi.h"

namespace ember {
namespace {

struct Module {
  bool driver = false;  // libcuda.so.1 loads
  std::string error;    // why the module is unusable; empty when it loaded
  EmberCudaDeviceCountFn device_count = nullptr;
  EmberCudaCreateFn create = nullptr;
};

std::string ExecutableDir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string path(buf, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

std::vector<std::string> Candidates() {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("EMBER_CUDA_MODULE"); env != nullptr && *env != '\0') {
    paths.emplace_back(env);
    return paths;  // an explicit choice is the only one
  }
  if (std::string dir = ExecutableDir(); !dir.empty()) paths.push_back(dir + "/libember_cuda.so");
#ifdef EMBER_CUDA_MODULE_BUILD_PATH
  paths.emplace_back(EMBER_CUDA_MODULE_BUILD_PATH);
#endif
  return paths;
}

Module LoadModule() {
  Module m;
  // Without the driver there is no device; don't map the CUDA runtime and cuBLAS to find out.
  if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL) == nullptr) {
    m.error = "no NVIDIA driver on this machine (libcuda.so.1 could not be loaded)";
    return m;
  }
  m.driver = true;
  std::string looked;
  for (const std::string& path : Candidates()) {
    if (access(path.c_str(), R_OK) != 0) {
      looked += (looked.empty() ? "" : ", ") + path;
      continue;
    }
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      m.error = path + ": cannot load the CUDA backend module: " + dlerror();
      return m;
    }
    auto abi = reinterpret_cast<EmberCudaAbiFn>(dlsym(handle, "ember_cuda_abi"));
    m.device_count =
        reinterpret_cast<EmberCudaDeviceCountFn>(dlsym(handle, "ember_cuda_device_count"));
    m.create = reinterpret_cast<EmberCudaCreateFn>(dlsym(handle, "ember_cuda_create"));
    int options_size = 0;
    if (abi == nullptr || m.device_count == nullptr || m.create == nullptr ||
        abi(&options_size) != kEmberCudaModuleAbi ||
        options_size != static_cast<int>(sizeof(CudaBackendOptions))) {
      m.device_count = nullptr;
      m.create = nullptr;
      m.error = path + ": CUDA backend module from a different build of ember";
    }
    return m;
  }
  m.error = "this ember has no CUDA backend module (libember_cuda.so; looked at " +
            (looked.empty() ? std::string("nothing") : looked) +
            "; set EMBER_CUDA_MODULE to its path)";
  return m;
}

const Module& GetModule() {
  static const Module module = LoadModule();
  return module;
}

}  // namespace

int CudaDevicesAvailable() {
  const Module& m = GetModule();
  return m.device_count != nullptr ? m.device_count() : 0;
}

bool CudaDriverPresent() { return GetModule().driver; }

Result<std::unique_ptr<Backend>> LoadCudaBackend(int device, const CudaBackendOptions& options) {
  const Module& m = GetModule();
  if (m.create == nullptr) return Status::Error("--device cuda: " + m.error);
  Backend* backend = nullptr;
  std::string error;
  if (!m.create(device, &options, &backend, &error)) return Status::Error(error);
  return std::unique_ptr<Backend>(backend);
}

}  // namespace ember
