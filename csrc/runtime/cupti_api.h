// CUPTI's activity-API entry points, resolved from a library loaded at run time (dlopen): what
// brick's work tracer (cupti_tracer.cpp) and the benchmarks' CUPTI probe
// (benchmarks/cupti_probe.cu) call, so that neither links CUPTI. Header-only, over <cupti.h>.
#pragma once

#include <cupti.h>
#include <dlfcn.h>

#include <type_traits>

namespace brick::runtime::cupti {

struct Api {
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiActivityGetNumDroppedRecords) dropped_records = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityPushExternalCorrelationId) push = nullptr;
  decltype(&cuptiActivityPopExternalCorrelationId) pop = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
  decltype(&cuptiFinalize) finalize = nullptr;
};

// Resolves every entry point of `api` from `library` (a dlopen handle): nullptr when all were
// found, else the name of the first one missing.
inline const char* resolve_api(void* library, Api* api) {
  const char* missing = nullptr;
  const auto resolve = [&](const char* name, auto& entry) {
    entry = reinterpret_cast<std::remove_reference_t<decltype(entry)>>(dlsym(library, name));
    if (entry == nullptr && missing == nullptr) missing = name;
  };
  resolve("cuptiActivityEnable", api->enable);
  resolve("cuptiActivityDisable", api->disable);
  resolve("cuptiActivityRegisterCallbacks", api->register_callbacks);
  resolve("cuptiActivityGetNextRecord", api->next_record);
  resolve("cuptiActivityGetNumDroppedRecords", api->dropped_records);
  resolve("cuptiActivityFlushAll", api->flush_all);
  resolve("cuptiActivityPushExternalCorrelationId", api->push);
  resolve("cuptiActivityPopExternalCorrelationId", api->pop);
  resolve("cuptiGetResultString", api->result_string);
  resolve("cuptiFinalize", api->finalize);
  return missing;
}

}  // namespace brick::runtime::cupti
