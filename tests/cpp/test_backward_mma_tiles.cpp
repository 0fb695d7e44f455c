// The chunk-gradient kernel's tensor-core products (src/sm90/backward/chunk_grad_products.cuh),
// run on the CPU with an emulated warp: the very same tiled loops, fragment index arithmetic and
// shared-memory layouts as the kernel, against naive products. The emulated mma rebuilds its
// operands from the 32 lanes' registers by the PTX ISA's m16n8k8 .tf32 table (written out here,
// independently of mma_tf32.cuh's frag_* functions) and optionally rounds them to tf32 as
// cvt.rn does (tf32_round_host), so the tests also measure what tf32 costs, and what 3xTF32
// buys where a product cancels.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <set>
#include <type_traits>
#include <vector>

#include "sm90/backward/chain_products.cuh"
#include "sm90/backward/chunk_grad_products.cuh"

namespace {

namespace bwd = flash_kda::sm90::bwd;

/// x rounded to tf32 (10 mantissa bits) to nearest, ties away from zero (ptx::tf32 rounds ties to
/// even: the two differ only on exact ties), for finite x: the emulated warp's conversion.
float tf32_round_host(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x1000u) & 0xffffe000u;
  float y;
  std::memcpy(&y, &u, 4);
  return y;
}
constexpr int D = bwd::kGradDim;
constexpr int C = bwd::kC;

/// A warp of 32 lanes in lockstep on the CPU: the interface of bwd::DeviceWarp.
struct EmuWarp {
  using A = std::array<bwd::FragA, 32>;
  using B = std::array<bwd::FragB, 32>;
  using C = std::array<bwd::FragC, 32>;
  bool tf32 = false;  // round operands to tf32 (else exact fp32 operands)

