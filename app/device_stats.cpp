#include "app/device_stats.h"

#if DITSTUDIO_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
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

std::string deviceName(const c10::Device& d) {
#if DITSTUDIO_WITH_CUDA
  if (d.is_cuda()) return at::cuda::getDeviceProperties(d.index())->name;
#endif
  (void)d;
  return "cpu";
}

}  // namespace dit
