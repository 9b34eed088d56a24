// y_NxF = x_NxD @ W_DxF for a few rows N, with W packed once into panels [P, D, 16].
//
// Why (see specdec_jax/kernels/__init__.py and DESIGN.md, "Machine facts"): XLA:CPU's dot takes a
// GEMM path from two rows on that reads the weights at half speed or worse, so verifying gamma + 1
// tokens cost 2-3x one token. Here every weight element is read exactly once per call whatever N
// is: a panel holds 16 output columns for all D input rows, contiguous, so one pass over the panel
// feeds R rows x 2 AVX2 accumulators (R <= 6: 12 accumulators + 2 weight registers + 1 broadcast
// fit the 16 ymm registers). Rows beyond 6 are further chunks over the same panel, which is then
// in L2 (D x 64 bytes: 32 KB for D = 512). Panels are shared out to XLA's intra-op thread pool.
//
// Panel p holds columns [16p, 16p + 16) of W; columns past F are zero padding (never stored).
//
// Weights come as float32, bfloat16 or int8 panels (three handlers, one template). bfloat16 ->
// float32 is exact (the 16 bits become the high half of the float), and the products and their
// order are the same, so bfloat16 panels of weights that are bfloat16 values (every checkpoint
// stored in bfloat16: the zoo, T5X's) give bit-for-bit the float32 panels' result from half the
// bytes. int8 panels are a LOSSY layout, for drafts only (a draft may be any distribution; the
// target never is quantized): panel p is [D + 4, 16] int8, its D weight rows followed by the 16
// column scales as float32 bytes (4 rows of 16), so one buffer holds both and a panel stays one
// contiguous stream; y[:, j] = scale_j * sum_d x[:, d] * q[d, j] (with AVX-512 in four
// interleaved partial sums, PanelChunkI8; else in the same order as the other layouts).
// q4 panels (uint8) are lossy too, drafts only: Q4_1's quantization (GGUF's; its bytes are laid
// out otherwise), 4-bit codes in blocks of 32 inputs with a float16 scale and minimum per column
// and block. SmolLM2-135M's projections are stored so, so a q4 self-draft computes with the
// target's own weights from 5/32 of their float32 bytes (PanelChunkQ4);
// y[:, j] = sum_b (d_bj sum_i x_i q_ij + m_bj sum_i x_i).
#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SPECDEC_AVX2 1
#else
#define SPECDEC_AVX2 0
#endif
#if SPECDEC_AVX2 && defined(__AVX512F__)
#define SPECDEC_AVX512 1
#else
#define SPECDEC_AVX512 0
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kPanel = 16;    // output columns per panel: two 8-float AVX2 registers
constexpr int kMaxChunkRows = 6;  // rows per pass over a panel (register budget, see above)
constexpr int kMaxChunkRowsQ4 = SPECDEC_AVX512 ? 4 : 2;  // the same for q4 panels (PanelChunkQ4)
// Below this many weight floats a call runs on the calling thread: waking a pool thread costs
// more than streaming a panel or two (the test models, the zoo drafts' small matrices).
constexpr int64_t kMinParallelFloats = 64 * 1024;
constexpr int64_t kPrefetchBytes = 2048;
constexpr int64_t kClaimFloats = 64 * 1024;  // 256 KB of weights per claim at most
constexpr int64_t kScaleRows = 4;             // int8 panels: 16 float32 scales = 4 rows of 16
// q4 panels: a block of kQ4Block inputs is kQ4Rows rows of 16 bytes: 16 rows of nibble pairs
// (row k: inputs 2k in the low nibble, 2k + 1 in the high one, one byte per column), then the 16
// columns' float16 scales (2 rows) and float16 minimums (2 rows).
constexpr int64_t kQ4Block = 32;
constexpr int64_t kQ4Pairs = kQ4Block / 2;
constexpr int64_t kQ4Rows = kQ4Pairs + 4;

// Rows a panel holds for D inputs: int8 panels carry their scales after the weights; q4 panels
// are D / 32 blocks of kQ4Rows rows.
template <typename W>
constexpr int64_t PanelRows(int64_t d) {
  return std::is_same_v<W, int8_t> ? d + kScaleRows
         : std::is_same_v<W, uint8_t> ? d / kQ4Block * kQ4Rows : d;
}

// An IEEE float16 (a q4 panel's scale or minimum) as float32, exactly.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1Fu) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else {  // zero or subnormal: mant x 2^-24, exact in float32
    float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &f, sizeof(bits));
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// How a pass over a panel prefetches: one core alone keeps too few cache misses in flight to read
// DRAM at full speed while it also does the arithmetic (measured on the 2-core EPYC: 64 MB at
// T = 6 in 8.9 ms without, 5.8 ms with kAhead). With rows beyond 6 (two or more passes over each
// panel), the last pass is arithmetic on a panel already in cache; it fetches the next panel
// (kNextPanel, one line per d: a panel is D lines), so that stream overlaps that arithmetic.
enum Prefetch { kNone, kAhead, kNextPanel };

