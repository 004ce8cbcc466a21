#include "app/common/device_stats.h"

#include <stdexcept>

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

#if DITSTUDIO_WITH_CUDA
struct DeviceEventMarks::Impl {
  c10::DeviceIndex index = 0;
  std::vector<cudaEvent_t> events;  ///< created with timing, grown as marks are recorded
  size_t used = 0;
  static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess)
      throw std::runtime_error(std::string("DeviceEventMarks: ") + what + ": " +
                               cudaGetErrorString(e));
  }
  void grow(size_t n) {
    c10::cuda::CUDAGuard guard(index);
    while (events.size() < n) {
      cudaEvent_t e = nullptr;
      check(cudaEventCreateWithFlags(&e, cudaEventDefault), "cudaEventCreateWithFlags");
      events.push_back(e);
    }
  }
};

DeviceEventMarks::DeviceEventMarks(const c10::Device& d) {
  if (!d.is_cuda()) return;
  impl_ = std::make_unique<Impl>();
  impl_->index = d.index() < 0 ? c10::cuda::current_device() : d.index();
  impl_->grow(1024);  // created up front: no event creation inside the marked region
}

DeviceEventMarks::~DeviceEventMarks() {
  if (!impl_) return;
  c10::cuda::CUDAGuard guard(impl_->index);
  for (cudaEvent_t e : impl_->events) cudaEventDestroy(e);
}

void DeviceEventMarks::mark() {
  if (!impl_) return;
  if (impl_->used == impl_->events.size()) impl_->grow(2 * impl_->events.size());
  Impl::check(cudaEventRecord(impl_->events[impl_->used],
                              at::cuda::getCurrentCUDAStream(impl_->index).stream()),
              "cudaEventRecord");
  ++impl_->used;
}

size_t DeviceEventMarks::size() const { return impl_ ? impl_->used : 0; }

std::vector<double> DeviceEventMarks::intervalsMs() {
  std::vector<double> out;
  if (!impl_ || impl_->used < 2) return out;
  c10::cuda::CUDAGuard guard(impl_->index);
  Impl::check(cudaEventSynchronize(impl_->events[impl_->used - 1]), "cudaEventSynchronize");
  for (size_t i = 0; i + 1 < impl_->used; ++i) {
    float ms = 0;
    Impl::check(cudaEventElapsedTime(&ms, impl_->events[i], impl_->events[i + 1]),
                "cudaEventElapsedTime");
    out.push_back(ms);
  }
  return out;
}
#else
struct DeviceEventMarks::Impl {};
DeviceEventMarks::DeviceEventMarks(const c10::Device& d) { (void)d; }
DeviceEventMarks::~DeviceEventMarks() = default;
void DeviceEventMarks::mark() {}
size_t DeviceEventMarks::size() const { return 0; }
std::vector<double> DeviceEventMarks::intervalsMs() { return {}; }
#endif

}  // namespace dit
