// The CPU probe's measuring loops, compiled optimised even in debug builds (see CMakeLists.txt).
#pragma once

#include "profiler/device.h"

namespace apart::detail {
CpuProbe measure_cpu();
}
