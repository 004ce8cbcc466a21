// Device helpers shared by ditstudio-worker and ditstudio-bench: synchronisation and the CUDA
// caching allocator's memory figures. On CPU builds (or CPU devices) they are no-ops / zeros.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dit {

struct DeviceMem {
  int64_t cur = 0;   ///< bytes allocated by the CUDA caching allocator now (aggregate)
  int64_t peak = 0;  ///< peak since start or the last resetDevicePeak
};

/// Waits for the device's queued work (cudaDeviceSynchronize); no-op on CPU.
void deviceSync(const c10::Device& d);
/// Allocated bytes on `d` (CUDA caching allocator stats); zeros on CPU.
DeviceMem deviceMemory(const c10::Device& d);
/// Resets the peak of deviceMemory(d).
void resetDevicePeak(const c10::Device& d);
/// Bytes a CUDA device can still hand out: cudaMemGetInfo's free memory plus what the caching
/// allocator holds unused. nullopt on CPU devices (use hostMemoryAvailable) and CPU-only builds.
std::optional<uint64_t> deviceMemoryAvailable(const c10::Device& d);
/// The device's marketing name ("NVIDIA H200"), or "cpu".
std::string deviceName(const c10::Device& d);

/// Timestamps on a CUDA device's current stream: mark() records a timing event there
/// (cudaEventRecord, no synchronisation), intervalsMs() waits once for the last mark and returns
/// the device time between consecutive marks (cudaEventElapsedTime, milliseconds). On CPU
/// devices and CPU-only builds enabled() is false, mark() does nothing and intervalsMs() is empty.
class DeviceEventMarks {
 public:
  explicit DeviceEventMarks(const c10::Device& d);
  ~DeviceEventMarks();
  DeviceEventMarks(const DeviceEventMarks&) = delete;
  DeviceEventMarks& operator=(const DeviceEventMarks&) = delete;
  bool enabled() const { return impl_ != nullptr; }
  /// Records a mark now (on the device's current stream). Throws std::runtime_error when the
  /// CUDA runtime refuses.
  void mark();
  /// Marks recorded so far.
  size_t size() const;
  /// size() - 1 values: interval i lies between mark i and mark i + 1. Synchronises on the last
  /// mark. Throws std::runtime_error when the CUDA runtime refuses.
  std::vector<double> intervalsMs();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dit
