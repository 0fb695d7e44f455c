// The backward kernels' launches as the CPU model's copies (tests/emu/backward/*.cpp compile
// each kernel source under these names, so that they do not collide with the library's), and
// their declarations (kernels.h). Every file of the emulated backward includes this first.
#pragma once

#include "warp_emu.h"

#define launch_offsets emu_launch_offsets
#define launch_prepare emu_launch_prepare
#define launch_records emu_launch_records
#define launch_chain emu_launch_chain
#define launch_chunk_grad emu_launch_chunk_grad
#define launch_finish emu_launch_finish
#define enqueue_backward_kernels emu_enqueue_backward_kernels
// The chain's segments use the forward's segment scan (cp.async, which the model has no CUDA
// path for): emu_scan.cpp is its math on the host.
#define launch_segment_scan emu_launch_segment_scan

#include "sm90/backward/kernels.h"
