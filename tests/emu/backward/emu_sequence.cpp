// src/sm90/backward/sequence.cpp compiled for the CPU model (backward_emu.h): the library's
// kernel order, with the emulated launches and the host form of zero_async (tests/emu/shadow).
#include "backward/backward_emu.h"
#include "sm90/backward/sequence.cpp"