  template <class F>
  A load_a(F at) const {
    A f;
    for (int lane = 0; lane < 32; ++lane)
      for (int r = 0; r < 4; ++r) f[lane].x[r] = at(bwd::frag_a_row(lane, r), bwd::frag_a_col(lane, r));
    return f;
  }
  A load_a_packed(const float* f) const {
    A a;
    for (int lane = 0; lane < 32; ++lane)
      for (int r = 0; r < 4; ++r) a[lane].x[r] = f[4 * lane + r];
    return a;
  }
  template <class F>
  B load_b(F at) const {
    B f;
    for (int lane = 0; lane < 32; ++lane)
      for (int r = 0; r < 2; ++r) f[lane].x[r] = at(bwd::frag_b_row(lane, r), bwd::frag_b_col(lane));
    return f;
  }
  float round(float x) const { return tf32 ? tf32_round_host(x) : x; }
  void add(C& c, const C& x) const {
    for (int lane = 0; lane < 32; ++lane)
      for (int r = 0; r < 4; ++r) c[lane].x[r] += x[lane].x[r];
  }
  /// The PTX m16n8k8 .tf32 fragment table: a0 = A[g][t], a1 = A[g+8][t], a2 = A[g][t+4],
  /// a3 = A[g+8][t+4]; b0 = B[t][g], b1 = B[t+4][g]; c0 = C[g][2t], c1 = C[g][2t+1],
  /// c2 = C[g+8][2t], c3 = C[g+8][2t+1]. fp32 accumulation in the order of k.
  void mma(C& c, const A& a, const B& b) const {
    float Am[16][8], Bm[8][8], Cm[16][8];
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4;
      Am[g][t] = round(a[lane].x[0]);
      Am[g + 8][t] = round(a[lane].x[1]);
      Am[g][t + 4] = round(a[lane].x[2]);
      Am[g + 8][t + 4] = round(a[lane].x[3]);
      Bm[t][g] = round(b[lane].x[0]);
      Bm[t + 4][g] = round(b[lane].x[1]);
      Cm[g][2 * t] = c[lane].x[0];
      Cm[g][2 * t + 1] = c[lane].x[1];
      Cm[g + 8][2 * t] = c[lane].x[2];
      Cm[g + 8][2 * t + 1] = c[lane].x[3];
    }
    for (int i = 0; i < 16; ++i)
      for (int n = 0; n < 8; ++n) {
        float s = Cm[i][n];
        for (int k = 0; k < 8; ++k) s += Am[i][k] * Bm[k][n];
        Cm[i][n] = s;
      }
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4;
      c[lane].x[0] = Cm[g][2 * t];
      c[lane].x[1] = Cm[g][2 * t + 1];
      c[lane].x[2] = Cm[g + 8][2 * t];
      c[lane].x[3] = Cm[g + 8][2 * t + 1];
    }
  }
  /// The accumulator tiles as A operands, lane by lane (DeviceWarp::a_of_c).
  A a_of_c(const C& c) const {
    A a;
    for (int lane = 0; lane < 32; ++lane) a[lane] = bwd::frag_a_of_c(c[lane]);
    return a;
  }
  void add_c_if(C& c, const C& x, bool on) const {
    for (int lane = 0; lane < 32; ++lane)
      for (int r = 0; r < 4; ++r) c[lane].x[r] += on ? x[lane].x[r] : 0.f;
  }
  /// As DeviceWarp::mma_split_a: A given as head and tail (exact tf32 numbers when tf32).
  void mma_split_a(C& c, const A& hi, const A& lo, const B& b) const {
    B bh = b, bl = b;
    if (tf32)
      for (int lane = 0; lane < 32; ++lane)
        for (int r = 0; r < 2; ++r) {
          bh[lane].x[r] = tf32_round_host(b[lane].x[r]);
          bl[lane].x[r] = tf32_round_host(b[lane].x[r] - bh[lane].x[r]);
        }
    else
      for (int lane = 0; lane < 32; ++lane) bl[lane] = bwd::FragB{{0.f, 0.f}};
    mma(c, lo, bh);
    mma(c, hi, bl);
    mma(c, hi, bh);
  }
  /// DeviceWarp's split operands: head and tail, each x truncated to tf32 (DeviceWarp::split);
  /// without tf32 rounding the head is x and the tail zero.
  struct SplitA {
    A hi, lo;
  };
  struct SplitB {
    B hi, lo;
  };
  float trunc(float x) const {
    if (!tf32) return x;
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u &= 0xffffe000u;
    std::memcpy(&x, &u, 4);
    return x;
  }
  /// hi, lo = the head and tail of every register of x.
  template <class F>
  void split_into(const F& x, F& hi, F& lo) const {
    hi = lo = x;
    for (int lane = 0; lane < 32; ++lane)
      for (size_t r = 0; r < std::size(x[lane].x); ++r) {
        hi[lane].x[r] = trunc(x[lane].x[r]);
        lo[lane].x[r] = trunc(x[lane].x[r] - hi[lane].x[r]);
      }
  }
  SplitA split(const A& a) const {
    SplitA s;
    split_into(a, s.hi, s.lo);
    return s;
  }
  SplitB split(const B& b) const {
    SplitB s;
    split_into(b, s.hi, s.lo);
    return s;
  }
  /// As DeviceWarp::mma_split on split operands.
  void mma_split(C& c, const SplitA& a, const SplitB& b) const {
    mma(c, a.lo, b.hi);
    mma(c, a.hi, b.lo);
    mma(c, a.hi, b.hi);
  }
  /// 3xTF32 as DeviceWarp::mma_split: tail x head + head x tail + head x head.
  void mma_split(C& c, const A& a, const B& b) const {
    if (!tf32) return mma(c, a, b);
    A ah = a, al = a;
    B bh = b, bl = b;
    for (int lane = 0; lane < 32; ++lane) {
      for (int r = 0; r < 4; ++r) {
        ah[lane].x[r] = tf32_round_host(a[lane].x[r]);
        al[lane].x[r] = tf32_round_host(a[lane].x[r] - ah[lane].x[r]);
      }
      for (int r = 0; r < 2; ++r) {
        bh[lane].x[r] = tf32_round_host(b[lane].x[r]);
        bl[lane].x[r] = tf32_round_host(b[lane].x[r] - bh[lane].x[r]);
      }
    }
    mma(c, al, bh);
    mma(c, ah, bl);
    mma(c, ah, bh);
  }
};

/// Element (row, column) of warp-owned columns n0 .. n0 + 15 of a product, from its fragments.
template <class F>
void for_each_result(const EmuWarp::C (&acc)[2], int n0, F f) {
  for (int nt = 0; nt < 2; ++nt)
    for (int lane = 0; lane < 32; ++lane)
      for (int r = 0; r < 4; ++r)
        f(bwd::frag_c_row(lane, r), n0 + 8 * nt + bwd::frag_c_col(lane, r), acc[nt][lane].x[r]);
}

