// One call of the backing device's kernel as a brick op's device work: see backing_call.h.
#include "backend/backing_call.h"

#include <string>

namespace brick::backend {

void add_backing_failure_context(c10::Error& error, const char* name, const char* overload_name,
                                 c10::DeviceIndex device) {
  const std::string op =
      overload_name[0] == '\0' ? std::string(name) : std::string(name) + "." + overload_name;
  error.add_context("brick: " + op + " on " + c10::Device(kBrick, device).str() +
                    " failed on its backing device (" +
                    c10::DeviceTypeName(backing_device_type(), /*lower_case=*/true) + ")");
}

}  // namespace brick::backend
