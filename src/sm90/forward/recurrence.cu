// The state passes of the forward (docs/kda-spec.md "Record form"; the only sequential part):
// one kernel template, recurrence_kernel<NW, Pass>, whose Pass (recurrence_passes.cuh) says
// which chunks a block walks, where its start state comes from and where its end state goes;
// the chunk step below is the same for every pass.
//
// One block per (sequence or segment, value head, slice of NW*16 value columns), NW = 4 or 8
// warps: one or two warpgroups of 64 columns. Each warpgroup keeps its S^T [64 v x 128 k] in
// fp32 wgmma accumulators for the whole chain (warp w of it: rows 16w..16w+15). Per 16-token
// chunk, with the record of stage 1 (common/record.h, tiles in wgmma's layout) and the chunk's
// rows of v (this block's columns) in shared memory:
//
//   U^T = v^T Av^T - S^T W^T      (U = U0 - W S with U0 = Av v: wgmma m64n16k16, A = v^T / S^T
//                                  from registers, B = Av, W from shared memory; v^T Av^T does
//                                  not depend on S)
//   O^T = S^T Qd^T + U^T M^T      (O = Qd S + M U with the old S; off the sequential chain)
//   S^T = S^T diag(gC) + U^T kr   (S' = diag(gC) S + kr^T U: one wgmma m64n128k16, A = U^T,
//                                  B = kr^T)
//
// A warpgroup reads each B tile from shared memory once (per-warp mma.sync read it once per
// warp: ~70% of an mma.sync kernel's shared-memory traffic), and one instruction replaces 4-16
// HMMAs. The accumulator of one product is, register for register, the A operand of the next,
// so S and U never leave registers. Chunks are prefetched into a ring of stage buffers
// (common/stage_ring.cuh): the record by one bulk copy (the TMA engine), the v rows by
// cp.async, all completing on the buffer's `full` mbarrier; each consumer thread releases a
// buffer on its `empty` mbarrier once its warp's last product reading it is done. A step has
// no block barrier, cp.async wait or proxy fence, except where an instantiation with
// intermediate states stores one (inter_store.cuh: two barriers over the consumer warps and a
// proxy fence). One warpgroup gets a producer warp that issues every load
// (recurrence_has_producer); two warpgroups issue them themselves, kStages - 2 chunks ahead,
// beside their products (docs/performance.md).
#include <cuda_bf16.h>

#include <type_traits>
#include <utility>

#include <cuda/ptx>

#include <cute/arch/copy_sm75.hpp>
#include <cute/arch/copy_sm80.hpp>
#include <cute/arch/copy_sm90.hpp>
#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>

#include "sm90/common/bf16.cuh"
#include "sm90/common/launch_config.h"
#include "sm90/common/stage_ring.cuh"
#include "sm90/forward/inter_store.cuh"
#include "sm90/forward/kernel_shapes.h"
#include "sm90/forward/kernels.h"
#include "sm90/forward/plan.h"
#include "sm90/forward/recurrence_passes.cuh"