/// Random chunk tiles in the kernel's shared-memory layouts, with their dense forms: the states
/// as kSlices slices in both slice layouts (S) or the k-first one (dS), U and dR as slice tiles.
struct Tiles {
  static constexpr int kSlices = D / bwd::kSliceV;
  std::vector<float> Sk[kSlices], Sv[kSlices], dS[kSlices];  // slice layouts
  std::vector<float> U[kSlices], dR[kSlices];                // [16][kSliceLd]
  std::vector<float> kd, kr, dO, X;                          // [16][kRowLd]
  std::vector<float> M, Tinv, b;                             // [16][16] (Tinv unit lower), [16]
  std::vector<double> Sd, dSd;                               // dense [K][V]
  std::vector<double> kdd, krd, dOd, Xd, Ud, dRd;            // dense [16][128]

  explicit Tiles(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    auto state = [&](std::vector<double>& dense) {
      dense.resize(D * D);
      for (auto& x : dense) x = nd(rng);
    };
    auto slices = [&](std::vector<float>* out, const std::vector<double>& dense, auto layout) {
      for (int s = 0; s < kSlices; ++s) {
        out[s].assign(bwd::kSliceFloats, NAN);
        for (int c = 0; c < D; ++c)
          for (int v = 0; v < bwd::kSliceV; ++v)
            out[s][decltype(layout)::off(c, v)] = float(dense[c * D + bwd::kSliceV * s + v]);
      }
    };
    auto rows = [&](std::vector<float>& tile, std::vector<double>& dense) {
      tile.assign(C * bwd::kRowLd, NAN);  // the padding must never be read
      dense.resize(C * D);
      for (int i = 0; i < C; ++i)
        for (int v = 0; v < D; ++v) {
          const float x = nd(rng);
          tile[i * bwd::kRowLd + v] = x;
          dense[i * D + v] = x;
        }
    };
    auto slice_rows = [&](std::vector<float>* out, std::vector<double>& dense) {
      dense.resize(C * D);
      for (auto& x : dense) x = nd(rng);
      for (int s = 0; s < kSlices; ++s) {
        out[s].assign(C * bwd::kSliceLd, NAN);
        for (int i = 0; i < C; ++i)
          for (int v = 0; v < bwd::kSliceV; ++v)
            out[s][i * bwd::kSliceLd + v] = float(dense[i * D + bwd::kSliceV * s + v]);
      }
    };
    state(Sd);
    state(dSd);
    slices(Sk, Sd, bwd::KFirstSlice{});
    slices(Sv, Sd, bwd::VFirstSlice{});
    slices(dS, dSd, bwd::KFirstSlice{});
    rows(kd, kdd);
    rows(kr, krd);
    rows(dO, dOd);
    rows(X, Xd);
    slice_rows(U, Ud);
    slice_rows(dR, dRd);
    M.resize(C * C);
    for (auto& x : M) x = nd(rng);
    Tinv.resize(C * C);
    for (int i = 0; i < C; ++i)
      for (int j = 0; j < C; ++j) Tinv[i * C + j] = j < i ? nd(rng) : j == i ? 1.f : 0.f;
    b.resize(C);
    for (auto& x : b) x = nd(rng);
  }
  /// S's slice s in layout L.
  template <class L>
  const float* S(int s) const {
    return std::is_same_v<L, bwd::KFirstSlice> ? Sk[s].data() : Sv[s].data();
  }
};

/// max |got - want| / max |want|.
struct MaxErr {
  double err = 0, scale = 0;
  void add(double got, double want) {
    err = std::max(err, std::abs(got - want));
    scale = std::max(scale, std::abs(want));
  }
  double rel() const { return err / scale; }
};

/// Adds to e the error of acc (columns n0 .. n0 + 15 of P St^T, P [16][128], St [128][128]).
void check_state_T(const EmuWarp::C (&acc)[2], int n0, const std::vector<double>& P, const std::vector<double>& St,
                   MaxErr& e) {
  for_each_result(acc, n0, [&](int i, int c, float got) {
    double want = 0;
    for (int v = 0; v < D; ++v) want += P[i * D + v] * St[c * D + v];
    e.add(got, want);
  });
}

