// See cupti_activity.h. The CUPTI functions are looked up in libcupti at run time; the record layouts
// come from the toolkit's headers (CUpti_ActivityKernel10, CUpti_ActivityMemcpy6,
// CUpti_ActivityMemset4 of CUDA 13).
#include "executor/cuda/cupti_activity.h"

#include <cupti.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <mutex>

#include "common/error.h"

namespace slidedp::exec {
namespace {

struct Api {
  void* lib = nullptr;
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*get_timestamp)(uint64_t*) = nullptr;
  CUptiResult (*stream_id_ex)(CUcontext, CUstream, uint8_t, uint32_t*) = nullptr;
};

Api& api() {
  static Api a;
  return a;
}

// Records from completed buffers, until take() collects them.
std::mutex g_mutex;
std::vector<DeviceActivity> g_records;

constexpr size_t kBufferBytes = size_t{8} << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = kBufferBytes;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *max_records = 0;  // as many as fit
}

const char* memcpy_name(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
    default: return "memcpy";
  }
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<DeviceActivity> got;
  CUpti_Activity* record = nullptr;
  while (api().next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
    DeviceActivity a;
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      a = {DeviceActivity::Kind::kKernel, k->name ? k->name : "kernel", k->deviceId, k->streamId, k->correlationId,
           k->start, k->end};
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      a = {DeviceActivity::Kind::kMemcpy, memcpy_name(m->copyKind), m->deviceId, m->streamId, m->correlationId,
           m->start, m->end};
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      a = {DeviceActivity::Kind::kMemset, "memset", m->deviceId, m->streamId, m->correlationId, m->start, m->end};
    } else {
      continue;
    }
    got.push_back(std::move(a));
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_records.insert(g_records.end(), got.begin(), got.end());
}

template <typename F>
void load(F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(api().lib, name));
  if (f == nullptr) throw InputError("--trace-kernels", fmt::format("libcupti has no {}", name));
}

void check(CUptiResult r, const char* what) {
  if (r != CUPTI_SUCCESS) throw InputError("--trace-kernels", fmt::format("CUPTI {} failed (CUptiResult {})", what, static_cast<int>(r)));
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};

}  // namespace

CuptiActivity::CuptiActivity() {
  Api& a = api();
  if (a.lib == nullptr) {
    for (const char* name : {"libcupti.so.13", "libcupti.so"})
      if ((a.lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    if (a.lib == nullptr)
      throw InputError("--trace-kernels", fmt::format("cannot open libcupti.so.13 (CUDA's extras/CUPTI or the toolkit's lib "
                                                      "folder on LD_LIBRARY_PATH): {}", dlerror()));
    load(a.register_callbacks, "cuptiActivityRegisterCallbacks");
    load(a.enable, "cuptiActivityEnable");
    load(a.disable, "cuptiActivityDisable");
    load(a.flush_all, "cuptiActivityFlushAll");
    load(a.next_record, "cuptiActivityGetNextRecord");
    load(a.get_timestamp, "cuptiGetTimestamp");
    load(a.stream_id_ex, "cuptiGetStreamIdEx");
  }
  check(a.register_callbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  for (CUpti_ActivityKind k : kKinds) check(a.enable(k), "cuptiActivityEnable");
}

CuptiActivity::~CuptiActivity() {
  api().flush_all(1);  // forced: deliver what is recorded before the records stop
  for (CUpti_ActivityKind k : kKinds) api().disable(k);
}

uint32_t CuptiActivity::stream_id(cudaStream_t stream) const {
  uint32_t id = 0;
  check(api().stream_id_ex(nullptr, reinterpret_cast<CUstream>(stream), 0, &id), "cuptiGetStreamIdEx");
  return id;
}

uint64_t CuptiActivity::timestamp_ns() const {
  uint64_t t = 0;
  check(api().get_timestamp(&t), "cuptiGetTimestamp");
  return t;
}

std::vector<DeviceActivity> CuptiActivity::take() {
  check(api().flush_all(1), "cuptiActivityFlushAll");
  std::lock_guard<std::mutex> lock(g_mutex);
  return std::exchange(g_records, {});
}

}  // namespace slidedp::exec