namespace flash_kda::sm90 {
namespace {

namespace gmma = cute::SM90::GMMA;
template <gmma::ScaleIn kScaleA>
using MmaN16 = gmma::MMA_64x16x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::K, kScaleA, gmma::ScaleIn::One>;
using MmaN128 = gmma::MMA_64x128x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::K>;

template <int NW>
using Layout = RecurrenceSmem<NW>;
template <int NW>
inline constexpr bool kHasProducer = recurrence_has_producer(NW);

// wgmma descriptors of the bf16 [N][K] tiles of one stage buffer, laid out by gmma_tile_offset
// (no swizzle; K = 16 x k-steps). They differ only in the start address (bits 0-13, in 16-byte
// units; no carry out of them, shared memory being < 256 KB), so each is the stage's word plus a
// constant: one add, where building the bit fields takes ~5 uniform instructions per descriptor
// (~96 of the step's ~430 instructions per warp in the H200 profile).
struct StageDescs {
  uint32_t lo;  // the stage's start address >> 4; leading byte offset 128 (the next 8 columns of K)
  __device__ __forceinline__ explicit StageDescs(const char* stage)
      : lo((cute::cast_smem_ptr_to_uint(stage) >> 4) | ((128 >> 4) << 16)) {}
  // The tile at byte `offset` of the stage, from k-step `kk` (16 columns of K) on. High word: the
  // stride byte offset (the next 8 rows of N), base offset 0, layout type 0 (INTERLEAVE).
  __device__ __forceinline__ uint64_t tile(int offset, int K, int kk) const {
    return (uint64_t((K * 16) >> 4) << 32) | (lo + ((offset + kk * 256) >> 4));
  }
};
static_assert(static_cast<int>(gmma::LayoutType::INTERLEAVE) == 0, "StageDescs leaves the layout bits 0");

// d (m64n16 accumulator, this warp's 16 rows: d[j][r] as an m16n8 tile j) += A B.
template <gmma::ScaleIn kScaleA = gmma::ScaleIn::One>
__device__ __forceinline__ void mma_n16(float (&d)[2][4], const uint32_t (&a)[4], uint64_t b) {
  MmaN16<kScaleA>::fma(a[0], a[1], a[2], a[3], b, d[0][0], d[0][1], d[0][2], d[0][3], d[1][0], d[1][1], d[1][2],
                       d[1][3]);
}

template <int... I>
__device__ __forceinline__ void mma_n128_impl(float (&d)[kHeadDim / 8][4], const uint32_t (&a)[4], uint64_t b,
                                              std::integer_sequence<int, I...>) {
  MmaN128::fma(a[0], a[1], a[2], a[3], b, d[I / 4][I % 4]...);
}
// d (m64n128 accumulator: S^T, d[nt][r] as m16n8 tile nt) += A B.
__device__ __forceinline__ void mma_n128(float (&d)[kHeadDim / 8][4], const uint32_t (&a)[4], uint64_t b) {
  mma_n128_impl(d, a, b, std::make_integer_sequence<int, kHeadDim / 2>{});
}

// Keeps the compiler from moving register reads or writes across an asynchronous wgmma
// (CUTLASS's warpgroup_fence_operand, over arrays).
template <class T, int N>
__device__ __forceinline__ void fence_regs(T (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) cute::warpgroup_fence_operand(r[i][j]);
}

// The v rows are strided in global memory, and a bulk copy takes uniform operands (a copy per
// lane is a loop over lanes), so they go as 16-byte cp.async pieces: piece j of row t from `src`;
// `ok` false zero-fills it (rows past the sequence end: their Av columns are zero, but 0 * NaN is
// not). The caller then makes its arrival on `full` follow its copies' completion
// (cp.async.mbarrier.arrive.noinc).
template <int NW>
__device__ __forceinline__ void copy_v_piece(char* stage, const char* src, int t, int j, bool ok) {
  using L = Layout<NW>;
  using CopyZ = cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>;
  CopyZ::copy(*reinterpret_cast<const cute::uint128_t*>(src),
              *reinterpret_cast<cute::uint128_t*>(stage + L::kV + t * L::kVRow + j * 16), ok);
}

// One chunk's record and this block's columns of its 16 v rows, issued by all NW * 32 threads
// (blocks without a producer warp): `full` counts 1 + NW * 32 arrivals when v is loaded, else 1.
// `v_src` is this thread's piece of v. `with_v` is false in the P half of the segment maps
// (U0 = 0).
template <int NW>
__device__ __forceinline__ void load_chunk(char* stage, uint64_t* full, const char* rec, const char* v_src,
                                           bool v_ok, bool with_v, int tid) {
  if (tid == 0) copy_record(stage + Layout<NW>::kRec, full, rec);
  if (with_v) {  // 16 rows x NW * 32 bytes: one piece per thread
    copy_v_piece<NW>(stage, v_src, tid / (2 * NW), tid % (2 * NW), v_ok);
    cuda::ptx::cp_async_mbarrier_arrive_noinc(full);
  }
}

// The producer warp's loop: chunks c_begin .. c_end - 1 into the stage buffers in ring order,
// each once its buffer is released (common/stage_ring.cuh). Lane 0 copies the record; the
// NW * 32 16-byte pieces of the v rows go kPer to a lane, so `full` counts 1 + 32 arrivals when
// v is loaded. Rows past the sequence end are zero-filled from the
// last valid row's address (no address outside v).
template <int NW>
__device__ __forceinline__ void produce(char* smem, uint64_t* full, uint64_t* empty, const char* rec,
                                        int64_t rec_stride, const char* v_row0, int64_t v_row_bytes, int64_t left,
                                        int64_t chunks, bool with_v, int lane) {
  using L = Layout<NW>;
  constexpr int kRowPieces = NW * 16 * 2 / 16;
  constexpr int kPer = kChunk * kRowPieces / 32;
  RingPos<kStages> ring{0, 1u};  // empty's parity: the phase before this use
  for (int64_t k = 0; k < chunks; ++k) {
    const int b = ring.buf;
    wait_phase(empty + b, ring.parity);
    char* stage = smem + b * L::kStage;
    if (lane == 0) copy_record(stage + L::kRec, full + b, rec);
    if (with_v) {
      const int valid = left < kChunk ? static_cast<int>(left) : kChunk;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int piece = lane + 32 * i, t = piece / kRowPieces, j = piece % kRowPieces;
        const bool ok = t < valid;
        copy_v_piece<NW>(stage, v_row0 + (ok ? t : valid - 1) * v_row_bytes + j * 16, t, j, ok);
      }
      cuda::ptx::cp_async_mbarrier_arrive_noinc(full + b);
    }
    rec += rec_stride;
    v_row0 += kChunk * v_row_bytes;
    left -= kChunk;
    ring.advance();
  }
  cute::cp_async_wait<0>();  // a warp leaves no copy of its own in flight behind it
}

// A padded pool entry (ChainWork::state_slot < 0) of a pass that writes out: this block's rows of
// out (its chunks of the sequence, its NW * 16 value columns) are written as zeros, by every
// thread of the block, 16 bytes at a time.
template <int NW, class Params>
__device__ __forceinline__ void write_zero_rows(const Params& p, const ChainWork& w, int v_block, int tid) {
  constexpr int kPieces = NW * 16 * 2 / 16;  // 16-byte pieces of a row's NW * 16 bf16 columns
  const int64_t t0 = w.seq_begin + w.c_begin * kChunk;
  const int64_t t1 = w.seq_begin + min(w.c_end * kChunk, w.seq_len);
  char* out = static_cast<char*>(p.out) + v_block * 2;
  for (int64_t i = tid; i < (t1 - t0) * kPieces; i += recurrence_block_threads(NW))
    *reinterpret_cast<uint4*>(out + p.out_rows.offset(w.n, t0 + i / kPieces, blockIdx.y) + (i % kPieces) * 16) =
        make_uint4(0u, 0u, 0u, 0u);
}

// Intermediate states (kInter instantiations, params.h InterStates): the block stores the state
// at each boundary b (chunks of the sequence done) in (c_begin, c_end], and at b = 0 when it
// starts the sequence, where b is a multiple of every_chunks, b * 16 <= the sequence's length
// (a partial last chunk ends at no multiple of 16 tokens) and the row j = b / every_chunks -
// shift (shift 1 without include_initial) is inside the sequence's clamped range. Every boundary
// is then stored by exactly one block: a window or segment starting at c_begin > 0 leaves its
// start to the block that ended there.
struct InterCursor {
  int64_t next_b;    // the next boundary to store; -1: none left
  int64_t last_b;    // the last one this block may store
  int64_t every;     // every_chunks
  int64_t row;       // the row of next_b
  __device__ __forceinline__ void advance() {
    next_b += every;
    ++row;
    if (next_b > last_b) next_b = -1;
  }
};

__device__ __forceinline__ InterCursor inter_cursor(const InterStates& is, int64_t n, int64_t c_begin, int64_t c_end,
                                                    int64_t seq_len) {
  const InterStates::Rows r = is.rows(n);
  const int64_t shift = is.include_initial ? 0 : 1, ec = is.every_chunks;
  const int64_t by_rows = (r.count - 1 + shift) * ec;  // the boundary of the range's last row
  const int64_t by_len = seq_len / kChunk;
  InterCursor cur;
  cur.every = ec;
  cur.last_b = min(c_end, min(by_len, by_rows));
  cur.next_b = c_begin == 0 && shift == 0 ? 0 : (c_begin / ec + 1) * ec;
  cur.row = r.first + cur.next_b / ec - shift;
  if (r.count <= 0 || cur.next_b > cur.last_b) cur.next_b = -1;
  return cur;
}

template <int NW, class Pass, bool kInter>
__global__ void __launch_bounds__(recurrence_block_threads(NW)) recurrence_kernel(const typename Pass::Params p) {
  using L = Layout<NW>;
  extern __shared__ __align__(128) char smem[];
  // The warp index broadcast from lane 0 (CUTLASS's canonical_warp_idx_sync): ptxas then knows
  // it is warp-uniform, so code under the producer/consumer branch keeps the uniform datapath
  // for the wgmma descriptors (with threadIdx.x / 32 it moves them through vector registers and
  // R2UR: ~100 more instructions a step).
  const int tid = threadIdx.x, lane = tid % 32, warp = __shfl_sync(0xffffffffu, tid / 32, 0);
  const int g = lane / 4, t4 = lane % 4;  // mma fragment coordinates: row group, column pair
  ChainWork w;
  if (!Pass::template locate<NW>(p, w)) return Pass::template signal_done<NW>(p, warp, lane);
  w.state_slot = p.pool.slot(w.n);
  const int hv = blockIdx.y;
  constexpr int kColBlocks = recurrence_column_blocks(NW);
  const bool use_u0 = Pass::uses_v(w);
  const int v_block = (blockIdx.z % kColBlocks) * NW * 16, v0 = v_block + warp * 16;
  const int64_t first = w.first, seq_begin = w.seq_begin, seq_len = w.seq_len;
  const int64_t c_begin = w.c_begin, c_end = w.c_end;
  const int64_t HV = p.value_heads;

  float s[kHeadDim / 8][4];  // StateRegs: S^T rows v0+g, v0+g+8, columns nt*8 + 2*t4 + {0,1}
  const bool late_start = Pass::late_start(p, w);
  if (warp < NW && !late_start) Pass::template load_start<NW>(p, w, s, v0, g, t4);  // not the producer

  // full[b]: buffer b's copies landed (thread 0's arrival with the record's bytes, and one per
  // thread for its piece of v); empty[b]: every consumer thread is done reading it (one arrival
  // per thread).
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBar);
  uint64_t* empty = full + kStages;
  if (tid == 0) {
#pragma unroll
    for (int b = 0; b < kStages; ++b) {
      cuda::ptx::mbarrier_init(full + b, use_u0 ? 1 + (kHasProducer<NW> ? 32 : NW * 32) : 1);
      cuda::ptx::mbarrier_init(empty + b, NW * 32);
    }
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  __syncthreads();

  // Launched as stage 1's programmatic dependent (launch.cu): the records are complete and
  // visible only past this wait. A no-op for an ordinary launch.
  cudaGridDependencySynchronize();
  Pass::wait_previous(p, tid);
  if constexpr (Pass::kWritesOut) {
    if (w.state_slot < 0) {  // padded: no state read or written, zero rows of out
      write_zero_rows<NW>(p, w, v_block, tid);
      return Pass::template signal_done<NW>(p, warp, lane);
    }
  }
  if (warp < NW && late_start) Pass::template load_start<NW>(p, w, s, v0, g, t4);

  // The next chunk to load: its record, its first row of v (this block's columns) and the
  // tokens left from it, all advanced by one chunk per load. Incremental pointers: recomputed
  // per step, the index arithmetic (64-bit products, the stage modulo) is ~100 of a step's ~380
  // instructions per warp in the H200 profile. v's rows are p.v_rows.token_stride bytes apart
  // (a strided view: row_layout.h).
  const int64_t v_row_bytes = p.v_rows.token_stride;
  const char* rec_next = p.records + ((first + c_begin - w.slot_base) * HV + hv) * int64_t(kRecordBytes);
  const char* v_next = static_cast<const char*>(p.v) + p.v_rows.offset(w.n, seq_begin + c_begin * kChunk, hv) +
                       v_block * 2;
  int64_t left_next = seq_len - c_begin * kChunk;
  if constexpr (kHasProducer<NW>) {
    if (warp == NW) {
      produce<NW>(smem, full, empty, rec_next, HV * int64_t(kRecordBytes), v_next, v_row_bytes, left_next,
                  c_end - c_begin, use_u0, lane);
      return;  // no block barrier follows
    }
  }
  // The consumer warps from here on. The start state is intermediate row 0 when this block
  // starts the sequence with include_initial.
  [[maybe_unused]] InterCursor inter{};
  // Staged through shared memory and stored by bulk copies (inter_store.cuh), whose 16-byte
  // alignment the validation guarantees (a non-activation tensor's data pointer is 16-byte
  // aligned, and every row starts at a multiple of 64 elements).
  auto store_inter = [&](int64_t boundary) {
    if constexpr (kInter) {
      if (boundary != inter.next_b) return;
      store_state_staged<NW>(smem + InterStaging<NW>::kOffset, p.inter.states, p.inter.is_f32, p.state_k_first,
                             state_offset(inter.row, hv, HV), s, v_block, v0, g, t4, tid);
      inter.advance();
    }
  };
  if constexpr (kInter) {
    inter = inter_cursor(p.inter, w.n, c_begin, c_end, seq_len);
    store_inter(0);
  }
  // This thread's piece of v: row v_t of the chunk, 16 bytes at column piece tid % (2 NW).
  const int v_t = tid / (2 * NW);
  const int64_t v_off = v_t * v_row_bytes + (tid % (2 * NW)) * 16;
  // Chunk k (k = 0, 1, ... from c_begin) goes to buffer k % kStages once that buffer's previous
  // chunk is released, i.e. once the phase of empty[buffer] with parity (k / kStages + 1) % 2
  // has completed (a fresh barrier counts its phase "-1", parity 1, as completed: the first
  // round does not wait). A sequence's last chunk takes the slow path: its rows past the end
  // are zero-filled from the last valid row's address, so no address outside v is formed.
  auto load_next = [&](int b, uint32_t empty_parity) {
    wait_phase(empty + b, empty_parity);
    char* stage_b = smem + b * L::kStage;
    if (left_next >= kChunk) {
      load_chunk<NW>(stage_b, full + b, rec_next, v_next + v_off, true, use_u0, tid);
    } else {
      const int valid = static_cast<int>(left_next);
      const bool ok = v_t < valid;
      load_chunk<NW>(stage_b, full + b, rec_next, v_next + (ok ? v_off : v_off - (v_t - valid + 1) * v_row_bytes),
                     ok, use_u0, tid);
    }
    rec_next += HV * int64_t(kRecordBytes);
    v_next += kChunk * v_row_bytes;
    left_next -= kChunk;
  };
  if constexpr (!kHasProducer<NW>) {
#pragma unroll
    for (int s0 = 0; s0 < kStages - 2; ++s0)
      if (c_begin + s0 < c_end) load_next(s0, 1u);
  }
  // This lane's piece of the output rows (token row t = lane / 2, 16 bytes), advanced per chunk.
  // out's rows are p.out_rows.token_stride bytes apart (row_layout.h).
  const int out_t = lane / 2;
  char* out_next = nullptr;
  int64_t out_step = 0;  // bytes from a chunk's rows to the next chunk's
  if constexpr (Pass::kWritesOut) {
    out_next = static_cast<char*>(p.out) + p.out_rows.offset(w.n, seq_begin + c_begin * kChunk + out_t, hv) +
               (v0 + (lane % 2) * 8) * 2;
    out_step = kChunk * p.out_rows.token_stride;
  }
  int64_t left = seq_len - c_begin * kChunk;  // tokens from the current chunk on

  // The chunk loop, with the pass's branches resolved at compile time (kOut: write out, else
  // the segment-map pass; kU0: U starts from v^T Av^T, else from 0): wgmma batches inside
  // run-time branches make ptxas inject warpgroup.arrive/wait around them.
  //
  // The tensor cores run a warpgroup's wgmmas in issue order, so O's nine products (S^T Qd^T,
  // U^T M^T), which nothing in the chain needs, are issued after the state update and left
  // running into the next step, beside its gate scaling and packing; chunk c's O is
  // written out in step c + 1. Their A operands (S^T and U^T of chunk c) must survive that long:
  // sa, ua and o alternate between two register sets by the parity of the step, and a chunk's
  // stage buffer is refilled only two steps after its own (kStages - 2 chunks are in flight).
  auto chunk_loop = [&](auto out_tag, auto u0_tag) {
    constexpr bool kOut = decltype(out_tag)::value, kU0 = decltype(u0_tag)::value;
    uint32_t sa[2][kHeadDim / 16][4];  // A operand of S^T, 8 k-steps of 16 key channels
    uint32_t ua[2][1][4];              // U^T as the A operand (16 v x 16 tokens)
    float o[2][2][4];                  // O^T of the chunk (16 v x 16 tokens)
    RingPos<kStages> ring{0, 0u};      // the current chunk's stage buffer, and its full phase's parity

    // O^T of the previous chunk -> [token][v] staging -> 32 contiguous bytes per token row of
    // out. stmatrix.trans writes the four 8x8 tiles (token tile j, value half h) of O^T as token
    // rows of 16 bytes; the half is XOR-swizzled by bit 2 of the token so that the 8 rows of a
    // tile (32 bytes apart) hit distinct banks.
    auto write_out = [&](const float (&op)[2][4]) {
      char* stage_out = smem + L::kOut + warp * (kChunk * 32);
      {
        const int j = lane / 8, tok = (j / 2) * 8 + lane % 8, h = (j % 2) ^ ((tok / 4) & 1);
        cute::SM90_U16x8_STSM_T::copy(pack_bf16(op[0][0], op[0][1]), pack_bf16(op[0][2], op[0][3]),
                                      pack_bf16(op[1][0], op[1][1]), pack_bf16(op[1][2], op[1][3]),
                                      *reinterpret_cast<cute::uint128_t*>(stage_out + tok * 32 + h * 16));
      }
      __syncwarp();
      if (out_t < left)
        *reinterpret_cast<uint4*>(out_next) =
            *reinterpret_cast<const uint4*>(stage_out + out_t * 32 + ((lane % 2) ^ ((out_t / 4) & 1)) * 16);
      __syncwarp();  // the next chunk's stmatrix reuses the staging
      out_next += out_step;
      left -= kChunk;
    };

    // Two warpgroups (no producer warp): chunk c + kStages - 2's loads (~56 instructions a warp),
    // issued in back(c), beside the products (h96_fixed_8192 state pass 377 us, against 401 us
    // from the front of the step; docs/performance.md). Its buffer is chunk c - 2's, which every warp
    // released in step c - 1: this rarely waits. It is in the next round of buffers unless
    // ring.buf + kStages - 2 wraps.
    auto load_ahead = [&](int64_t c) {
      if (c + kStages - 2 < c_end) {
        const bool wraps = ring.buf + kStages - 2 >= kStages;
        load_next(wraps ? ring.buf - 2 : ring.buf + kStages - 2, ring.parity ^ (wraps ? 0u : 1u));
      }
    };

    // front(c): chunk c's U (and chunk c - 1's O written out); back(c): its state update and O.
    // The loop runs back(c), front(c + 1), so that at its back edge no wgmma is pending: where
    // paths with products in flight merge, ptxas injects a wait for all of them.
    auto front = [&](auto parity_tag, int64_t c) {
      constexpr int cur = decltype(parity_tag)::value;
      [[maybe_unused]] constexpr int prv = 1 - cur;
      char* stage = smem + ring.buf * L::kStage;
      const StageDescs desc(stage);
      // Chunk c's copies: past full's phase, the bulk copy's writes (async proxy) are visible
      // to wgmma and to loads, and the cp.async writes (generic proxy) to the loads of v, which
      // are all that read them.
      wait_phase(full + ring.buf, ring.parity);

#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        sa[cur][kk][0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
        sa[cur][kk][1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
        sa[cur][kk][2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        sa[cur][kk][3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      }
      // v^T as the A operand of U0^T = v^T (Av + Av lo)^T (16 v x 16 tokens, ldmatrix.trans of
      // the [token][v] rows: lanes 0-7 / 8-15 / 16-23 / 24-31 address the four 8x8 tiles).
      uint32_t va[1][4] = {};
      if constexpr (kU0) {
        const int ld_row = (lane % 8) + ((lane / 16) * 8), ld_col = ((lane / 8) % 2) * 8;
        cute::SM75_U16x8_LDSM_T::copy(
            *reinterpret_cast<const cute::uint128_t*>(stage + L::kV + ld_row * L::kVRow + (warp * 16 + ld_col) * 2),
            va[0][0], va[0][1], va[0][2], va[0][3]);
      }

      // S^T diag(gC), the first half of the state update (the old S is in sa now). Before the
      // batch, not beside it: ptxas waits for a batch in flight before any write to a register
      // that is some wgmma's accumulator (ptxas advisory C7517).
      {
        const float* gc = reinterpret_cast<const float*>(stage + kRecGC);
#pragma unroll
        for (int nt = 0; nt < kHeadDim / 8; ++nt) {
          const float2 d = *reinterpret_cast<const float2*>(gc + nt * 8 + 2 * t4);
          s[nt][0] *= d.x; s[nt][1] *= d.y; s[nt][2] *= d.x; s[nt][3] *= d.y;
        }
      }

      // U^T = v^T (Av + Av lo)^T - S^T W^T in one accumulator (-S^T W^T with A scaled by -1).
      // Split over 2 or 4 accumulators, U's dependent chain of wgmmas is shorter but the adds
      // that join them sit on the step's chain: one is fewest instructions (docs/performance.md).
      // This warp's rows v0+g, v0+g+8; token columns 8j+2*t4+{0,1}.
      float xu[2][4] = {};
      fence_regs(xu);
      fence_regs(s);
      cute::warpgroup_arrive();
      if constexpr (kU0) {
        mma_n16(xu, va[0], desc.tile(kRecAv, kChunk, 0));
        mma_n16(xu, va[0], desc.tile(kRecAvLo, kChunk, 0));
      }
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk)
        mma_n16<gmma::ScaleIn::Neg>(xu, sa[cur][kk], desc.tile(kRecW, kHeadDim, kk));
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<0>();  // this batch, and the previous chunk's O before it
      fence_regs(xu);
      fence_regs(va);
      if constexpr (kOut) {
        fence_regs(o[prv]);
        fence_regs(sa[prv]);
        fence_regs(ua[prv]);
        // Two warpgroups: the other one hides this store, and after the state update's issue
        // it would sit in front of that update's wait (h96 cases 1.5-4% slower there;
        // docs/performance.md).
        if constexpr (NW == 8)
          if (c > c_begin) write_out(o[prv]);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        ua[cur][0][2 * j] = pack_bf16(xu[j][0], xu[j][1]);
        ua[cur][0][2 * j + 1] = pack_bf16(xu[j][2], xu[j][3]);
      }
    };
    auto back = [&](auto parity_tag, int64_t c, bool write_prev) {
      constexpr int cur = decltype(parity_tag)::value;
      char* stage = smem + ring.buf * L::kStage;
      const StageDescs desc(stage);
      // S^T <- S^T diag(gC) + U^T kr (the chain); then O^T = S^T Qd^T + U^T M^T (old S), left
      // running into the next step.
      if constexpr (kOut) {
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) o[cur][j][r] = 0.f;
        fence_regs(o[cur]);
      }
      cute::warpgroup_arrive();
      mma_n128(s, ua[cur][0], desc.tile(kRecKr, kChunk, 0));
      cute::warpgroup_commit_batch();
      // The previous chunk's buffer: its last reader, that chunk's O, completed at front(c)'s
      // wait, so this warp releases it, here where the arrivals overlap the state update's
      // product instead of lengthening the chain between the two. Every lane arrives for its
      // own reads (gC, v), so each read is ordered before the refill by the barrier itself
      // (one arrival a warp would lean on the warp's convergence, which compute-sanitizer's
      // racecheck does not model).
      if (c > c_begin) cuda::ptx::mbarrier_arrive(empty + (ring.buf == 0 ? kStages - 1 : ring.buf - 1));
      if constexpr (kOut) {
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) mma_n16(o[cur], sa[cur][kk], desc.tile(kRecQd, kHeadDim, kk));
        mma_n16(o[cur], ua[cur][0], desc.tile(kRecM, kChunk, 0));
      }
      cute::warpgroup_commit_batch();
      // One warpgroup: the previous chunk's O (complete since front's wait) goes out here, beside
      // the products, instead of between U's wait and U (h4_fixed_1024 2% faster;
      // docs/performance.md).
      if constexpr (kOut && NW == 4)
        if (write_prev) write_out(o[1 - cur]);
      if constexpr (!kHasProducer<NW>) load_ahead(c);
      cute::warpgroup_wait<1>();  // the state update is done; O may still run
      fence_regs(s);
      if constexpr (kInter) store_inter(c + 1);  // s is the state after chunk c; O reads sa, ua
      ring.advance();
    };

    using P0 = std::integral_constant<int, 0>;
    using P1 = std::integral_constant<int, 1>;
    int64_t c = c_begin;
    int last = 0;  // the parity of the last chunk, whose O is still pending after the loop
    if (c < c_end) {
      front(P0{}, c);
      while (true) {
        back(P0{}, c, c > c_begin);
        if (++c == c_end) { last = 0; break; }
        front(P1{}, c);
        back(P1{}, c, true);
        if (++c == c_end) { last = 1; break; }
        front(P0{}, c);
      }
    }
    cute::warpgroup_wait<0>();
    if constexpr (kOut) {
      fence_regs(o[0]);
      fence_regs(o[1]);
      if (c_begin < c_end) {
        if (last == 0) write_out(o[0]);
        else write_out(o[1]);
      }
    }
    fence_regs(sa[0]);
    fence_regs(sa[1]);
    fence_regs(ua[0]);
    fence_regs(ua[1]);
  };
  if constexpr (Pass::kWritesOut)
    chunk_loop(std::true_type{}, std::true_type{});
  else if (use_u0)
    chunk_loop(std::false_type{}, std::true_type{});
  else
    chunk_loop(std::false_type{}, std::false_type{});
  if constexpr (kInter) inter_store_drain();