/// Element (row, column) of one n-tile (columns n0 .. n0 + 7) of a product, from its fragments.
template <class F>
void for_each_result(const EmuWarp::C& acc, int n0, F f) {
  for (int lane = 0; lane < 32; ++lane)
    for (int r = 0; r < 4; ++r) f(bwd::frag_c_row(lane, r), n0 + bwd::frag_c_col(lane, r), acc[lane].x[r]);
}

template <class L>
void expect_slice_layout() {
  std::set<int> seen;
  for (int c = 0; c < D; ++c)
    for (int v = 0; v < bwd::kSliceV; ++v) {
      const int at = L::off(c, v);
      ASSERT_GE(at, 0);
      ASSERT_LT(at, bwd::kSliceFloats);
      seen.insert(at);
      if (std::is_same_v<L, bwd::KFirstSlice>)
        EXPECT_EQ(L::off(c, v - v % 4) + v % 4, at) << "a key row's 16-byte pieces stay whole";
      else
        EXPECT_EQ(L::off(c - c % 4, v) + c % 4, at) << "a value row's 16-byte pieces stay whole";
    }
  EXPECT_EQ(seen.size(), size_t(bwd::kSliceFloats));
}

TEST(BackwardMmaTiles, SliceLayoutsAreBijectionsKeepingSixteenBytePieces) {
  expect_slice_layout<bwd::KFirstSlice>();
  expect_slice_layout<bwd::VFirstSlice>();
}

template <class L>
void expect_conflict_free_slice() {
  for (int r = 0; r < 2; ++r) {
    for (int k0 = 0; k0 < D; k0 += 8)
      for (int n0 = 0; n0 < bwd::kSliceV; n0 += 8) {  // B = S (K x V): product_residual, product_dU
        std::set<int> banks;
        for (int lane = 0; lane < 32; ++lane)
          banks.insert(L::off(k0 + bwd::frag_b_row(lane, r), n0 + bwd::frag_b_col(lane)) % 32);
        EXPECT_EQ(banks.size(), 32u);
      }
    for (int k0 = 0; k0 < bwd::kSliceV; k0 += 8)
      for (int n0 = 0; n0 < D; n0 += 8) {  // B = S^T (V x K): product_state_T
        std::set<int> banks;
        for (int lane = 0; lane < 32; ++lane)
          banks.insert(L::off(n0 + bwd::frag_b_col(lane), k0 + bwd::frag_b_row(lane, r)) % 32);
        EXPECT_EQ(banks.size(), 32u);
      }
  }
  // The kernel's row sums of dS o S: lane l reads key row cb + l % 8, slice column vb + l / 8.
  for (int cb = 0; cb < D; cb += 8)
    for (int vb = 0; vb < bwd::kSliceV; vb += 4) {
      std::set<int> banks;
      for (int lane = 0; lane < 32; ++lane) banks.insert(L::off(cb + lane % 8, vb + lane / 8) % 32);
      EXPECT_EQ(banks.size(), 32u);
    }
}

TEST(BackwardMmaTiles, FragmentLoadsAreFreeOfBankConflicts) {
  expect_conflict_free_slice<bwd::KFirstSlice>();
  expect_conflict_free_slice<bwd::VFirstSlice>();
  for (int ld : {bwd::kRowLd, bwd::kSliceLd}) {
    for (int r = 0; r < 2; ++r)
      for (int k0 = 0; k0 < bwd::kSliceV; k0 += 8) {
        std::set<int> banks;  // B = U^T (product_pairs)
        for (int lane = 0; lane < 32; ++lane)
          banks.insert((bwd::frag_b_col(lane) * ld + k0 + bwd::frag_b_row(lane, r)) % 32);
        EXPECT_EQ(banks.size(), 32u);
      }
    for (int r = 0; r < 4; ++r) {
      std::set<int> banks;
      for (int lane = 0; lane < 32; ++lane)
        banks.insert((bwd::frag_a_row(lane, r) * ld + bwd::frag_a_col(lane, r)) % 32);
      EXPECT_EQ(banks.size(), 32u) << "A fragments of a row tile";
    }
  }
}

