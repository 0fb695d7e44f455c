// src/sm90/backward/records.cu compiled as host C++ for the CPU model (backward_emu.h). One kernel
// source per file: the sources' file-local names (kThreads, Smem, ...) would collide in one.
#include "backward/backward_emu.h"
#include "sm90/backward/records.cu"
