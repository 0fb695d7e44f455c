// DeviceProps and the context key (device_props.h). The driver API is reached through
// cudaGetDriverEntryPointByVersion, so the library links only the CUDA runtime.
#include "sm90/common/device_props.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <mutex>
#include <string>

#include "flash_kda/error.h"
#include "sm90/common/cuda_check.h"

namespace flash_kda::sm90 {
namespace {

using CtxGetCurrent = CUresult (*)(CUcontext*);
using CtxGetId = CUresult (*)(CUcontext, unsigned long long*);
using CtxGetDevResource = CUresult (*)(CUcontext, CUdevResource*, CUdevResourceType);
using StreamGetCtx = CUresult (*)(CUstream, CUcontext*);

// The driver entry points, looked up once; nullptr where the driver lacks them.
struct Driver {
  CtxGetCurrent get_current = nullptr;
  CtxGetId get_id = nullptr;
  CtxGetDevResource get_resource = nullptr;
  StreamGetCtx stream_ctx = nullptr;
  Driver() {
    lookup("cuStreamGetCtx", 9020, stream_ctx);
    lookup("cuCtxGetCurrent", 4000, get_current);
    lookup("cuCtxGetId", 12000, get_id);
    lookup("cuCtxGetDevResource", 12040, get_resource);
  }
  template <class Fn>
  static void lookup(const char* name, unsigned version, Fn& fn) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion(name, &p, version, cudaEnableDefault, &status) == cudaSuccess &&
        status == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<Fn>(p);
    else
      cudaGetLastError();  // not sticky, but leave no error behind
  }
};

const Driver& driver() {
  static const Driver d;
  return d;
}

// Keys derived from a device ordinal: the top bit set, so that they never equal a context id
// (which counts up from 1).
uint64_t device_key(int device) { return (uint64_t(1) << 63) | uint64_t(uint32_t(device)); }

CUcontext current_context() {
  CUcontext ctx = nullptr;
  const Driver& d = driver();
  if (d.get_current == nullptr || d.get_current(&ctx) != CUDA_SUCCESS) return nullptr;
  return ctx;
}

// The context `stream` belongs to: for a stream of a green context the CUcontext that stands for
// it (cuCtxFromGreenCtx's), for the NULL and per-thread streams the current one.
CUcontext stream_context(CUstream_st* stream) {
  CUcontext ctx = nullptr;
  const Driver& d = driver();
  if (d.stream_ctx != nullptr && d.stream_ctx(stream, &ctx) == CUDA_SUCCESS && ctx != nullptr) return ctx;
  return current_context();
}

DeviceProps query(int device, CUstream_st* stream) {
  DeviceProps d;
  d.device = device;
  auto attr = [device](int& out, cudaDeviceAttr a) {
    check_cuda(cudaDeviceGetAttribute(&out, a, device), "cudaDeviceGetAttribute");
  };
  attr(d.major, cudaDevAttrComputeCapabilityMajor);
  attr(d.minor, cudaDevAttrComputeCapabilityMinor);
  attr(d.num_sms, cudaDevAttrMultiProcessorCount);
  attr(d.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor);
  attr(d.smem_per_block_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin);
  attr(d.smem_reserved_per_block, cudaDevAttrReservedSharedMemoryPerBlock);
  // A green context runs its kernels on its own SM partition: that is the count to plan for.
  if (CUcontext ctx = stream_context(stream); ctx != nullptr && driver().get_resource != nullptr) {
    CUdevResource res{};
    if (driver().get_resource(ctx, &res, CU_DEV_RESOURCE_TYPE_SM) == CUDA_SUCCESS && res.sm.smCount > 0 &&
        int(res.sm.smCount) < d.num_sms)
      d.num_sms = int(res.sm.smCount);
  }
  return d;
}

}  // namespace

uint64_t stream_context_key(int device, CUstream_st* stream) {
  if (current_context() == nullptr && driver().get_current != nullptr)
    check_cuda(cudaSetDevice(device), "cudaSetDevice");  // makes the device's primary context current
  CUcontext ctx = stream_context(stream);
  unsigned long long id = 0;
  // The device is part of the key: properties are queried for `device`, and a stream of another
  // device's context must not leave them under that context's key.
  if (ctx != nullptr && driver().get_id != nullptr && driver().get_id(ctx, &id) == CUDA_SUCCESS && id != 0)
    return (uint64_t(uint32_t(device)) << 48) ^ id;
  return device_key(device);
}

DeviceProps stream_device_props(int device, uint64_t context_key, CUstream_st* stream) {
  constexpr int kCached = 64;
  struct Entry {
    uint64_t key;
    DeviceProps props;
  };
  static Entry cache[kCached];
  static int used = 0;
  static std::mutex mutex;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    for (int i = 0; i < used; ++i)
      if (cache[i].key == context_key) return cache[i].props;
  }
  const DeviceProps props = query(device, stream);  // throws: nothing is cached, the next call asks again
  const std::lock_guard<std::mutex> lock(mutex);
  if (used < kCached) cache[used++] = {context_key, props};
  return props;
}

}  // namespace flash_kda::sm90