/// U = Tinv diag(b) X and dR = Tinv^T dU (the dR tiles as dU) on slice s, columns nb .., by the
/// kernel's products, against the naive products of the dense tiles: errors into eU, eR.
void check_solves(const EmuWarp& w, const Tiles& t, int s, int nb, MaxErr& eU, MaxErr& eR) {
  const int v0 = bwd::kSliceV * s;
  EmuWarp::C u = {}, dr = {};
  bwd::product_solve_U(w, u, nb, t.Tinv.data(), t.b.data(), t.X.data() + v0);
  bwd::product_solve_dR(w, dr, nb, t.Tinv.data(), t.dR[s].data());
  for_each_result(u, v0 + nb, [&](int i, int v, float got) {
    double want = 0;
    for (int j = 0; j <= i; ++j) want += double(t.Tinv[i * C + j]) * t.b[j] * t.Xd[j * D + v];
    eU.add(got, want);
  });
  for_each_result(dr, v0 + nb, [&](int i, int v, float got) {
    double want = 0;
    for (int j = i; j < C; ++j) want += double(t.Tinv[j * C + i]) * t.dRd[j * D + v];
    eR.add(got, want);
  });
}

/// Every product of the kernel, slice by slice, against naive products of the dense tiles, with
/// operands rounded to tf32 at each mma (tf32) or exact (only the index arithmetic under test).
template <class L>
void expect_products_match(bool tf32) {
  const Tiles t(11);
  EmuWarp w;
  w.tf32 = tf32;
  MaxErr eX, eU, eSolveU, eSolveR, eKd, eQd, eKr, eL, eM;
  for (int s = 0; s < Tiles::kSlices; ++s)
    for (int nb = 0; nb < bwd::kSliceV; nb += 8) {
      const int v0 = bwd::kSliceV * s;
      EmuWarp::C x = {}, du = {};
      bwd::product_residual<L>(w, x, nb, t.kd.data(), t.S<L>(s));
      bwd::product_dU(w, du, nb, t.M.data(), t.dO.data() + v0, t.kr.data(), t.dS[s].data());
      check_solves(w, t, s, nb, eSolveU, eSolveR);
      for_each_result(x, v0 + nb, [&](int i, int v, float got) {
        double want = 0;
        for (int c = 0; c < D; ++c) want += t.kdd[i * D + c] * t.Sd[c * D + v];
        eX.add(got, want);
      });
      for_each_result(du, v0 + nb, [&](int i, int v, float got) {
        double want = 0;
        for (int j = 0; j < C; ++j) want += double(t.M[j * C + i]) * t.dOd[j * D + v];
        for (int c = 0; c < D; ++c) want += t.krd[i * D + c] * t.dSd[c * D + v];
        eU.add(got, want);
      });
    }
  for (int warp = 0; warp < 8; ++warp) {
    const int n0 = 16 * warp;
    EmuWarp::C dkd[2] = {}, dqd[2] = {}, dkr[2] = {};
    for (int s = 0; s < Tiles::kSlices; ++s)
      bwd::product_state_T<L>(w, dkd, dqd, dkr, n0, t.dR[s].data(), t.dO.data() + bwd::kSliceV * s, t.U[s].data(),
                              t.S<L>(s), t.dS[s].data());
    check_state_T(dkd, n0, t.dRd, t.Sd, eKd);
    check_state_T(dqd, n0, t.dOd, t.Sd, eQd);
    check_state_T(dkr, n0, t.Ud, t.dSd, eKr);
  }
  for (int j0 = 0; j0 < C; j0 += 8)
    for (int which = 0; which < 2; ++which) {
      EmuWarp::C acc = {};
      for (int s = 0; s < Tiles::kSlices; ++s) {
        if (which == 0)
          bwd::product_pairs(w, acc, j0, t.dR[s].data(), bwd::kSliceLd, t.U[s].data());
        else
          bwd::product_pairs(w, acc, j0, t.dO.data() + bwd::kSliceV * s, bwd::kRowLd, t.U[s].data());
      }
      const std::vector<double>& P = which == 0 ? t.dRd : t.dOd;
      for_each_result(acc, j0, [&](int i, int j, float got) {
        double want = 0;
        for (int v = 0; v < D; ++v) want += P[i * D + v] * t.Ud[j * D + v];
        (which == 0 ? eL : eM).add(got, want);
      });
    }
  for (const MaxErr* e : {&eX, &eU, &eSolveU, &eSolveR, &eKd, &eQd, &eKr, &eL, &eM}) EXPECT_LE(e->rel(), 1e-5);
}

