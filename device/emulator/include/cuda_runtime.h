// The EMULATED build's cuda_runtime.h: the runtime API and the device language (docs/gpu.md).
#pragma once
#include "cuda_runtime_api.h"
#include "meshrun/cuda_emu/device.hpp"