// One panel row (16 weights) as two float32 registers / as floats.
#if SPECDEC_AVX2
inline void LoadRow(const float* w, __m256& w0, __m256& w1) {
  w0 = _mm256_loadu_ps(w);
  w1 = _mm256_loadu_ps(w + 8);
}
inline void LoadRow(const uint16_t* w, __m256& w0, __m256& w1) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  w0 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16));
  w1 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16));
}
inline void LoadRow(const int8_t* w, __m256& w0, __m256& w1) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
}
#endif
inline float ToFloat(float w) { return w; }
inline float ToFloat(int8_t w) { return static_cast<float>(w); }
inline float ToFloat(uint16_t w) {
  const uint32_t bits = static_cast<uint32_t>(w) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

#if SPECDEC_AVX2
// The prefetch a pass over panel w_Dx16 issues at its row d (see Prefetch).
template <typename W, Prefetch kPrefetch>
inline void PrefetchAt(const W* w_Dx16, int64_t D, int64_t d) {
  if (kPrefetch == kAhead) {
    _mm_prefetch(reinterpret_cast<const char*>(w_Dx16 + d * kPanel) + kPrefetchBytes, _MM_HINT_T0);
  } else if (kPrefetch == kNextPanel) {
    _mm_prefetch(reinterpret_cast<const char*>(w_Dx16 + (PanelRows<W>(D) + d) * kPanel),
                 _MM_HINT_T1);
  }
}
#endif

#if SPECDEC_AVX512
// int8 panels with AVX-512: a panel row of 16 weights widens into one zmm register, and each row
// of x sums over d in kI8Chains interleaved chains (chain u takes d = u mod kI8Chains), joined
// at the end. Why: in the AVX2 loop below an int8 row costs two widenings and two conversions
// before its two FMAs, and at one or two rows (a draft's step) each accumulator waits on its own
// previous FMA (4 cycles) for every d: the loop ran at ~4 multiply-adds a cycle, 2.7x the bytes'
// floor on the 2-core EPYC (a 134M-parameter int8 draft step 15.3 ms against 25.4 for its
// float32 target), while float32 panels are paced by DRAM anyway. R x 4 accumulators + 4
// weight registers + 1 broadcast fit the 32 zmm registers at R <= 6. A draft's result only
// (the target is never int8), so the changed summation order changes no target's output.
constexpr int kI8Chains = 4;

template <int R, Prefetch kPrefetch>
void PanelChunkI8(const float* x, int64_t D, const int8_t* w_Dx16, float* out, int64_t ldo,
                  int64_t cols) {
  __m512 acc[R][kI8Chains];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int u = 0; u < kI8Chains; ++u) acc[r][u] = _mm512_setzero_ps();
  }
  const int64_t full = D - D % kI8Chains;
  for (int64_t d = 0; d < full; d += kI8Chains) {  // 4 rows of 16 int8: one 64-byte line
    PrefetchAt<int8_t, kPrefetch>(w_Dx16, D, d);
    __m512 w[kI8Chains];
#pragma GCC unroll 4
    for (int u = 0; u < kI8Chains; ++u) {
      w[u] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(w_Dx16 + (d + u) * kPanel))));
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int u = 0; u < kI8Chains; ++u) {
        acc[r][u] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * D + d + u]), w[u], acc[r][u]);
      }
    }
  }
  for (int64_t d = full; d < D; ++d) {  // D not a multiple of 4: the last rows join chain 0
    const __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(w_Dx16 + d * kPanel))));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r][0] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * D + d]), w, acc[r][0]);
  }
  const __m512 scale = _mm512_loadu_ps(reinterpret_cast<const float*>(w_Dx16 + D * kPanel));
  const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1u);  // cols <= 16
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]),
                                     _mm512_add_ps(acc[r][2], acc[r][3]));
    _mm512_mask_storeu_ps(out + r * ldo, mask, _mm512_mul_ps(sum, scale));
  }
}
#endif

#if SPECDEC_AVX2
// The prefetch a pass over a q4 panel issues at block `blk` (its 5 lines; see Prefetch): ahead
// in this panel, or the same block of the next panel, `panel_bytes` on.
template <Prefetch kPrefetch>
inline void PrefetchQ4Block(const uint8_t* blk, int64_t panel_bytes) {
  const char* at = reinterpret_cast<const char*>(blk);
#pragma GCC unroll 5
  for (int l = 0; l < 5; ++l) {
    if (kPrefetch == kAhead) _mm_prefetch(at + kPrefetchBytes + 64 * l, _MM_HINT_T0);
    if (kPrefetch == kNextPanel) _mm_prefetch(at + panel_bytes + 64 * l, _MM_HINT_T1);
  }
}
#endif