TEST(BackwardMmaTiles, ProductsMatchNaiveProducts) {
  expect_products_match<bwd::KFirstSlice>(false);
  expect_products_match<bwd::VFirstSlice>(false);
}

// With the operands rounded to tf32 at every mma, each product still keeps about fp32's
// accuracy (3xTF32); one product in plain tf32 would be ~4.9e-4 off, tf32's unit roundoff.
TEST(BackwardMmaTiles, ChunkProductsKeepFp32AccuracyInTf32) {
  expect_products_match<bwd::KFirstSlice>(true);
  expect_products_match<bwd::VFirstSlice>(true);
}

// The emulated rounding is really applied: a plain tf32 mma of the same tiles is off by about
// tf32's unit roundoff, so the test above can tell 3xTF32 from tf32.
TEST(BackwardMmaTiles, EmulatedTf32RoundingCostsAboutItsUnitRoundoff) {
  const Tiles t(12);
  EmuWarp w;
  w.tf32 = true;
  MaxErr e;
  for (int s = 0; s < Tiles::kSlices; ++s)
    for (int nb = 0; nb < bwd::kSliceV; nb += 8) {
      EmuWarp::C acc = {};
      for (int k0 = 0; k0 < D; k0 += 8) {
        const EmuWarp::A a = w.load_a([&](int r, int k) { return t.kd[r * bwd::kRowLd + k0 + k]; });
        const EmuWarp::B b = w.load_b([&](int k, int n) { return t.Sk[s][bwd::KFirstSlice::off(k0 + k, nb + n)]; });
        w.mma(acc, a, b);
      }
      for_each_result(acc, bwd::kSliceV * s + nb, [&](int i, int v, float got) {
        double want = 0;
        for (int c = 0; c < D; ++c) want += t.kdd[i * D + c] * t.Sd[c * D + v];
        e.add(got, want);
      });
    }
  EXPECT_LE(e.rel(), 2e-3);  // tf32's unit roundoff is 2^-11 ~ 4.9e-4
  EXPECT_GE(e.rel(), 1e-4);
}

// U = Tinv diag(b) X and dR = Tinv^T dU in 3xTF32 keep about fp32's accuracy (plain tf32 would
// cost about 4.9e-4).
TEST(BackwardMmaTiles, SolvesKeepFp32Accuracy) {
  const Tiles t(14);
  EmuWarp w;
  w.tf32 = true;
  MaxErr eU, eR;
  for (int s = 0; s < Tiles::kSlices; ++s)
    for (int nb = 0; nb < bwd::kSliceV; nb += 8) check_solves(w, t, s, nb, eU, eR);
  EXPECT_LE(eU.rel(), 1e-5);
  EXPECT_LE(eR.rel(), 1e-5);
}

// X = v - kd S where the state already predicts v up to 1%: plain tf32 would lose about
// 100 x 4.9e-4 of X; 3xTF32 (product_residual) keeps X to about fp32's accuracy.
TEST(BackwardMmaTiles, ResidualKeepsItsAccuracyWhenItCancels) {
  Tiles t(13);
  std::mt19937_64 rng(5);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> v(C * D), X(C * D);
  for (int i = 0; i < C; ++i)
    for (int c2 = 0; c2 < D; ++c2) {
      double p = 0;
      for (int c = 0; c < D; ++c) p += double(t.kd[i * bwd::kRowLd + c]) * t.Sd[c * D + c2];
      v[i * D + c2] = p + 0.01 * std::sqrt(double(D)) * nd(rng);  // |X| ~ |kd S| / 100
      X[i * D + c2] = v[i * D + c2] - p;
    }
  for (int split = 0; split < 2; ++split) {
    EmuWarp w;
    w.tf32 = true;
    MaxErr e;
    for (int s = 0; s < Tiles::kSlices; ++s)
      for (int nb = 0; nb < bwd::kSliceV; nb += 8) {
        const float* S = t.Sv[s].data();
        EmuWarp::C acc = {};
        if (split) {
          bwd::product_residual<bwd::VFirstSlice>(w, acc, nb, t.kd.data(), S);
        } else {
          for (int k0 = 0; k0 < D; k0 += 8)
            w.mma(acc, w.load_a([&](int r, int k) { return t.kd[r * bwd::kRowLd + k0 + k]; }),
                  w.load_b([&](int k, int n) { return S[bwd::VFirstSlice::off(k0 + k, nb + n)]; }));
        }
        for_each_result(acc, bwd::kSliceV * s + nb, [&](int i, int c, float got) {
          e.add(float(v[i * D + c]) - got, X[i * D + c]);
        });
      }
    if (split)
      EXPECT_LE(e.rel(), 5e-4) << "3xTF32";  // fp32 rounding of v and of kd S, relative to |X|
    else
      EXPECT_GE(e.rel(), 5e-3) << "plain tf32 loses about two digits here";
  }
}