  Pass::template store_end<NW>(p, w, s, v0, g, t4, warp, lane);
}

template <int NW, class Pass, bool kInter = false>
cudaError_t launch_pass(const typename Pass::Params& p, const KernelLaunch& k, uint64_t context_key,
                        cudaStream_t stream) {
  return launch_planned<recurrence_kernel<NW, Pass, kInter>>(k, context_key, p, stream);
}

}  // namespace

// Intermediate states select their own instantiations, so the kernels without them carry none
// of their code, and those take the staging buffer's shared memory (inter_states_launch).
cudaError_t launch_window_pass(const WindowParams& p, int warps, const KernelLaunch& k, uint64_t context_key,
                               cudaStream_t stream) {
  if (p.inter.states != nullptr) {
    const KernelLaunch ki = inter_states_launch(k, warps);
    return warps == 4 ? launch_pass<4, WindowPass, true>(p, ki, context_key, stream)
                      : launch_pass<8, WindowPass, true>(p, ki, context_key, stream);
  }
  return warps == 4 ? launch_pass<4, WindowPass>(p, k, context_key, stream)
                    : launch_pass<8, WindowPass>(p, k, context_key, stream);
}

cudaError_t launch_segment_maps(const SegmentMapsParams& p, const KernelLaunch& k, uint64_t context_key,
                                cudaStream_t stream) {
  return launch_pass<kSegmentWarps, SegmentMapsPass>(p, k, context_key, stream);
}

cudaError_t launch_segment_finish(const SegmentFinishParams& p, const KernelLaunch& k, uint64_t context_key,
                                  cudaStream_t stream) {
  if (p.inter.states != nullptr)
    return launch_pass<kSegmentWarps, SegmentFinishPass, true>(p, inter_states_launch(k, kSegmentWarps), context_key,
                                                              stream);
  return launch_pass<kSegmentWarps, SegmentFinishPass>(p, k, context_key, stream);
}

}  // namespace flash_kda::sm90