// q4 panels: rows [0, R) of x times one panel of D / 32 blocks. sx holds each row's sums over
// each block (row stride D / 32), for the minimums' term. Per block the weights widen to float32
// (a nibble is exact) and sum against x in 4 chains (at one row each chain would otherwise wait
// on its own FMA), then y += scale * that + minimum * the block's sum of x. The same order for
// every R, so a row's result does not depend on the rows it comes with; R <= kMaxChunkRowsQ4
// (R x 4 accumulators + R sums + 4 weights fit the 32 zmm registers).
#if SPECDEC_AVX512
template <int R, Prefetch kPrefetch>
void PanelChunkQ4(const float* x, const float* sx, int64_t D, const uint8_t* w, float* out,
                  int64_t ldo, int64_t cols) {
  constexpr int C = 4;
  const int64_t nb = D / kQ4Block;
  const int64_t block_bytes = kQ4Rows * kPanel;
  const __m512i low = _mm512_set1_epi32(0xF);
  __m512 y[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) y[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * block_bytes;
    PrefetchQ4Block<kPrefetch>(blk, nb * block_bytes);
    const float* xb = x + b * kQ4Block;
    __m512 acc[R][C];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int u = 0; u < C; ++u) acc[r][u] = _mm512_setzero_ps();
    }
#pragma GCC unroll 8
    for (int k = 0; k < kQ4Pairs; k += 2) {
      const __m512i v0 = _mm512_cvtepu8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + k * kPanel)));
      const __m512i v1 = _mm512_cvtepu8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (k + 1) * kPanel)));
      const __m512 w0 = _mm512_cvtepi32_ps(_mm512_and_si512(v0, low));
      const __m512 w1 = _mm512_cvtepi32_ps(_mm512_srli_epi32(v0, 4));
      const __m512 w2 = _mm512_cvtepi32_ps(_mm512_and_si512(v1, low));
      const __m512 w3 = _mm512_cvtepi32_ps(_mm512_srli_epi32(v1, 4));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const float* xr = xb + r * D + 2 * k;
        acc[r][0] = _mm512_fmadd_ps(_mm512_set1_ps(xr[0]), w0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(_mm512_set1_ps(xr[1]), w1, acc[r][1]);
        acc[r][2] = _mm512_fmadd_ps(_mm512_set1_ps(xr[2]), w2, acc[r][2]);
        acc[r][3] = _mm512_fmadd_ps(_mm512_set1_ps(xr[3]), w3, acc[r][3]);
      }
    }
    const __m512 scale = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQ4Pairs * kPanel)));
    const __m512 minimum = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + (kQ4Pairs + 2) * kPanel)));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 q = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]),
                                     _mm512_add_ps(acc[r][2], acc[r][3]));
      y[r] = _mm512_fmadd_ps(scale, q, y[r]);
      y[r] = _mm512_fmadd_ps(minimum, _mm512_set1_ps(sx[r * nb + b]), y[r]);
    }
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1u);  // cols <= 16
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(out + r * ldo, mask, y[r]);
}
#elif SPECDEC_AVX2
// AVX2 (no AVX-512): a panel row of 16 codes is two 8-column halves; per block each row sums the
// low-nibble inputs and the high-nibble inputs in two chains per half (4 accumulators a row), R
// <= 2 (kMaxChunkRowsQ4: 16 ymm registers).
template <int R, Prefetch kPrefetch>
void PanelChunkQ4(const float* x, const float* sx, int64_t D, const uint8_t* w, float* out,
                  int64_t ldo, int64_t cols) {
  const int64_t nb = D / kQ4Block;
  const int64_t block_bytes = kQ4Rows * kPanel;
  const __m256i low = _mm256_set1_epi32(0xF);
  __m256 y0[R], y1[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) y0[r] = y1[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * block_bytes;
    PrefetchQ4Block<kPrefetch>(blk, nb * block_bytes);
    const float* xb = x + b * kQ4Block;
    __m256 acc[R][4];  // [lo half 0, lo half 1, hi half 0, hi half 1]
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) acc[r][u] = _mm256_setzero_ps();
    }
    for (int64_t k = 0; k < kQ4Pairs; ++k) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + k * kPanel));
      const __m256i v0 = _mm256_cvtepu8_epi32(v), v1 = _mm256_cvtepu8_epi32(_mm_srli_si128(v, 8));
      const __m256 lo0 = _mm256_cvtepi32_ps(_mm256_and_si256(v0, low));
      const __m256 lo1 = _mm256_cvtepi32_ps(_mm256_and_si256(v1, low));
      const __m256 hi0 = _mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4));
      const __m256 hi1 = _mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256 a = _mm256_broadcast_ss(xb + r * D + 2 * k);
        const __m256 c = _mm256_broadcast_ss(xb + r * D + 2 * k + 1);
        acc[r][0] = _mm256_fmadd_ps(a, lo0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(a, lo1, acc[r][1]);
        acc[r][2] = _mm256_fmadd_ps(c, hi0, acc[r][2]);
        acc[r][3] = _mm256_fmadd_ps(c, hi1, acc[r][3]);
      }
    }
    const __m128i hs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQ4Pairs * kPanel));
    const __m128i hs1 =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQ4Pairs * kPanel + 16));
    const __m128i hm =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (kQ4Pairs + 2) * kPanel));
    const __m128i hm1 =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (kQ4Pairs + 2) * kPanel + 16));
    const __m256 s0 = _mm256_cvtph_ps(hs), s1 = _mm256_cvtph_ps(hs1);  // F16C (AVX2 hosts have it)
    const __m256 m0 = _mm256_cvtph_ps(hm), m1 = _mm256_cvtph_ps(hm1);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 t = _mm256_set1_ps(sx[r * nb + b]);
      y0[r] = _mm256_fmadd_ps(s0, _mm256_add_ps(acc[r][0], acc[r][2]), y0[r]);
      y1[r] = _mm256_fmadd_ps(s1, _mm256_add_ps(acc[r][1], acc[r][3]), y1[r]);
      y0[r] = _mm256_fmadd_ps(m0, t, y0[r]);
      y1[r] = _mm256_fmadd_ps(m1, t, y1[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float row[kPanel];
    _mm256_store_ps(row, y0[r]);
    _mm256_store_ps(row + 8, y1[r]);
    std::memcpy(out + r * ldo, row, cols * sizeof(float));
  }
}
#else  // no AVX2/FMA: the same layout and sums, scalar
template <int R, Prefetch kPrefetch>
void PanelChunkQ4(const float* x, const float* sx, int64_t D, const uint8_t* w, float* out,
                  int64_t ldo, int64_t cols) {
  const int64_t nb = D / kQ4Block;
  float y[R][kPanel] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * kQ4Rows * kPanel;
    float acc[R][kPanel] = {};
    for (int64_t k = 0; k < kQ4Pairs; ++k) {
      for (int64_t c = 0; c < kPanel; ++c) {
        const uint8_t byte = blk[k * kPanel + c];
        const float lo = static_cast<float>(byte & 0xF), hi = static_cast<float>(byte >> 4);
        for (int r = 0; r < R; ++r) {
          const float* xr = x + r * D + b * kQ4Block + 2 * k;
          acc[r][c] += xr[0] * lo + xr[1] * hi;
        }
      }
    }
    for (int64_t c = 0; c < kPanel; ++c) {
      uint16_t hs, hm;
      std::memcpy(&hs, blk + kQ4Pairs * kPanel + 2 * c, sizeof(hs));
      std::memcpy(&hm, blk + (kQ4Pairs + 2) * kPanel + 2 * c, sizeof(hm));
      const float scale = HalfToFloat(hs), minimum = HalfToFloat(hm);
      for (int r = 0; r < R; ++r) y[r][c] += scale * acc[r][c] + minimum * sx[r * nb + b];
    }
  }
  for (int r = 0; r < R; ++r) std::memcpy(out + r * ldo, y[r], cols * sizeof(float));
}
#endif

