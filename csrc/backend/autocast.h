// Autocast on brick: the backing device's autocast policy (see autocast.cpp).
#pragma once

#include <string>
#include <vector>

namespace brick::backend {

// Registers the autocast policy of the backing device (CUDA's when `cuda_backing`, else the
// CPU's) for AutocastPrivateUse1. Once per process, when the backing is decided.
void install_autocast_policy(bool cuda_backing);

// The ops ("aten::name.overload") a policy casts: what install_autocast_policy registers.
std::vector<std::string> autocast_policy_ops(bool cuda_backing);

}  // namespace brick::backend
