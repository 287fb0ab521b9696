// Profile builds only (-DAUGUR_CUDA_PROFILE=ON). AUGUR_CUDA_TIMELINE=path:
// every kernel's and copy's start and end on the GPU, from CUPTI's activity
// records, written to path (CSV) at exit. For seeing where a decode step
// loses time between kernels (PDL overlap, small kernels, attention) without
// nsys. AUGUR_CUDA_TIMELINE_API=1 adds the runtime and driver calls of 20 us
// or more as rows "api_NAME" (stream = the calling thread), for seeing where
// the host waits: a first launch that loads its module, an allocation, a
// synchronisation. libcupti is opened with dlopen only when asked (AUGUR_CUDA_CUPTI
// names the file, else libcupti.so.13 from the loader's path), so nothing
// links against it. scripts/timeline.py reads the file.
#include <cupti_activity.h>
#include <cupti_callbacks.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/common.cuh"

namespace augur::cuda {
namespace {

struct KernelRecord {
  uint64_t start, end;
  uint32_t grid, block, smem, graph, correlation, stream;
  std::string name;
};

struct Timeline {
  std::string path;
  std::mutex mutex;
  std::vector<KernelRecord> kernels;
  CUptiResult (*get_next)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*callback_name)(CUpti_CallbackDomain, uint32_t, const char**) = nullptr;
};

constexpr uint64_t kApiMinNs = 20000;  // shorter calls are launches that cost what they should

Timeline* g_timeline = nullptr;
constexpr size_t kBufferBytes = size_t(8) << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

std::string demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(name, nullptr, nullptr, &status), std::free);
  return status == 0 && d != nullptr ? std::string(d.get()) : std::string(name);
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  Timeline* t = g_timeline;
  CUpti_Activity* rec = nullptr;
  std::lock_guard<std::mutex> lock(t->mutex);
  while (t->get_next(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      // Copies as rows of their own: "memcpy_HtoD" etc., grid = bytes.
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      static const char* kinds[] = {"?",    "HtoD", "DtoH", "HtoA", "AtoH", "AtoA",
                                    "AtoD", "DtoA", "DtoD", "HtoH", "PtoP"};
      KernelRecord r;
      r.start = m->start, r.end = m->end;
      r.grid = uint32_t(m->bytes), r.graph = m->graphId, r.correlation = m->correlationId, r.stream = m->streamId;
      r.name = std::string("memcpy_") + (m->copyKind < 11 ? kinds[m->copyKind] : "?");
      t->kernels.push_back(std::move(r));
      continue;
    }
    if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME || rec->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
      if (a->end - a->start < kApiMinNs) continue;
      const char* name = nullptr;
      t->callback_name(rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API,
                       a->cbid, &name);
      KernelRecord r;
      r.start = a->start, r.end = a->end, r.correlation = a->correlationId, r.stream = a->threadId;
      r.name = std::string("api_") + (name != nullptr ? name : std::to_string(a->cbid));
      t->kernels.push_back(std::move(r));
      continue;
    }
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    KernelRecord r;
    r.start = k->start, r.end = k->end;
    r.grid = uint32_t(k->gridX) * uint32_t(k->gridY) * uint32_t(k->gridZ), r.block = uint32_t(k->blockX);
    r.smem = uint32_t(k->dynamicSharedMemory), r.graph = k->graphId, r.correlation = k->correlationId;
    r.stream = k->streamId, r.name = demangle(k->name);
    t->kernels.push_back(std::move(r));
  }
  std::free(buffer);
}

void write_timeline() {
  Timeline* t = g_timeline;
  if (t == nullptr) return;
  cudaDeviceSynchronize();
  t->flush_all(1);  // CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
  std::lock_guard<std::mutex> lock(t->mutex);
  FILE* f = std::fopen(t->path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "[cuda] AUGUR_CUDA_TIMELINE: cannot write %s\n", t->path.c_str());
    return;
  }
  std::fprintf(f, "start_ns,end_ns,grid,block,smem,graph,correlation,stream,name\n");
  for (const KernelRecord& k : t->kernels) {
    std::string name = k.name;
    for (char& c : name)
      if (c == '"') c = '\'';
    std::fprintf(f, "%llu,%llu,%u,%u,%u,%u,%u,%u,\"%s\"\n", static_cast<unsigned long long>(k.start),
                 static_cast<unsigned long long>(k.end), k.grid, k.block, k.smem, k.graph, k.correlation, k.stream,
                 name.c_str());
  }
  std::fclose(f);
  std::fprintf(stderr, "[cuda] timeline: %zu kernels and copies written to %s\n", t->kernels.size(), t->path.c_str());
}

}  // namespace

// Called first thing in Context(): CUPTI must see the context being created.
void timeline_start() {
  const char* path = std::getenv("AUGUR_CUDA_TIMELINE");
  if (path == nullptr || *path == 0 || g_timeline != nullptr) return;
  const char* lib = std::getenv("AUGUR_CUDA_CUPTI");
  void* h = dlopen(lib != nullptr ? lib : "libcupti.so.13", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) fail("[cuda] AUGUR_CUDA_TIMELINE: cannot load CUPTI (", dlerror(), "); set AUGUR_CUDA_CUPTI");
  auto sym = [&](const char* name) {
    void* p = dlsym(h, name);
    if (p == nullptr) fail("[cuda] AUGUR_CUDA_TIMELINE: CUPTI lacks ", name);
    return p;
  };
  auto* t = new Timeline;  // lives to the end of the process, for write_timeline
  t->path = path;
  t->get_next = reinterpret_cast<decltype(t->get_next)>(sym("cuptiActivityGetNextRecord"));
  t->flush_all = reinterpret_cast<decltype(t->flush_all)>(sym("cuptiActivityFlushAll"));
  t->callback_name = reinterpret_cast<decltype(t->callback_name)>(sym("cuptiGetCallbackName"));
  auto reg = reinterpret_cast<CUptiResult (*)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc)>(
      sym("cuptiActivityRegisterCallbacks"));
  auto enable = reinterpret_cast<CUptiResult (*)(CUpti_ActivityKind)>(sym("cuptiActivityEnable"));
  g_timeline = t;
  if (reg(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
      enable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS)
    fail("[cuda] AUGUR_CUDA_TIMELINE: CUPTI refused kernel or copy activity records");
  const char* api = std::getenv("AUGUR_CUDA_TIMELINE_API");
  if (api != nullptr && std::string(api) == "1" &&
      (enable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS || enable(CUPTI_ACTIVITY_KIND_DRIVER) != CUPTI_SUCCESS))
    fail("[cuda] AUGUR_CUDA_TIMELINE_API: CUPTI refused API activity records");
  std::atexit(write_timeline);
}

}  // namespace augur::cuda