using ChunkFnQ4 = void (*)(const float*, const float*, int64_t, const uint8_t*, float*, int64_t,
                           int64_t);
template <Prefetch kPrefetch>
constexpr ChunkFnQ4 kChunksQ4[5] = {
    nullptr, PanelChunkQ4<1, kPrefetch>, PanelChunkQ4<2, kPrefetch>, PanelChunkQ4<3, kPrefetch>,
    PanelChunkQ4<4, kPrefetch>};  // entries past kMaxChunkRowsQ4 are never called

// Rows [0, R) of x (row stride D) times one panel w_Dx16 -> out (row stride ldo), first `cols`
// columns. R is a template parameter so the accumulators stay in registers.
template <typename W, int R, Prefetch kPrefetch>
void PanelChunk(const float* x, int64_t D, const W* w_Dx16, float* out, int64_t ldo,
                int64_t cols) {
#if SPECDEC_AVX512
  if constexpr (std::is_same_v<W, int8_t>) {
    PanelChunkI8<R, kPrefetch>(x, D, w_Dx16, out, ldo, cols);
    return;
  }
#endif
#if SPECDEC_AVX2
  // Every loop over r is unrolled, so the accumulators are registers, never a stack array.
  __m256 acc0[R], acc1[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    acc0[r] = _mm256_setzero_ps();
    acc1[r] = _mm256_setzero_ps();
  }
  for (int64_t d = 0; d < D; ++d) {
    PrefetchAt<W, kPrefetch>(w_Dx16, D, d);
    __m256 w0, w1;
    LoadRow(w_Dx16 + d * kPanel, w0, w1);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 b = _mm256_broadcast_ss(x + r * D + d);
      acc0[r] = _mm256_fmadd_ps(b, w0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(b, w1, acc1[r]);
    }
  }
  if constexpr (std::is_same_v<W, int8_t>) {  // the column scales, after the D weight rows
    const float* scale = reinterpret_cast<const float*>(w_Dx16 + D * kPanel);
    const __m256 s0 = _mm256_loadu_ps(scale), s1 = _mm256_loadu_ps(scale + 8);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      acc0[r] = _mm256_mul_ps(acc0[r], s0);
      acc1[r] = _mm256_mul_ps(acc1[r], s1);
    }
  }
  if (cols == kPanel) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      _mm256_storeu_ps(out + r * ldo, acc0[r]);
      _mm256_storeu_ps(out + r * ldo + 8, acc1[r]);
    }
    return;
  }
  // The last panel of an F that is not a multiple of 16: masked stores of its first `cols`.
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(cols)), lane);
  const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(cols) - 8), lane);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm256_maskstore_ps(out + r * ldo, m0, acc0[r]);
    _mm256_maskstore_ps(out + r * ldo + 8, m1, acc1[r]);
  }
