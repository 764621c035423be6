// The collectives in flight: tracked until done, settled, and waited for.
#include "distributed/collective_work.h"

#include <mutex>
#include <utility>
#include <vector>

#include "backend/device_index.h"

namespace brick::distributed {

namespace {

std::mutex g_in_flight_mutex;
std::vector<InFlight> g_in_flight;

}  // namespace

void track_in_flight(InFlight in_flight) {
  std::vector<InFlight> finished;  // released after the lock (see InFlight::held)
  {
    std::lock_guard<std::mutex> lock(g_in_flight_mutex);
    for (auto it = g_in_flight.begin(); it != g_in_flight.end();) {
      bool done = false;
      try {
        done = it->done();
      } catch (...) {  // a failed collective: reported by its own Work, settled here
        done = true;
      }
      if (!done) {
        ++it;
        continue;
      }
      if (it->device_timing) it->device_timing->settle();
      finished.push_back(std::move(*it));
      it = g_in_flight.erase(it);
    }
    g_in_flight.push_back(std::move(in_flight));
  }
}

size_t wait_for_collectives() {
  std::vector<InFlight> works;
  {
    std::lock_guard<std::mutex> lock(g_in_flight_mutex);
    works.swap(g_in_flight);
  }
  for (const auto& in_flight : works) {
    try {
      if (in_flight.work) in_flight.work->wait();
      if (in_flight.timed) in_flight.timed->wait();
      if (in_flight.device_timing) backend::rt().synchronize_event(in_flight.device_timing->done);
    } catch (...) {  // the collective's failure is reported by its own Work
    }
    if (in_flight.device_timing) in_flight.device_timing->settle();
  }
  return works.size();
}

}  // namespace brick::distributed
