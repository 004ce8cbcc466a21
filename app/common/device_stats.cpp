#include "app/common/device_stats.h"

#if DITSTUDIO_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace dit {

void deviceSync(const c10::Device& d) {
#if DITSTUDIO_WITH_CUDA
  if (d.is_cuda()) c10::cuda::device_synchronize();
#else
  (void)d;
#endif
}

DeviceMem deviceMemory(const c10::Device& d) {
  DeviceMem m;
#if DITSTUDIO_WITH_CUDA
  if (d.is_cuda()) {
    auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(d.index());
    const size_t agg = 0;  // StatType::AGGREGATE (the enum moved namespaces across 2.x releases)
    m.cur = st.allocated_bytes[agg].current;
    m.peak = st.allocated_bytes[agg].peak;
  }
#else
  (void)d;
#endif
  return m;
}

void resetDevicePeak(const c10::Device& d) {
#if DITSTUDIO_WITH_CUDA
  if (d.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(d.index());
#else
  (void)d;
#endif
}

std::optional<uint64_t> deviceMemoryAvailable(const c10::Device& d) {
#if DITSTUDIO_WITH_CUDA
  if (d.is_cuda()) {
    c10::cuda::CUDAGuard guard(d.index());
    size_t freeBytes = 0, totalBytes = 0;
    if (cudaMemGetInfo(&freeBytes, &totalBytes) != cudaSuccess) return std::nullopt;
    auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(d.index());
    const size_t agg = 0;  // StatType::AGGREGATE
    const int64_t cached = st.reserved_bytes[agg].current - st.allocated_bytes[agg].current;
    return static_cast<uint64_t>(freeBytes) + static_cast<uint64_t>(cached > 0 ? cached : 0);
  }
#else
  (void)d;
#endif
  return std::nullopt;
}

std::string deviceName(const c10::Device& d) {
#if DITSTUDIO_WITH_CUDA
  if (d.is_cuda()) return at::cuda::getDeviceProperties(d.index())->name;
#endif
  (void)d;
  return "cpu";
}

}  // namespace dit