#else  // scalar fallback (no AVX2/FMA): same layout, same single pass over the panel
  float acc[R][kPanel] = {};
  for (int64_t d = 0; d < D; ++d) {
    const W* w = w_Dx16 + d * kPanel;
    for (int r = 0; r < R; ++r) {
      const float b = x[r * D + d];
      for (int c = 0; c < kPanel; ++c) acc[r][c] += b * ToFloat(w[c]);
    }
  }
  if constexpr (std::is_same_v<W, int8_t>) {
    float scale[kPanel];
    std::memcpy(scale, w_Dx16 + D * kPanel, sizeof(scale));
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < kPanel; ++c) acc[r][c] *= scale[c];
    }
  }
  for (int r = 0; r < R; ++r) std::memcpy(out + r * ldo, acc[r], cols * sizeof(float));
#endif
}

template <typename W>
using ChunkFn = void (*)(const float*, int64_t, const W*, float*, int64_t, int64_t);
template <typename W, Prefetch kPrefetch>
constexpr ChunkFn<W> kChunks[kMaxChunkRows + 1] = {
    nullptr, PanelChunk<W, 1, kPrefetch>, PanelChunk<W, 2, kPrefetch>,
    PanelChunk<W, 3, kPrefetch>, PanelChunk<W, 4, kPrefetch>, PanelChunk<W, 5, kPrefetch>,
    PanelChunk<W, 6, kPrefetch>};

// $SPECDEC_KERNEL_THREADS caps the threads one call uses (read once; unset: XLA's pool size).
int64_t MaxThreads() {
  static const int64_t cap = [] {
    const char* env = std::getenv("SPECDEC_KERNEL_THREADS");
    const long v = env == nullptr ? 0 : std::strtol(env, nullptr, 10);
    return v > 0 ? static_cast<int64_t>(v) : INT64_MAX;
  }();
  return cap;
}

template <typename W>
struct Job {
  const float* x;
  const W* w;
  float* y;
  std::vector<float> sx;  // q4 panels only: each row's sum over each block of 32 inputs [N, D / 32]
  int64_t n, d, f, panels, grain;
  std::atomic<int64_t> next{0};  // first panel not yet claimed
  std::atomic<int64_t> done{0};  // panels finished
};

// All N rows for panels [p0, p1): rows in near-equal chunks of at most kMaxChunkRows (9 rows run
// as 5 + 4, not 6 + 3, so both passes keep their accumulators busy).
template <typename W>
void RunPanels(const Job<W>& job, int64_t p0, int64_t p1) {
  constexpr int64_t kRows = std::is_same_v<W, uint8_t> ? kMaxChunkRowsQ4 : kMaxChunkRows;
  const int64_t chunks = (job.n + kRows - 1) / kRows;
  for (int64_t p = p0; p < p1; ++p) {
    const W* w = job.w + p * PanelRows<W>(job.d) * kPanel;
    const int64_t cols = std::min(kPanel, job.f - p * kPanel);
    int64_t row = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t rows = (job.n - row) / (chunks - c);  // ceil-balanced remaining split
      const int64_t r = rows + ((job.n - row) % (chunks - c) != 0);
      if constexpr (std::is_same_v<W, uint8_t>) {
        const ChunkFnQ4* fns = c == 0 ? kChunksQ4<kAhead>
                               : c + 1 == chunks ? kChunksQ4<kNextPanel> : kChunksQ4<kNone>;
        fns[r](job.x + row * job.d, job.sx.data() + row * (job.d / kQ4Block), job.d, w,
               job.y + row * job.f + p * kPanel, job.f, cols);
      } else {
        const ChunkFn<W>* fns = c == 0 ? kChunks<W, kAhead>
                                : c + 1 == chunks ? kChunks<W, kNextPanel> : kChunks<W, kNone>;
        fns[r](job.x + row * job.d, job.d, w, job.y + row * job.f + p * kPanel, job.f, cols);
      }
      row += r;
    }
  }
}

// Claims panel blocks until none are left. Every thread that takes part (the caller and any pool
// tasks that get to run) loops here, so a pool task that starts late finds nothing and returns:
// the caller never waits for a task that has not started, only for claimed blocks in progress.
template <typename W>
void Claim(Job<W>& job) {
  for (;;) {
    const int64_t p0 = job.next.fetch_add(job.grain, std::memory_order_relaxed);
    if (p0 >= job.panels) return;
    const int64_t p1 = std::min(p0 + job.grain, job.panels);
    RunPanels(job, p0, p1);
    job.done.fetch_add(p1 - p0, std::memory_order_release);
  }
}