// The chain's products (chain_products.cuh) against naive ones, for all eight warps of a block:
// dU^T = sum_w part_w (dS^T from the accumulator fragments, kr in the permuted channel order,
// dO^T M shared among the warps) and dS^T += dO^T qd + P^T kd. With exact operands they test
// the index arithmetic; with tf32 operands, that 3xTF32 keeps fp32's accuracy (plain tf32
// would lose ~2^-11).
void chain_case(bool tf32, double tol) {
  constexpr int V = bwd::kChainCols, L = bwd::kChainLd, VL = V;
  std::mt19937_64 rng(21);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> dS(D * V);  // dense [K][V]: the slice
  for (auto& x : dS) x = nd(rng);
  auto rows = [&](int ld, int cols) {
    std::vector<float> t(C * ld, NAN);  // the padding must never be read
    for (int i = 0; i < C; ++i)
      for (int c = 0; c < cols; ++c) t[i * ld + c] = nd(rng);
    return t;
  };
  const std::vector<float> kr = rows(L, D), qd = rows(L, D), kd = rows(L, D), dO = rows(VL, V), P = rows(VL, V);
  std::vector<float> M(C * C);
  for (auto& x : M) x = nd(rng);
  // Head and tail planes of the value-row tiles ([16][V] here), as the kernel stores them.
  auto planes = [&](const std::vector<float>& t, std::vector<float>& hi, std::vector<float>& lo) {
    hi.assign(bwd::kVecTile, NAN);
    lo.assign(bwd::kVecTile, NAN);
    for (int i = 0; i < C; ++i)
      for (int v = 0; v < V; ++v) {
        const float x = t[i * VL + v];
        const int at = bwd::vec_frag_off(i, v);
        hi[at] = tf32 ? tf32_round_host(x) : x;
        lo[at] = tf32 ? tf32_round_host(x - hi[at]) : 0.f;
      }
  };
  std::vector<float> dOhi, dOlo, Phi, Plo;
  planes(dO, dOhi, dOlo);
  planes(P, Phi, Plo);

  EmuWarp w;
  w.tf32 = tf32;
  std::vector<double> dU(V * C, 0.0);  // [v][i]
  MaxErr eU, eS;
  std::vector<double> Sgot(D * V, 0.0);
  for (int warp = 0; warp < 8; ++warp) {
    const int c0 = 16 * warp;
    EmuWarp::C ds[2][2];
    for (int mt = 0; mt < 2; ++mt)
      for (int nt = 0; nt < 2; ++nt)
        for (int lane = 0; lane < 32; ++lane)
          for (int r = 0; r < 4; ++r)
            ds[mt][nt][lane].x[r] =
                dS[(c0 + 8 * nt + bwd::frag_c_col(lane, r)) * V + 16 * mt + bwd::frag_c_row(lane, r)];
    EmuWarp::B bkr[2][2];
    bwd::chain_load_b_kr(w, bkr, kr.data(), c0);
    EmuWarp::C part[2][2];
    bwd::chain_dU_partial(w, part, ds, bkr, warp, dOhi.data(), dOlo.data(), M.data());
    for (int mt = 0; mt < 2; ++mt)
      for (int nt = 0; nt < 2; ++nt)
        for (int lane = 0; lane < 32; ++lane)
          for (int r = 0; r < 4; ++r)
            dU[(16 * mt + bwd::frag_c_row(lane, r)) * C + 8 * nt + bwd::frag_c_col(lane, r)] += part[mt][nt][lane].x[r];
    EmuWarp::A ahi[2][2], alo[2][2];
    EmuWarp::B b[2][2];
    bwd::chain_load_a_vec_T(w, ahi, dOhi.data());
    bwd::chain_load_a_vec_T(w, alo, dOlo.data());
    bwd::chain_load_b_rows(w, b, qd.data(), c0);
    bwd::chain_mma_a(w, ds, ahi, alo, b);
    bwd::chain_load_a_vec_T(w, ahi, Phi.data());
    bwd::chain_load_a_vec_T(w, alo, Plo.data());
    bwd::chain_load_b_rows(w, b, kd.data(), c0);
    bwd::chain_mma_a(w, ds, ahi, alo, b);
    for (int mt = 0; mt < 2; ++mt)
      for (int nt = 0; nt < 2; ++nt)
        for (int lane = 0; lane < 32; ++lane)
          for (int r = 0; r < 4; ++r)
            Sgot[(c0 + 8 * nt + bwd::frag_c_col(lane, r)) * V + 16 * mt + bwd::frag_c_row(lane, r)] = ds[mt][nt][lane].x[r];
  }
  for (int v = 0; v < V; ++v)
    for (int i = 0; i < C; ++i) {
      double want = 0;
      for (int m = 0; m < C; ++m) want += double(M[m * C + i]) * dO[m * VL + v];
      for (int c = 0; c < D; ++c) want += double(kr[i * L + c]) * dS[c * V + v];
      eU.add(dU[v * C + i], want);
    }
  for (int c = 0; c < D; ++c)
    for (int v = 0; v < V; ++v) {
      double want = dS[c * V + v];
      for (int i = 0; i < C; ++i) want += double(qd[i * L + c]) * dO[i * VL + v] + double(kd[i * L + c]) * P[i * VL + v];
      eS.add(Sgot[c * V + v], want);
    }
  EXPECT_LE(eU.rel(), tol) << "dU";
  EXPECT_LE(eS.rel(), tol) << "dS update";
}

