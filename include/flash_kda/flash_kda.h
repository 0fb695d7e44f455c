// Umbrella header of the flash_kda C++ API. See forward.h for the call and docs/ for the math.
#pragma once

#include "flash_kda/backward.h"
#include "flash_kda/call_table.h"
#include "flash_kda/decode.h"
#include "flash_kda/error.h"
#include "flash_kda/forward.h"
#include "flash_kda/tensor.h"
#include "flash_kda/version.h"