template <ffi::DataType kW>
ffi::Error PackedMatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x_NxD,
                            ffi::Buffer<kW> w_PxDx16, ffi::ResultBuffer<ffi::F32> y_NxF) {
  using W = ffi::NativeType<kW>;
  const auto xd = x_NxD.dimensions();
  const auto wd = w_PxDx16.dimensions();
  const auto yd = y_NxF->dimensions();
  if (xd.size() != 2 || wd.size() != 3 || yd.size() != 2) {
    return ffi::Error::InvalidArgument(
        "specdec_packed_matmul: expected x [N, D], w [P, rows, 16], y [N, F]; got ranks " +
        std::to_string(xd.size()) + ", " + std::to_string(wd.size()) + ", " +
        std::to_string(yd.size()));
  }
  const int64_t n = xd[0], d = xd[1], panels = wd[0], f = yd[1];
  if (std::is_same_v<W, uint8_t> && d % kQ4Block != 0) {
    return ffi::Error::InvalidArgument("specdec_packed_matmul: q4 panels need D a multiple of " +
                                       std::to_string(kQ4Block) + "; got D = " +
                                       std::to_string(d));
  }
  if (wd[1] != PanelRows<W>(d) || wd[2] != kPanel || yd[0] != n || f > panels * kPanel ||
      f <= (panels - 1) * kPanel) {
    return ffi::Error::InvalidArgument(
        "specdec_packed_matmul: shapes do not agree: x [" + std::to_string(n) + ", " +
        std::to_string(d) + "], w [" + std::to_string(wd[0]) + ", " + std::to_string(wd[1]) +
        ", " + std::to_string(wd[2]) + "], y [" + std::to_string(yd[0]) + ", " +
        std::to_string(f) + "]; w must hold ceil(F / 16) panels of D x 16 (int8: D + 4 x 16, the " +
        "scales after the weights; q4: D / 32 blocks of 20 x 16)");
  }
  if (n == 0 || f == 0) return ffi::Error::Success();
  if (d == 0) {
    std::memset(y_NxF->typed_data(), 0, n * f * sizeof(float));
    return ffi::Error::Success();
  }
  auto job = std::make_shared<Job<W>>();
  job->x = x_NxD.typed_data();
  job->w = w_PxDx16.typed_data();
  job->y = y_NxF->typed_data();
  job->n = n;
  job->d = d;
  job->f = f;
  job->panels = panels;
  if constexpr (std::is_same_v<W, uint8_t>) {
    const int64_t nb = d / kQ4Block;
    job->sx.assign(n * nb, 0.0f);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t b = 0; b < nb; ++b) {
        float s = 0.0f;
        for (int64_t i = 0; i < kQ4Block; ++i) s += job->x[r * d + b * kQ4Block + i];
        job->sx[r * nb + b] = s;
      }
    }
  }
  const int64_t threads = panels * PanelRows<W>(d) * kPanel < kMinParallelFloats
                              ? 1 : std::max<int64_t>(1, std::min(pool.num_threads(), MaxThreads()));
  // At least eight claims per thread and at most kClaimFloats weights per claim: even shares
  // when one thread is slowed by another process, and little left to wait for at the end (claims
  // of 8 MB left the caller waiting 5 ms of a 20 ms call on a 128 MB matrix).
  job->grain = std::max<int64_t>(
      1, std::min(panels / (8 * threads), kClaimFloats / (PanelRows<W>(d) * kPanel)));
  const int64_t blocks = (panels + job->grain - 1) / job->grain;
  for (int64_t t = 1; t < std::min(threads, blocks); ++t) {
    pool.Schedule([job] { Claim(*job); });
  }
  Claim(*job);
  while (job->done.load(std::memory_order_acquire) < panels) std::this_thread::yield();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecPackedMatmul, PackedMatmulImpl<ffi::F32>,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [N, D]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w [P, D, 16]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [N, F]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecPackedMatmulBf16, PackedMatmulImpl<ffi::BF16>,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // x [N, D]
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // w [P, D, 16], bfloat16
                                  .Ret<ffi::Buffer<ffi::F32>>()   // y [N, F]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecPackedMatmulI8, PackedMatmulImpl<ffi::S8>,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [N, D]
                                  .Arg<ffi::Buffer<ffi::S8>>()   // w [P, D + 4, 16], int8 + scales
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [N, F]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecPackedMatmulQ4, PackedMatmulImpl<ffi::U8>,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [N, D]
                                  .Arg<ffi::Buffer<ffi::U8>>()   // w [P, D / 32 x 20, 16], q4
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [N, F]
);