TEST(BackwardMmaTiles, ChainProductsMatchNaiveProducts) { chain_case(false, 1e-6); }
TEST(BackwardMmaTiles, ChainProductsKeepFp32AccuracyIn3xTf32) { chain_case(true, 2e-6); }

TEST(BackwardMmaTiles, ChainValueTileIsInFragmentOrder) {
  std::set<int> seen;
  for (int i = 0; i < C; ++i)
    for (int v = 0; v < bwd::kChainCols; ++v) {
      const int at = bwd::vec_frag_off(i, v);
      ASSERT_GE(at, 0);
      ASSERT_LT(at, bwd::kVecTile);
      seen.insert(at);
    }
  EXPECT_EQ(seen.size(), size_t(bwd::kVecTile));
  for (int mt = 0; mt < 2; ++mt)
    for (int ks = 0; ks < 2; ++ks)
      for (int lane = 0; lane < 32; ++lane)
        for (int r = 0; r < 4; ++r)
          EXPECT_EQ(bwd::vec_frag_off(8 * ks + bwd::frag_a_col(lane, r), 16 * mt + bwd::frag_a_row(lane, r)),
                    ((mt * 2 + ks) * 32 + lane) * 4 + r);
}

TEST(BackwardMmaTiles, ChainFragmentLoadsAreFreeOfBankConflicts) {
  constexpr int L = bwd::kChainLd;
  for (int r = 0; r < 2; ++r) {  // B of qd, kd
    std::set<int> banks;
    for (int lane = 0; lane < 32; ++lane) banks.insert((bwd::frag_b_row(lane, r) * L + bwd::frag_b_col(lane)) % 32);
    EXPECT_EQ(banks.size(), 32u);
  }
  // kr's permuted B: b0 and b1 are adjacent (one 8-byte load); each half warp (lanes 16 h ..)
  // covers all 32 banks once.
  for (int h = 0; h < 2; ++h) {
    std::set<int> banks;
    for (int lane = 16 * h; lane < 16 * h + 16; ++lane) {
      const int k0 = bwd::frag_kperm(bwd::frag_b_row(lane, 0)), k1 = bwd::frag_kperm(bwd::frag_b_row(lane, 1));
      EXPECT_EQ(k1, k0 + 1);
      banks.insert((bwd::frag_b_col(lane) * L + k0) % 32);
      banks.insert((bwd::frag_b_col(lane) * L + k1) % 32);
    }
    EXPECT_EQ(banks.size(), 32u);
  }
}

}  // namespace