// cache[b, ..., start[b] + t, ...] = block[b, ..., t, ...] along axis `axis` (1 <= axis < rank;
// the dimensions before it, after the batch, are M, those after it N: one contiguous run of
// T x N per (example, M index)): a decode step's cache write, in place (the program aliases
// the result to `cache`; a copy first only if it gave the result a buffer of its own). Why
// (kernels/cache_write.py): XLA:CPU fused its own update of the cache into both attention's read
// and the returned cache and copied every layer's whole cache for each; a custom call is fused
// into nothing. A block must fit: one that does not is an error, never a clamped or dropped write.
namespace {
ffi::Error WriteBlockImpl(ffi::AnyBuffer cache, ffi::AnyBuffer block, ffi::Buffer<ffi::S32> start_B,
                          ffi::Result<ffi::AnyBuffer> out, int64_t axis) {
  const auto cd = cache.dimensions();
  const auto bd = block.dimensions();
  const int64_t rank = static_cast<int64_t>(cd.size());
  bool ok = rank >= 2 && axis >= 1 && axis < rank && static_cast<int64_t>(bd.size()) == rank &&
            block.element_type() == cache.element_type() &&
            start_B.dimensions().size() == 1 && start_B.dimensions()[0] == cd[0];
  for (int64_t i = 0; ok && i < rank; ++i) ok = i == axis || bd[i] == cd[i];
  if (!ok) {
    return ffi::Error::InvalidArgument(
        "specdec_cache_write: expected a block of the cache's dtype and shape but for the write "
        "axis, start [B], 1 <= axis < rank");
  }
  int64_t m = 1, n = 1;
  for (int64_t i = 1; i < axis; ++i) m *= cd[i];
  for (int64_t i = axis + 1; i < rank; ++i) n *= cd[i];
  const int64_t batch = cd[0], slots = cd[axis], t = bd[axis];
  const size_t width = ffi::ByteWidth(cache.element_type());
  char* dst = static_cast<char*>(out->untyped_data());
  if (dst != cache.untyped_data()) std::memcpy(dst, cache.untyped_data(), cache.size_bytes());
  const char* src = static_cast<const char*>(block.untyped_data());
  const int32_t* start = start_B.typed_data();
  const size_t run = static_cast<size_t>(t * n) * width;
  for (int64_t b = 0; b < batch; ++b) {
    if (start[b] < 0 || start[b] + t > slots) {
      return ffi::Error::InvalidArgument(
          "specdec_cache_write: example " + std::to_string(b) + " writes slots " +
          std::to_string(start[b]) + ".." + std::to_string(start[b] + t - 1) + " of a cache of " +
          std::to_string(slots) + " (a decoder sizes its caches for its largest block)");
    }
    for (int64_t i = 0; i < m; ++i) {
      std::memcpy(dst + ((b * m + i) * slots + start[b]) * n * width, src + (b * m + i) * run,
                  run);
    }
  }
  return ffi::Error::Success();
}
}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecCacheWrite, WriteBlockImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()         // cache [B, ..., S, ...]
                                  .Arg<ffi::AnyBuffer>()         // block [B, ..., T, ...]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // start [B]
                                  .Ret<ffi::AnyBuffer>()         // the cache, aliased
                                  .Attr<int64_t>("axis"));

// Decode attention over the filled slots only. Why (kernels/attention.py): a decode step attends
// over every slot of its cache (the prompt's bucket + the longest decode + gamma), while the
// slots at or past index + T are masked; XLA's products read them all (SmolLM2: ~2.6 ms per
// 1,000 slots a step, its drafts' and target's alike). Two calls around XLA's softmax:
//   logits[b, g, r, s] = sum_k q[b, g, r, k] k[b, g, k, s] + bias[b, hb, r % T, s], s < limit[b]
//                        (-inf past it: exactly the zero weight a masked slot gets);
//   y[b, g, r, :]      = sum_{s < limit[b]} w[b, g, r, s] v[b, g, s, :].
// Rows r are a group's query heads x T positions (r = head * T + t), hb the bias head (0 when the
// bias has one head, else g * (R / T) + r / T). Every output element is summed in one fixed
// order (k, then s, ascending) whatever T, R or the limit are, so a row computed in a 1-token
// step and in a T-token verify at the same position agree bit for bit: slots past the row's
// causal position give weight 0, and adding 0 x v changes no sum.
namespace {
constexpr int64_t kAttnBlock = 256;  // slots per pass: R x 256 floats of partial logits

ffi::Error AttnLogitsImpl(ffi::Buffer<ffi::F32> q_BxGxRxK, ffi::Buffer<ffi::F32> k_BxGxKxS,
                          ffi::Buffer<ffi::F32> bias_BxHxTxS, ffi::Buffer<ffi::S32> limit_B,
                          ffi::ResultBuffer<ffi::F32> out_BxGxRxS) {
  const auto qd = q_BxGxRxK.dimensions();
  const auto kd = k_BxGxKxS.dimensions();
  const auto bd = bias_BxHxTxS.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || bd.size() != 4 || kd[0] != qd[0] || kd[1] != qd[1] ||
      kd[2] != qd[3] || bd[0] != qd[0] || bd[3] != kd[3] || bd[2] <= 0 || qd[2] % bd[2] != 0 ||
      limit_B.dimensions().size() != 1 || limit_B.dimensions()[0] != qd[0] ||
      (bd[1] != 1 && bd[1] != qd[1] * (qd[2] / bd[2]))) {
    return ffi::Error::InvalidArgument(
        "specdec_attention_logits: expected q [B, G, R, K], k [B, G, K, S], bias [B, 1 or H, T, "
        "S] with R a multiple of T, limit [B]");
  }
  const int64_t batch = qd[0], groups = qd[1], rows = qd[2], dim = qd[3], slots = kd[3];
  const int64_t t_len = bd[2], bias_heads = bd[1], heads_per_group = rows / t_len;
  const float* q = q_BxGxRxK.typed_data();
  const float* k = k_BxGxKxS.typed_data();
  const float* bias = bias_BxHxTxS.typed_data();
  const int32_t* limit = limit_B.typed_data();
  float* out = out_BxGxRxS->typed_data();
  std::vector<float> acc(static_cast<size_t>(rows * kAttnBlock));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t lim = std::min<int64_t>(std::max<int32_t>(limit[b], 0), slots);
    for (int64_t g = 0; g < groups; ++g) {
      const float* qg = q + (b * groups + g) * rows * dim;
      const float* kg = k + (b * groups + g) * dim * slots;
      float* og = out + (b * groups + g) * rows * slots;
      for (int64_t s0 = 0; s0 < lim; s0 += kAttnBlock) {
        const int64_t n = std::min(kAttnBlock, lim - s0);
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t d = 0; d < dim; ++d) {
          const float* krow = kg + d * slots + s0;
          for (int64_t r = 0; r < rows; ++r) {
            const float qv = qg[r * dim + d];
            float* a = acc.data() + r * kAttnBlock;
            for (int64_t s = 0; s < n; ++s) a[s] += qv * krow[s];
          }
        }
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t hb = bias_heads == 1 ? 0 : g * heads_per_group + r / t_len;
          const float* brow = bias + ((b * bias_heads + hb) * t_len + r % t_len) * slots + s0;
          const float* a = acc.data() + r * kAttnBlock;
          float* o = og + r * slots + s0;
          for (int64_t s = 0; s < n; ++s) o[s] = a[s] + brow[s];
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        std::fill(og + r * slots + lim, og + (r + 1) * slots, -INFINITY);
      }
    }
  }
  return ffi::Error::Success();
}

ffi::Error AttnValuesImpl(ffi::Buffer<ffi::F32> w_BxGxRxS, ffi::Buffer<ffi::F32> v_BxGxSxK,
                          ffi::Buffer<ffi::S32> limit_B, ffi::ResultBuffer<ffi::F32> y_BxGxRxK) {
  const auto wd = w_BxGxRxS.dimensions();
  const auto vd = v_BxGxSxK.dimensions();
  if (wd.size() != 4 || vd.size() != 4 || vd[0] != wd[0] || vd[1] != wd[1] || vd[2] != wd[3] ||
      limit_B.dimensions().size() != 1 || limit_B.dimensions()[0] != wd[0]) {
    return ffi::Error::InvalidArgument(
        "specdec_attention_values: expected w [B, G, R, S], v [B, G, S, K], limit [B]");
  }
  const int64_t batch = wd[0], groups = wd[1], rows = wd[2], slots = wd[3], dim = vd[3];
  const float* w = w_BxGxRxS.typed_data();
  const float* v = v_BxGxSxK.typed_data();
  const int32_t* limit = limit_B.typed_data();
  float* y = y_BxGxRxK->typed_data();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t lim = std::min<int64_t>(std::max<int32_t>(limit[b], 0), slots);
    for (int64_t g = 0; g < groups; ++g) {
      const float* wg = w + (b * groups + g) * rows * slots;
      const float* vg = v + (b * groups + g) * slots * dim;
      float* yg = y + (b * groups + g) * rows * dim;
      std::fill(yg, yg + rows * dim, 0.0f);
      for (int64_t s = 0; s < lim; ++s) {
        const float* vrow = vg + s * dim;
        for (int64_t r = 0; r < rows; ++r) {
          const float ws = wg[r * slots + s];
          if (ws == 0.0f) continue;  // a masked slot: adding 0 x v changes no sum
          float* yr = yg + r * dim;
          for (int64_t d = 0; d < dim; ++d) yr[d] += ws * vrow[d];
        }
      }
    }
  }
  return ffi::Error::Success();
}
}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecAttentionLogits, AttnLogitsImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q [B, G, R, K]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k [B, G, K, S]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // bias [B, 1 or H, T, S]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // limit [B]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // logits [B, G, R, S]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecAttentionValues, AttnValuesImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // weights [B, G, R, S]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v [B, G, S, K]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // limit [B]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [B, G, R, K]
);
