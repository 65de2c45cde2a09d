/* The CPU kernels of glm53_flash/model/ops/: float32 matrix products for cached decoding (a few
 * rows, one per sequence in the batch, against a weight matrix read once per step from memory: BLAS
 * libraries tune for large M and at 4-32 rows stream the weights at a fraction of the memory
 * bandwidth; these loops keep a block of weight rows in registers/L1 and run every input row past it,
 * so each weight byte is loaded once per call), the sparse layer's decode step, a block's whole decode
 * step in three pieces (a decode step of every block in one call), and two pieces of training at any row count: the SwiGLU activation's forward
 * and backward (one pass over memory each, a vectorised exp) and RMSNorm's forward and backward.
 *
 * Built on first use by ops/library.py for the widest vectors the CPU has: 16 lanes (cc -O3 -mavx512f
 * -mavx2 -mfma -fopenmp) on AVX-512, else 8 lanes (-mavx2 -mfma). The same source serves both through
 * the vector helpers below; inner sizes need only be multiples of 8 (a 16-lane loop reads its last 8
 * floats with a masked load). The eager torch path is the fallback and the test oracle. OpenMP shares
 * the runtime torch already loaded (the same libgomp soname), so the threads are torch's.
 *
 * Every output element is computed by exactly one thread in a fixed order, so results do not depend
 * on the thread count (they do depend on the lane count, in the last bits, like any change of
 * summation order).
 *
 * The entry points are the glm53_* functions at the end of the file. Each checks the sizes it is given
 * against what its loops and fixed buffers hold (the LIMIT_* numbers below) and returns OUT_OF_RANGE
 * without touching memory when they do not hold; each op's wrapper (ops/<op>.py) checks the same rules first and raises a
 * clear error, so the checks here are the second line, for a caller that bypasses the first.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* What every entry point returns. */
#define OK 0
#define NO_MEMORY 1
#define OUT_OF_RANGE 2
#define REQUIRE(condition) do { if (!(condition)) return OUT_OF_RANGE; } while (0)
/* The fixed buffers' sizes (ops/library.py's LIMITS; glm53_limits reports them so a test can compare). */
#define LIMIT_EXPERTS 64    /* router logits per token: logits[], next[] */
#define LIMIT_TOP_K 8       /* chosen experts per token: top[] */
#define LIMIT_HEAD_DIM 256  /* per-head rows of the attention steps: pq[], rq[], ... */
#define LIMIT_KEYS 4096     /* attention scores of one sparse step: the kept keys and the query's own */
#define LIMIT_STREAMS 64    /* residual streams mixed by a block: w[] */
#define LIMIT_SLOTS 4096    /* tokens x top_k routed by one dispatch: its stack array chosen[] */

#if defined(__AVX512F__)
#define LANES 16
typedef __m512 vec;
typedef __mmask16 lanes_mask;
/* All 16 lanes, or the first 8 for the last step of a loop over k_len % 16 == 8 floats. */
static inline lanes_mask mask_at(int64_t k, int64_t k_len) { return k + 16 <= k_len ? 0xFFFF : 0x00FF; }
/* Whole 16-float steps take plain loads and stores: on a 2-core AMD EPYC (CPU family 26) the masked
 * forms, even with every lane on, ran the decode step's products ~1.4x slower (8.8/7.2 ms against
 * 6.1/5.3 ms, measured while building). */
static inline vec vload(const float *p, lanes_mask m) {
    return m == 0xFFFF ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
}
static inline void vstore(float *p, vec v, lanes_mask m) {
    if (m == 0xFFFF)
        _mm512_storeu_ps(p, v);
    else
        _mm512_mask_storeu_ps(p, m, v);
}
/* 16 bf16 weights (or the first 8, zeros after them) widened to float32: a bf16 is the upper half of a
 * float32, so the widening is exact. */
static inline vec vload_bf16(const uint16_t *p, lanes_mask m) {
    __m256i h = m == 0xFFFF ? _mm256_loadu_si256((const __m256i *)p)
                            : _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
/* 16 floats (or the first 8) rounded to bf16 as torch rounds them: to nearest, ties to even, a NaN to
 * 0x7FC0. */
static inline void vstore_bf16(uint16_t *p, vec v, lanes_mask m) {
    __m512i bits = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
    rounded = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), _mm512_set1_epi32(0x7FC0), rounded);
    __m256i h = _mm512_cvtepi32_epi16(rounded);
    if (m == 0xFFFF)
        _mm256_storeu_si256((__m256i *)p, h);
    else
        _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(h));
}
static inline vec vzero(void) { return _mm512_setzero_ps(); }
static inline vec vset1(float x) { return _mm512_set1_ps(x); }
static inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline vec vmul(vec a, vec b) { return _mm512_mul_ps(a, b); }
static inline vec vadd(vec a, vec b) { return _mm512_add_ps(a, b); }
static inline vec vsub(vec a, vec b) { return _mm512_sub_ps(a, b); }
static inline vec vdiv(vec a, vec b) { return _mm512_div_ps(a, b); }
static inline vec vclamp(vec a, float lo, float hi) { return _mm512_min_ps(_mm512_max_ps(a, vset1(lo)), vset1(hi)); }
static inline vec vround(vec a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* 2^n for whole n in [-127, 128], built in the exponent field: 0 at -127, +inf at 128. */
static inline vec vpow2(vec n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
static inline __m256 half_sum(vec a) {
    return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}
#else
#define LANES 8
typedef __m256 vec;
typedef int lanes_mask;  /* k_len % 8 == 0: every step is whole */
static inline lanes_mask mask_at(int64_t k, int64_t k_len) { (void)k; (void)k_len; return 0; }
static inline vec vload(const float *p, lanes_mask m) { (void)m; return _mm256_loadu_ps(p); }
static inline void vstore(float *p, vec v, lanes_mask m) { (void)m; _mm256_storeu_ps(p, v); }
static inline vec vload_bf16(const uint16_t *p, lanes_mask m) {
    (void)m;
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline void vstore_bf16(uint16_t *p, vec v, lanes_mask m) {
    (void)m;
    __m256i bits = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    rounded = _mm256_blendv_epi8(_mm256_set1_epi32(0x7FC0), rounded, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_ORD_Q)));
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(rounded, rounded), 0x08);
    _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(packed));
}
static inline vec vzero(void) { return _mm256_setzero_ps(); }
static inline vec vset1(float x) { return _mm256_set1_ps(x); }
static inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline vec vmul(vec a, vec b) { return _mm256_mul_ps(a, b); }
static inline vec vadd(vec a, vec b) { return _mm256_add_ps(a, b); }
static inline vec vsub(vec a, vec b) { return _mm256_sub_ps(a, b); }
static inline vec vdiv(vec a, vec b) { return _mm256_div_ps(a, b); }
static inline vec vclamp(vec a, float lo, float hi) { return _mm256_min_ps(_mm256_max_ps(a, vset1(lo)), vset1(hi)); }
static inline vec vround(vec a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vec vpow2(vec n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
static inline __m256 half_sum(vec a) { return a; }
#endif
#define FULL ((lanes_mask)-1)

/* The number of float lanes this build uses (ops/library.py reports it). */
int64_t glm53_lanes(void) { return LANES; }

/* Weights are float32, or bf16 (uint16) for cached decoding in bf16: the product kernels below take
 * `const void *` weights and a compile-time `bf16` flag after inlining (each kernel has one wrapper per
 * weight type), index them in elements, and widen bf16 to float32 as they load it, so the arithmetic,
 * its order and every accumulator are the float32 kernels' own: a product on bf16 weights equals the
 * float32 kernel on the same weights rounded to bf16, bit for bit, and reads half the bytes. */
static inline __attribute__((always_inline)) vec wload(const void *w, int64_t i, lanes_mask m, const int bf16) {
    return bf16 ? vload_bf16((const uint16_t *)w + i, m) : vload((const float *)w + i, m);
}
static inline __attribute__((always_inline)) const char *wbyte(const void *w, int64_t i, const int bf16) {
    return (const char *)w + i * (bf16 ? 2 : 4);
}
/* The SwiGLU kernels' activations are float32 too, or bf16 for training's bf16 weight products
 * (model/precision.py): wload widens them and wstore rounds the results to bf16 as it stores them, the
 * arithmetic between stays float32, so the bf16 kernels equal the float32 ones on the widened inputs with
 * the outputs rounded, bit for bit (what casting around the float32 kernel gave, without the casts). */
static inline __attribute__((always_inline)) void wstore(void *p, int64_t i, vec v, lanes_mask m, const int bf16) {
    if (bf16)
        vstore_bf16((uint16_t *)p + i, v, m);
    else
        vstore((float *)p + i, v, m);
}

/* Four accumulators -> their four horizontal sums. */
static inline __m128 sum4(vec a4, vec b4, vec c4, vec d4) {
    __m256 a = half_sum(a4), b = half_sum(b4), c = half_sum(c4), d = half_sum(d4);
    __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d), abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

static inline float sum1(vec a4) {
    __m256 a = half_sum(a4);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_hadd_ps(s, s);
    s = _mm_hadd_ps(s, s);
    return _mm_cvtss_f32(s);
}

/* How far ahead the product kernels prefetch their weights, in weight rows (measured on the experts'
 * shapes, 2-core AMD EPYC: 16 rows ran the up projection ~2x faster than none, 32 no better). */
#define AHEAD_ROWS 16

/* out[r, n0 + j] = sum_k x[r, k] * w[n0 + j, k] for `rows` input rows and the four weight rows
 * j < 4, one accumulator per pair; rows is a compile-time constant after inlining. */
static inline __attribute__((always_inline)) void rows_pass(const float *x, const void *w0, float *out, int64_t ldo,
                                                            int64_t k_len, const int rows, const int bf16) {
    vec acc[4][4];
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < 4; j++)
            acc[r][j] = vzero();
    for (int64_t k = 0; k < k_len; k += LANES) {
        lanes_mask mk = mask_at(k, k_len);
        vec v[4];
        for (int j = 0; j < 4; j++)
            v[j] = wload(w0, j * k_len + k, mk, bf16);
        for (int r = 0; r < rows; r++) {
            vec y = vload(x + r * k_len + k, mk);
            for (int j = 0; j < 4; j++)
                acc[r][j] = vfma(y, v[j], acc[r][j]);
        }
    }
    for (int r = 0; r < rows; r++)
        _mm_storeu_ps(out + r * ldo, sum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
}

/* Input rows per pass: 4 x 4 accumulators fit AVX-512's 32 registers; AVX2's 16 take 3 x 4 at most
 * beside the weights. */
#define ROWS_PASS (LANES == 16 ? 4 : 3)

/* out[m, n] = sum_k x[m, k] * w[n, k] for weight rows n0 <= n < n0 + 4 (nn.Linear's layout). K % 8 == 0. */
static inline __attribute__((always_inline)) void rows_by_4_any(const float *x, const void *w, float *out,
                                                                int64_t m_rows, int64_t n0, int64_t ldo,
                                                                int64_t k_len, const int bf16) {
    const void *w0 = wbyte(w, n0 * k_len, bf16);
    /* Ask for the weight rows AHEAD_ROWS on (four blocks later in this thread's stream) now: with a few
     * input rows there is too little work per loaded line for the hardware prefetchers to keep enough
     * loads in flight (the experts' up projection ran at less than half the memory bandwidth). A
     * prefetch past the end of the weights is harmless: it cannot fault. */
    for (int64_t i = 0; i < 4 * k_len; i += 64 / (bf16 ? 2 : 4))
        _mm_prefetch(wbyte(w0, AHEAD_ROWS * k_len + i, bf16), _MM_HINT_T0);
    int64_t m = 0;
    for (; m + ROWS_PASS <= m_rows; m += ROWS_PASS)
        rows_pass(x + m * k_len, w0, out + m * ldo + n0, ldo, k_len, ROWS_PASS, bf16);
    switch (m_rows - m) {  /* fewer than ROWS_PASS left: one pass over all of them */
    case 3: rows_pass(x + m * k_len, w0, out + m * ldo + n0, ldo, k_len, 3, bf16); break;
    case 2: rows_pass(x + m * k_len, w0, out + m * ldo + n0, ldo, k_len, 2, bf16); break;
    case 1: rows_pass(x + m * k_len, w0, out + m * ldo + n0, ldo, k_len, 1, bf16); break;
    default: break;
    }
}
static void rows_by_4(const float *x, const void *w, float *out, int64_t m_rows, int64_t n0, int64_t ldo,
                      int64_t k_len) { rows_by_4_any(x, w, out, m_rows, n0, ldo, k_len, 0); }
static void rows_by_4_bf16(const float *x, const void *w, float *out, int64_t m_rows, int64_t n0, int64_t ldo,
                           int64_t k_len) { rows_by_4_any(x, w, out, m_rows, n0, ldo, k_len, 1); }

/* The same for one weight row n (the tail when N % 4 != 0). */
static void rows_by_1(const float *x, const void *w, float *out, int64_t m_rows, int64_t n,
                      int64_t ldo, int64_t k_len, const int bf16) {
    const void *w0 = wbyte(w, n * k_len, bf16);
    for (int64_t m = 0; m < m_rows; m++) {
        const float *x0 = x + m * k_len;
        vec a = vzero();
        for (int64_t k = 0; k < k_len; k += LANES) {
            lanes_mask mk = mask_at(k, k_len);
            a = vfma(vload(x0 + k, mk), wload(w0, k, mk, bf16), a);
        }
        out[m * ldo + n] = sum1(a);
    }
}

/* x [M, K] @ w[N, K]^T -> out [M, N], all contiguous; K % 8 == 0. */
static void linear_any(const float *x, const void *w, float *out, int64_t m_rows, int64_t n_cols, int64_t k_len,
                       int bf16) {
    int64_t blocks = n_cols / 4;
    if (bf16) {
#pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < blocks; b++)
            rows_by_4_bf16(x, w, out, m_rows, 4 * b, n_cols, k_len);
    } else {
#pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < blocks; b++)
            rows_by_4(x, w, out, m_rows, 4 * b, n_cols, k_len);
    }
    for (int64_t n = 4 * blocks; n < n_cols; n++)
        rows_by_1(x, w, out, m_rows, n, n_cols, k_len, bf16);
}
static void linear(const float *x, const float *w, float *out, int64_t m_rows, int64_t n_cols, int64_t k_len) {
    linear_any(x, w, out, m_rows, n_cols, k_len, 0);
}

/* A block kernel: out[m, n0 : n0 + width] for m_rows rows of x against one expert's weights. */
typedef void (*block_kernel)(const float *x, const void *w, float *out, int64_t m_rows, int64_t n0,
                             int64_t n_cols, int64_t k_len);

/* Rows sorted by expert (offsets[e] = end of expert e's rows, the cumulative counts), each expert's
 * weights n_cols * k_len floats apart: the work is split over (expert, block of `width` outputs). */
static void grouped(block_kernel kernel, int64_t width, const float *rows, const void *w, int bf16,
                    const int64_t *offsets, float *out, int64_t experts, int64_t n_cols, int64_t k_len) {
    int64_t blocks = (n_cols + width - 1) / width;  /* the kernel clips the last block to n_cols */
#pragma omp parallel for schedule(static)
    for (int64_t item = 0; item < experts * blocks; item++) {
        int64_t e = item / blocks, b = item % blocks;
        int64_t start = e ? offsets[e - 1] : 0, count = offsets[e] - start;
        if (count > 0)
            kernel(rows + start * k_len, wbyte(w, e * n_cols * k_len, bf16), out + start * n_cols, count,
                   width * b, n_cols, k_len);
    }
}

/* rows [M, K] sorted by expert, w [E, N, K] (nn.Linear layout per expert) -> out [M, N], row i
 * through its expert. K % 8 == 0, N % 4 == 0. */
static void grouped_linear(const float *rows, const void *w, int bf16, const int64_t *offsets, float *out,
                           int64_t experts, int64_t n_cols, int64_t k_len) {
    grouped(bf16 ? rows_by_4_bf16 : rows_by_4, 4, rows, w, bf16, offsets, out, experts, n_cols, k_len);
}

/* out[m, n0:n0 + vecs * LANES] = sum_k x[m, k] * w[k, n0:n0 + vecs * LANES] (x @ W layout, w [K, N])
 * for `rows` rows at once; rows and vecs are compile-time constants after inlining (accumulators
 * stay in registers). Each row keeps one
 * accumulator per vector summed over k in order, whatever pass it falls in, so a row's result does
 * not depend on how many rows its expert has. */
#define COLVECS (16 / LANES)
#define BLOCK_VECS 4
#define BLOCK_COLS (BLOCK_VECS * LANES)
/* Rows per pass over a whole block: 16 accumulators of 32 registers with AVX-512, 8 of 16 with AVX2. */
#define BLOCK_ROWS (LANES == 16 ? 4 : 2)
static inline __attribute__((always_inline)) void cols_pass(const float *x, const void *w, float *out,
                                                            int64_t n0, int64_t n_cols, int64_t k_len,
                                                            const int rows, const int vecs, const int bf16) {
    vec acc[8][BLOCK_VECS];
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < vecs; c++)
            acc[r][c] = vzero();
    for (int64_t k = 0; k < k_len; k++) {
        int64_t wk = k * n_cols + n0;
        for (int c = 0; c < vecs; c++)  /* the same AHEAD_ROWS rows on, for the same reason as rows_by_4 */
            _mm_prefetch(wbyte(w, wk + AHEAD_ROWS * n_cols + c * LANES, bf16), _MM_HINT_T0);
        vec wv[BLOCK_VECS];
        for (int c = 0; c < vecs; c++)
            wv[c] = wload(w, wk + c * LANES, FULL, bf16);
        for (int r = 0; r < rows; r++) {
            vec y = vset1(x[r * k_len + k]);
            for (int c = 0; c < vecs; c++)
                acc[r][c] = vfma(y, wv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < vecs; c++)
            vstore(out + r * n_cols + n0 + c * LANES, acc[r][c], FULL);
}

/* Rows in passes of at most `most` (a power of two), then halves: an expert's few decode rows share
 * one pass, whose independent accumulators hide the FMA latency. */
static inline __attribute__((always_inline)) void cols_rows(const float *x, const void *w, float *out,
                                                            int64_t m_rows, int64_t n0, int64_t n_cols,
                                                            int64_t k_len, const int vecs, const int most,
                                                            const int bf16) {
    int64_t m = 0;
    for (; m + most <= m_rows; m += most)
        cols_pass(x + m * k_len, w, out + m * n_cols, n0, n_cols, k_len, most, vecs, bf16);
    for (int rows = most / 2; rows >= 1; rows /= 2)
        if (m + rows <= m_rows) {
            cols_pass(x + m * k_len, w, out + m * n_cols, n0, n_cols, k_len, rows, vecs, bf16);
            m += rows;
        }
}

/* Columns n0 .. n0 + 4 vectors (64 with 16 lanes, 32 with 8), clipped to n_cols: whole blocks read
 * 256 (128) contiguous bytes of each weight row, which the prefetchers follow better than one line
 * per row; the clipped tail goes 16 columns at a time. N % 16 == 0. */
static inline __attribute__((always_inline)) void cols_block_any(const float *x, const void *w, float *out,
                                                                 int64_t m_rows, int64_t n0, int64_t n_cols,
                                                                 int64_t k_len, const int bf16) {
    if (n0 + BLOCK_COLS <= n_cols) {
        cols_rows(x, w, out, m_rows, n0, n_cols, k_len, BLOCK_VECS, BLOCK_ROWS, bf16);
        return;
    }
    for (int64_t n = n0; n < n_cols; n += 16)
        cols_rows(x, w, out, m_rows, n, n_cols, k_len, COLVECS, 8 / COLVECS, bf16);
}
static void cols_block(const float *x, const void *w, float *out, int64_t m_rows, int64_t n0, int64_t n_cols,
                       int64_t k_len) { cols_block_any(x, w, out, m_rows, n0, n_cols, k_len, 0); }
static void cols_block_bf16(const float *x, const void *w, float *out, int64_t m_rows, int64_t n0, int64_t n_cols,
                            int64_t k_len) { cols_block_any(x, w, out, m_rows, n0, n_cols, k_len, 1); }

/* rows [M, K] sorted by expert, w [E, K, N] (x @ W layout per expert) -> out [M, N]. N % 16 == 0. */
static void grouped_matmul(const float *rows, const void *w, int bf16, const int64_t *offsets, float *out,
                           int64_t experts, int64_t n_cols, int64_t k_len) {
    grouped(bf16 ? cols_block_bf16 : cols_block, BLOCK_COLS, rows, w, bf16, offsets, out, experts, n_cols, k_len);
}

/* Cached decoding's routing, in one pass: router logits x @ router^T [N, E], each token's top-k
 * experts (the larger logit first, the lower index on a tie) and their gates (softmax over the k
 * chosen logits), the slots sorted by expert (stable: token-major order within an expert), each
 * slot's input row copied into `rows` in that order, and per expert the row count and the cumulative
 * offset. `position[t * k + j]` is where token t's j-th slot landed, `gates` is token-major [N, k].
 * D % 8 == 0, k <= 8, E <= 64. */
static void moe_dispatch(const float *x, const float *router, int64_t tokens, int64_t dim, int64_t experts,
                         int64_t top_k, float *rows, int64_t *counts, int64_t *offsets, int64_t *position,
                         float *gates) {
    int64_t chosen[tokens * top_k];
    for (int64_t e = 0; e < experts; e++)
        counts[e] = 0;
    for (int64_t t = 0; t < tokens; t++) {
        float logits[LIMIT_EXPERTS];
        const float *xt = x + t * dim;
        for (int64_t e = 0; e < experts; e++) {
            const float *we = router + e * dim;
            vec a = vzero();
            for (int64_t i = 0; i < dim; i += LANES) {
                lanes_mask mi = mask_at(i, dim);
                a = vfma(vload(xt + i, mi), vload(we + i, mi), a);
            }
            logits[e] = sum1(a);
        }
        float top[LIMIT_TOP_K];
        for (int64_t j = 0; j < top_k; j++) {
            int64_t best = -1;
            for (int64_t e = 0; e < experts; e++) {
                int taken = 0;
                for (int64_t i = 0; i < j; i++)
                    taken |= chosen[t * top_k + i] == e;
                if (!taken && (best < 0 || logits[e] > logits[best]))
                    best = e;
            }
            chosen[t * top_k + j] = best;
            top[j] = logits[best];
            counts[best]++;
        }
        float largest = top[0], total = 0.0f;
        for (int64_t j = 0; j < top_k; j++)
            total += (top[j] = expf(top[j] - largest));
        for (int64_t j = 0; j < top_k; j++)
            gates[t * top_k + j] = top[j] / total;
    }
    int64_t next[LIMIT_EXPERTS];
    for (int64_t e = 0, end = 0; e < experts; e++) {
        next[e] = end;
        end += counts[e];
        offsets[e] = end;
    }
    for (int64_t slot = 0; slot < tokens * top_k; slot++) {
        int64_t at = next[chosen[slot]]++;
        position[slot] = at;
        const float *src = x + (slot / top_k) * dim;
        float *dst = rows + at * dim;
        for (int64_t i = 0; i < dim; i++)
            dst[i] = src[i];
    }
}

/* out[t] = shared[t] + sum_j gates[t, j] * expert_out[position[t * k + j]], rows of D floats. */
static void moe_combine(const float *expert_out, const int64_t *position, const float *gates,
                        const float *shared, float *out, int64_t tokens, int64_t dim, int64_t top_k) {
    for (int64_t t = 0; t < tokens; t++) {
        float *o = out + t * dim;
        const float *s = shared + t * dim;
        for (int64_t i = 0; i < dim; i++) {
            float routed = 0.0f;
            for (int64_t j = 0; j < top_k; j++)
                routed += gates[t * top_k + j] * expert_out[position[t * top_k + j] * dim + i];
            o[i] = s[i] + routed;
        }
    }
}

/* Training's combine of the routed experts' bf16 output rows (model/ops/experts.py, routed_blocked):
 * routed[t] = sum_j gates[t, j] * out[rows[t * k + j]], each row widened to float32, each product rounded,
 * then added in j's order: the arithmetic of gathering the rows, widening them, multiplying by the gates
 * and summing over j in torch, without the gathered copy, its widened copy and the [N, k, D] products. */
/* a, rounded where it stands: the compiler may not fuse the product that made it into a later add (an FMA
 * rounds once where torch's multiply, then add, rounds twice). */
static inline vec vrounded(vec a) {
    __asm__("" : "+v"(a));
    return a;
}
static void moe_combine_rows_bf16(const uint16_t *out, const int64_t *rows, const float *gates, float *routed,
                                  int64_t tokens, int64_t dim, int64_t top_k) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tokens; t++) {
        const int64_t *slot = rows + t * top_k;
        const float *g = gates + t * top_k;
        for (int64_t i = 0; i < dim; i += LANES) {
            lanes_mask m = mask_at(i, dim);
            vec sum = vmul(wload(out, slot[0] * dim + i, m, 1), vset1(g[0]));
            for (int64_t j = 1; j < top_k; j++)
                sum = vadd(sum, vrounded(vmul(wload(out, slot[j] * dim + i, m, 1), vset1(g[j]))));
            wstore(routed, t * dim + i, sum, m, 0);
        }
    }
}

/* Its backward, given grad [N, D]: each slot's output row gets grad[t] * gates[t, j] rounded to bf16 (what
 * autograd hands the gathered rows after the cast back, the other rows untouched: the caller zeroes them),
 * and grad_gates[t, j] = grad[t] . out[rows[t * k + j]] (a float32 sum in lanes, then across them). */
static void moe_combine_rows_bf16_backward(const uint16_t *out, const int64_t *rows, const float *gates,
                                           const float *grad, uint16_t *grad_out, float *grad_gates, int64_t tokens,
                                           int64_t dim, int64_t top_k) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tokens; t++) {
        const float *g = grad + t * dim;
        for (int64_t j = 0; j < top_k; j++) {
            const int64_t r = rows[t * top_k + j];
            vec gate = vset1(gates[t * top_k + j]), dot = vzero();
            for (int64_t i = 0; i < dim; i += LANES) {
                lanes_mask m = mask_at(i, dim);
                vec gi = wload(g, i, m, 0);
                wstore(grad_out, r * dim + i, vmul(gi, gate), m, 1);
                dot = vfma(gi, wload(out, r * dim + i, m, 1), dot);
            }
            grad_gates[t * top_k + j] = sum1(dot);
        }
    }
}

/* x [d] rotated in interleaved pairs as model/rope.py does, x * cos + (-x_odd, x_even) * sin, into out. */
static inline void rotate_pairs(const float *x, const float *cos, const float *sin, int64_t d, float *out) {
    for (int64_t i = 0; i < d; i++)
        out[i] = x[i] * cos[i] + ((i & 1) ? x[i - 1] : -x[i + 1]) * sin[i];
}

/* One cached decode step of feature-map linear attention (model/linear_attention.py) for B rows and
 * H heads of size d: qkv [B, 3 * H * d] (q | k | v, heads in order within each), the state kv
 * [B, H, d, d] and z [B, H, d] updated in place, out [B, H * d] = phi(q) S / max(phi(q) . z, floor)
 * after S += phi(k) v^T, z += phi(k). phi(u) = ELU(u) + 1. With cos and sin (the rotary tables' rows
 * at this position, [d]) q and k are first rotated in interleaved pairs, the original's order.
 * d % 8 == 0, d <= 256. */
static void linear_attention_step(const float *qkv, float *kv, float *z, float *out, int64_t batch,
                                  int64_t heads, int64_t d, const float *cos, const float *sin, float floor) {
    int64_t dim = heads * d;
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < batch * heads; bh++) {
        int64_t b = bh / heads, h = bh % heads;
        const float *q = qkv + b * 3 * dim + h * d, *k = q + dim, *v = q + 2 * dim;
        float pq[LIMIT_HEAD_DIM], pk[LIMIT_HEAD_DIM], num[LIMIT_HEAD_DIM];
        if (cos) {  /* rotated in place in pq and pk, then the feature map below */
            rotate_pairs(q, cos, sin, d, pq);
            rotate_pairs(k, cos, sin, d, pk);
            q = pq;
            k = pk;
        }
        for (int64_t i = 0; i < d; i++) {
            float qi = q[i], ki = k[i];
            pq[i] = qi > 0.0f ? qi + 1.0f : expf(qi);
            pk[i] = ki > 0.0f ? ki + 1.0f : expf(ki);
        }
        float *state = kv + bh * d * d, *zs = z + bh * d;
        float den = 0.0f;
        for (int64_t j = 0; j < d; j++)
            num[j] = 0.0f;
        for (int64_t i = 0; i < d; i++) {
            float *row = state + i * d;
            vec ki = vset1(pk[i]), qi = vset1(pq[i]);
            for (int64_t j = 0; j < d; j += LANES) {
                lanes_mask mj = mask_at(j, d);
                vec s = vfma(ki, vload(v + j, mj), vload(row + j, mj));
                vstore(row + j, s, mj);
                vstore(num + j, vfma(qi, s, vload(num + j, mj)), mj);
            }
            zs[i] += pk[i];
            den += pq[i] * zs[i];
        }
        float scale = 1.0f / (den > floor ? den : floor);
        float *o = out + b * dim + h * d;
        for (int64_t j = 0; j < d; j++)
            o[j] = num[j] * scale;
    }
}

/* exp(x) to about 2 ulp: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by a degree-7 polynomial (Cephes'
 * coefficients), times 2^n built in the exponent field. x is clamped to [-88, 89] first, so n stays
 * in [-127, 128]: n = -127 gives 0 (x < -88.03: true results below 2^-127, denormal) and n = 128 gives
 * +inf (x > 88.37: true results above 2^127.5, the float range ends at 2^128). */
static inline vec vexp(vec x) {
    x = vclamp(x, -88.0f, 89.0f);
    vec n = vround(vmul(x, vset1(1.44269504088896341f)));
    vec r = vfma(n, vset1(-0.693359375f), x);   /* ln2 in two parts: x - n ln2 without cancellation */
    r = vfma(n, vset1(2.12194440e-4f), r);
    vec p = vset1(1.9875691500e-4f);
    p = vfma(p, r, vset1(1.3981999507e-3f));
    p = vfma(p, r, vset1(8.3334519073e-3f));
    p = vfma(p, r, vset1(4.1665795894e-2f));
    p = vfma(p, r, vset1(1.6666665459e-1f));
    p = vfma(p, r, vset1(5.0000001201e-1f));
    p = vfma(p, vmul(r, r), vadd(r, vset1(1.0f)));
    return vmul(p, vpow2(n));
}

/* The exponentials' dependency chain is long (~60 cycles), so out-of-order execution keeps few loads
 * in flight on its own; asking for the rows two ahead (of element i of a row's gate and value halves,
 * elements of 4 or 2 bytes) keeps memory busy (the forward on 25 MB of h ran 3.6x faster on one core of
 * an AVX-512 AMD EPYC). */
#define PREFETCH_AHEAD(gate, value, i, hidden, bf16) \
    (_mm_prefetch(wbyte((gate), (i) + 4 * (hidden), (bf16)), _MM_HINT_T0), \
     _mm_prefetch(wbyte((value), (i) + 4 * (hidden), (bf16)), _MM_HINT_T0))

/* The SwiGLU activation for training and prefill, in one pass over memory each way (the eager
 * autograd.Function in moe.py takes five and is the test oracle). h [R, 2H] = [gate | value] per row,
 * H % 8 == 0. The same formulas as torch's CPU kernels: silu(g) = g / (1 + exp(-g)) and
 * silu'(g) = s (1 + g (1 - s)) with s = 1 / (1 + exp(-g)).
 * Forward: out [R, H] = silu(gate) * value. A NaN gate gives NaN (it enters every product), and
 * infinite gates give what torch's formulas give. */
static inline __attribute__((always_inline)) void swiglu_forward_any(const void *h, void *out, int64_t rows,
                                                                     int64_t hidden, const int bf16) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const char *g = wbyte(h, r * 2 * hidden, bf16), *v = wbyte(h, r * 2 * hidden + hidden, bf16);
        for (int64_t i = 0; i < hidden; i += LANES) {
            lanes_mask m = mask_at(i, hidden);
            PREFETCH_AHEAD(g, v, i, hidden, bf16);
            vec x = wload(g, i, m, bf16);
            vec silu = vdiv(x, vadd(vset1(1.0f), vexp(vsub(vzero(), x))));
            wstore(out, r * hidden + i, vmul(silu, wload(v, i, m, bf16)), m, bf16);
        }
    }
}
static void swiglu_forward(const float *h, float *out, int64_t rows, int64_t hidden) {
    swiglu_forward_any(h, out, rows, hidden, 0);
}
static void swiglu_forward_bf16(const uint16_t *h, uint16_t *out, int64_t rows, int64_t hidden) {
    swiglu_forward_any(h, out, rows, hidden, 1);
}

/* Backward: grad [R, 2H] = [grad_out * value * silu'(gate) | grad_out * silu(gate)] from h and
 * grad_out [R, H]; nothing saved from the forward but h (the exponentials are recomputed). */
static inline __attribute__((always_inline)) void swiglu_backward_any(const void *h, const void *grad_out, void *grad,
                                                                      int64_t rows, int64_t hidden, const int bf16) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const char *g = wbyte(h, r * 2 * hidden, bf16), *v = wbyte(h, r * 2 * hidden + hidden, bf16);
        const char *go = wbyte(grad_out, r * hidden, bf16);
        for (int64_t i = 0; i < hidden; i += LANES) {
            lanes_mask m = mask_at(i, hidden);
            PREFETCH_AHEAD(g, v, i, hidden, bf16);
            _mm_prefetch(wbyte(go, i + 2 * hidden, bf16), _MM_HINT_T0);
            vec x = wload(g, i, m, bf16), up = wload(go, i, m, bf16), one = vset1(1.0f);
            vec denominator = vadd(one, vexp(vsub(vzero(), x)));
            vec s = vdiv(one, denominator);
            vec slope = vmul(s, vfma(x, vsub(one, s), one));
            wstore(grad, r * 2 * hidden + i, vmul(vmul(up, wload(v, i, m, bf16)), slope), m, bf16);
            wstore(grad, r * 2 * hidden + hidden + i, vmul(up, vdiv(x, denominator)), m, bf16);
        }
    }
}
static void swiglu_backward(const float *h, const float *grad_out, float *grad, int64_t rows, int64_t hidden) {
    swiglu_backward_any(h, grad_out, grad, rows, hidden, 0);
}
static void swiglu_backward_bf16(const uint16_t *h, const uint16_t *grad_out, uint16_t *grad, int64_t rows,
                                 int64_t hidden) {
    swiglu_backward_any(h, grad_out, grad, rows, hidden, 1);
}

/* ---- Feature-map linear attention over a whole sequence, for training and full forwards ----------
 * The recurrence itself, position by position (model/linear_attention.py's `recurrent_linear_attention`
 * is its oracle): per (row, head), S_t = S_{t-1} + phi(k_t) v_t^T and z_t = z_{t-1} + phi(k_t), then
 * o_t = phi(q_t)^T S_t / max(phi(q_t) . z_t, floor). A head's state (d x d + d floats) stays in L1 for
 * the whole sequence, so the sequence costs O(T d^2) arithmetic and one pass over q, k, v and the
 * output: no [T, T] scores, no padding to a chunk, no cross-chunk prefix sums (the chunked torch form
 * materialises all three; docs/ARCHITECTURE.md, "Linear attention"). Its arithmetic per position is the
 * decode step's above (the state row updated, then read), with the feature map's exponential vectorised.
 * qkv [B, T, 3 * H * d] is the qkv product's output (q | k | v, heads in order within each); with cos and
 * sin (the rotary tables' rows of the T positions, [T, d]) q and k are rotated in interleaved pairs
 * before the feature map (the original's order). One thread per (row, head), positions in order: results
 * do not depend on the thread count. d % 8 == 0, d <= LIMIT_HEAD_DIM. */

/* u > 0 ? a : b, lane by lane; the lanes of a mask kept (the others zero); the lesser of a and 1. */
#if defined(__AVX512F__)
static inline vec vselect_positive(vec u, vec a, vec b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(u, vzero(), _CMP_GT_OQ), b, a);
}
static inline vec vkeep(lanes_mask m, vec a) { return _mm512_maskz_mov_ps(m, a); }
static inline vec vmin1(vec a) { return _mm512_min_ps(a, vset1(1.0f)); }
#else
static inline vec vselect_positive(vec u, vec a, vec b) {
    return _mm256_blendv_ps(b, a, _mm256_cmp_ps(u, vzero(), _CMP_GT_OQ));
}
static inline vec vkeep(lanes_mask m, vec a) { (void)m; return a; }
static inline vec vmin1(vec a) { return _mm256_min_ps(a, vset1(1.0f)); }
#endif

/* A head's row padded to whole vectors: the scan's own rows (its state, its scratch, its locals) hold
 * `ld` floats, the lanes past d zero, so they are read and written with whole-vector loads and stores;
 * only the caller's rows (q, k, v, out and the gradients, d floats) take the masked forms. (A store
 * that writes part of a vector cannot forward to a load that follows it: with 16 lanes and d = 24 the
 * masked forms everywhere made the scan ~3.5x slower, measured while building.) */
static inline int64_t scan_row(int64_t d) { return (d + LANES - 1) / LANES * LANES; }

/* phi(u) = ELU(u) + 1 of one head's q or k at one position (rotated first when cos is given) into phi
 * [ld], and its derivative min(phi, 1) into dphi [ld] when given; lanes past d zero. */
static inline __attribute__((always_inline)) void scan_features(const float *u, const float *cos, const float *sin,
                                                                int64_t d, float *phi, float *dphi, const int nv) {
    float rotated[LIMIT_HEAD_DIM] __attribute__((aligned(64)));
    if (cos) {
        rotate_pairs(u, cos, sin, d, rotated);
        u = rotated;
    }
    for (int c = 0; c < nv; c++) {
        lanes_mask m = mask_at(c * LANES, d);
        vec x = vload(u + c * LANES, m);
        vec p = vkeep(m, vselect_positive(x, vadd(x, vset1(1.0f)), vexp(x)));
        vstore(phi + c * LANES, p, FULL);
        if (dphi)
            vstore(dphi + c * LANES, vmin1(p), FULL);
    }
}

/* The transpose of rotate_pairs (its Jacobian's): the gradient of the unrotated input. */
static inline void rotate_pairs_back(const float *g, const float *cos, const float *sin, int64_t d, float *out) {
    for (int64_t i = 0; i < d; i += 2) {
        out[i] = g[i] * cos[i] + g[i + 1] * sin[i + 1];
        out[i + 1] = g[i + 1] * cos[i + 1] - g[i] * sin[i];
    }
}

/* The gradient of one head's q or k: du [ld] rotated back when cos is given, into the caller's row. */
static inline void scan_store_gradient(const float *du, const float *cos, const float *sin, int64_t d, float *out) {
    if (cos)
        rotate_pairs_back(du, cos, sin, d, out);
    else
        for (int64_t i = 0; i < d; i++)
            out[i] = du[i];
}

/* The per-head loops take nv (vectors per head row) as a compile-time constant where the dispatch can
 * (heads of up to 4 vectors), so a row's accumulators live in registers and the loops over it unroll;
 * larger heads run the same code with nv at run time. */
#define SCAN_MAX_VECTORS (LIMIT_HEAD_DIM / 8)
#define SCAN_DISPATCH(nv, call) \
    do { switch (nv) { case 1: call(1); break; case 2: call(2); break; case 3: call(3); break; \
                       case 4: call(4); break; default: call(nv); } } while (0)

/* Forward of one (row, head): positions in order; out [T rows, `dim` apart], den [T], the final state
 * kv [d, d] and z [d]; its state while it runs is `work` [d + 1, ld] (the last row z). */
static inline __attribute__((always_inline)) void scan_forward_head(
        const float *qkv, float *out, float *den, float *kv, float *z, float *work, int64_t steps, int64_t dim,
        int64_t d, const float *cos, const float *sin, float floor, const int nv) {
    const int64_t ld = nv * LANES;
    float pq[LIMIT_HEAD_DIM] __attribute__((aligned(64))), pk[LIMIT_HEAD_DIM] __attribute__((aligned(64)));
    float *zs = work + d * ld;
    for (int64_t i = 0; i < (d + 1) * ld; i++)
        work[i] = 0.0f;
    for (int64_t t = 0; t < steps; t++) {
        const float *q = qkv + t * 3 * dim, *k = q + dim, *v = q + 2 * dim;
        const float *c = cos ? cos + t * d : NULL, *s = cos ? sin + t * d : NULL;
        scan_features(q, c, s, d, pq, NULL, nv);
        scan_features(k, c, s, d, pk, NULL, nv);
        vec num[SCAN_MAX_VECTORS], vv[SCAN_MAX_VECTORS], dot = vzero();
        for (int cc = 0; cc < nv; cc++) {  /* z_t and phi(q_t) . z_t */
            num[cc] = vzero();
            vv[cc] = vload(v + cc * LANES, mask_at(cc * LANES, d));
            vec updated = vadd(vload(zs + cc * LANES, FULL), vload(pk + cc * LANES, FULL));
            vstore(zs + cc * LANES, updated, FULL);
            dot = vfma(vload(pq + cc * LANES, FULL), updated, dot);
        }
        for (int64_t i = 0; i < d; i++) {  /* S_t = S_{t-1} + phi(k_t) v_t^T, read by phi(q_t) */
            float *row = work + i * ld;
            vec ki = vset1(pk[i]), qi = vset1(pq[i]);
            for (int cc = 0; cc < nv; cc++) {
                vec updated = vfma(ki, vv[cc], vload(row + cc * LANES, FULL));
                vstore(row + cc * LANES, updated, FULL);
                num[cc] = vfma(qi, updated, num[cc]);
            }
        }
        float total = sum1(dot);
        den[t] = total;
        vec scale = vset1(1.0f / (total > floor ? total : floor));
        for (int cc = 0; cc < nv; cc++)
            vstore(out + t * dim + cc * LANES, vmul(num[cc], scale), mask_at(cc * LANES, d));
    }
    for (int64_t i = 0; i < d; i++) {
        for (int64_t j = 0; j < d; j++)
            kv[i * d + j] = work[i * ld + j];
        z[i] = zs[i];
    }
}

/* Forward: out [B, T, H * d] (the layout the output product reads), den [B, H, T] (each position's
 * phi(q) . z before the floor, for the backward) and the final state kv [B, H, d, d], z [B, H, d] (a
 * prefill's cache; the caller's buffers, overwritten). work [B, H, d + 1, ld] is the caller's scratch
 * (ld: d rounded up to 16). */
static void linear_attention_scan_forward(const float *qkv, float *out, float *den, float *kv, float *z, float *work,
                                          int64_t batch, int64_t steps, int64_t heads, int64_t d,
                                          const float *cos, const float *sin, float floor) {
    int64_t dim = heads * d, nv = scan_row(d) / LANES, ld = scan_row(d);
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < batch * heads; bh++) {
        int64_t b = bh / heads, h = bh % heads;
#define SCAN_FORWARD(n) scan_forward_head(qkv + b * steps * 3 * dim + h * d, out + b * steps * dim + h * d, \
                                          den + bh * steps, kv + bh * d * d, z + bh * d, work + bh * (d + 1) * ld, \
                                          steps, dim, d, cos, sin, floor, (n))
        SCAN_DISPATCH(nv, SCAN_FORWARD);
#undef SCAN_FORWARD
    }
}

/* Backward of one (row, head); acc [d + 1, ld] and gs [T, ld] + gds [T] its scratch. */
static inline __attribute__((always_inline)) void scan_backward_head(
        const float *qkv, const float *out, const float *den, const float *grad_out, float *grad_qkv, float *acc,
        float *gs, float *gds, int64_t steps, int64_t dim, int64_t d, const float *cos, const float *sin, float floor,
        const int nv) {
    const int64_t ld = nv * LANES;
    float pq[LIMIT_HEAD_DIM] __attribute__((aligned(64))), pk[LIMIT_HEAD_DIM] __attribute__((aligned(64)));
    float dp[LIMIT_HEAD_DIM] __attribute__((aligned(64))), du[LIMIT_HEAD_DIM] __attribute__((aligned(64)));
    float *zs = acc + d * ld;
    for (int64_t i = 0; i < (d + 1) * ld; i++)
        acc[i] = 0.0f;
    for (int64_t t = 0; t < steps; t++) {  /* forward in t: S_t, z_t -> the gradient of q */
        const float *q = qkv + t * 3 * dim, *k = q + dim, *v = q + 2 * dim;
        const float *c = cos ? cos + t * d : NULL, *s = cos ? sin + t * d : NULL;
        const float *g = grad_out + t * dim, *o = out + t * dim;
        scan_features(q, c, s, d, pq, dp, nv);
        scan_features(k, c, s, d, pk, NULL, nv);
        float raw = den[t], inv = 1.0f / (raw > floor ? raw : floor);
        float *gt = gs + t * ld;
        vec vinv = vset1(inv), dot = vzero();
        for (int cc = 0; cc < nv; cc++) {
            lanes_mask m = mask_at(cc * LANES, d);
            vec gj = vload(g + cc * LANES, m);
            vstore(gt + cc * LANES, vmul(gj, vinv), FULL);
            dot = vfma(gj, vload(o + cc * LANES, m), dot);
        }
        float gd = raw >= floor ? -sum1(dot) * inv : 0.0f;
        gds[t] = gd;
        /* S_t^T row by row (acc[j][i] = S_t[i][j]), so the product S_t g' runs along rows too:
         * du = sum_j g'[j] S_t^T[j] + g'[d] z, no horizontal sums. */
        vec dq[SCAN_MAX_VECTORS], pkv[SCAN_MAX_VECTORS];
        vec gdv = vset1(gd);
        for (int cc = 0; cc < nv; cc++) {
            pkv[cc] = vload(pk + cc * LANES, FULL);
            vec zi = vadd(vload(zs + cc * LANES, FULL), pkv[cc]);
            vstore(zs + cc * LANES, zi, FULL);
            dq[cc] = vmul(gdv, zi);
        }
        for (int64_t j = 0; j < d; j++) {
            float *row = acc + j * ld;
            vec vj = vset1(v[j]), gj = vset1(gt[j]);
            for (int cc = 0; cc < nv; cc++) {
                vec updated = vfma(vj, pkv[cc], vload(row + cc * LANES, FULL));
                vstore(row + cc * LANES, updated, FULL);
                dq[cc] = vfma(gj, updated, dq[cc]);
            }
        }
        for (int cc = 0; cc < nv; cc++)
            vstore(du + cc * LANES, vmul(dq[cc], vload(dp + cc * LANES, FULL)), FULL);
        scan_store_gradient(du, c, s, d, grad_qkv + t * 3 * dim);
    }
    for (int64_t i = 0; i < (d + 1) * ld; i++)
        acc[i] = 0.0f;
    for (int64_t t = steps - 1; t >= 0; t--) {  /* backward in t: R_t -> the gradients of k and v */
        const float *q = qkv + t * 3 * dim, *k = q + dim, *v = q + 2 * dim;
        const float *c = cos ? cos + t * d : NULL, *s = cos ? sin + t * d : NULL;
        scan_features(q, c, s, d, pq, NULL, nv);
        scan_features(k, c, s, d, pk, dp, nv);
        const float *gt = gs + t * ld;
        float gd = gds[t];
        float *dk = grad_qkv + t * 3 * dim + dim, *dv = dk + dim;
        vec dvv[SCAN_MAX_VECTORS], gtv[SCAN_MAX_VECTORS], vv[SCAN_MAX_VECTORS];
        for (int cc = 0; cc < nv; cc++) {
            dvv[cc] = vzero();
            gtv[cc] = vload(gt + cc * LANES, FULL);
            vv[cc] = vload(v + cc * LANES, mask_at(cc * LANES, d));
        }
        for (int64_t i0 = 0; i0 < d; i0 += 4) {  /* four rows at a time: their dots in one sum4 */
            vec a[4];
            for (int r = 0; r < 4; r++) {
                int64_t i = i0 + r;
                float *row = acc + i * ld;
                vec qi = vset1(pq[i]), ki = vset1(pk[i]);
                a[r] = vzero();
                for (int cc = 0; cc < nv; cc++) {
                    vec updated = vfma(qi, gtv[cc], vload(row + cc * LANES, FULL));
                    vstore(row + cc * LANES, updated, FULL);
                    a[r] = vfma(updated, vv[cc], a[r]);
                    dvv[cc] = vfma(ki, updated, dvv[cc]);
                }
            }
            float dots[4];
            _mm_storeu_ps(dots, sum4(a[0], a[1], a[2], a[3]));
            for (int r = 0; r < 4; r++) {
                int64_t i = i0 + r;
                zs[i] += pq[i] * gd;
                du[i] = (dots[r] + zs[i]) * dp[i];
            }
        }
        for (int cc = 0; cc < nv; cc++)
            vstore(dv + cc * LANES, dvv[cc], mask_at(cc * LANES, d));
        scan_store_gradient(du, c, s, d, dk);
    }
}

/* Backward: grad_qkv [B, T, 3 * H * d] from qkv, the forward's out and den, and grad_out [B, T, H * d].
 * With g'_t = [g_t / c_t, -(g_t . o_t) / c_t] (c_t = max(den_t, floor); the second part 0 where the
 * floor held), a forward pass rebuilds S_t, z_t and reads dphi(q_t) = S_t g'_t[:d] + z_t g'_t[d]; a
 * backward pass sums R_t = sum_{s >= t} phi(q_s) g'_s^T and reads dphi(k_t) = R_t [v_t; 1] and
 * dv_t = R_t[:, :d]^T phi(k_t); each times the feature map's derivative (and rotated back). The forward
 * pass keeps S_t transposed, so both of its products run along rows; the backward pass's dots over
 * R_t's rows are summed four rows at a time. state [B, H, d + 1, ld] and gscratch [B, H, T, ld + 1] are
 * the caller's scratch (ld: d rounded up to 16). */
static void linear_attention_scan_backward(const float *qkv, const float *out, const float *den,
                                           const float *grad_out, float *grad_qkv, float *state, float *gscratch,
                                           int64_t batch, int64_t steps, int64_t heads, int64_t d,
                                           const float *cos, const float *sin, float floor) {
    int64_t dim = heads * d, nv = scan_row(d) / LANES, ld = scan_row(d);
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < batch * heads; bh++) {
        int64_t b = bh / heads, h = bh % heads;
        float *gs = gscratch + bh * steps * (ld + 1);
#define SCAN_BACKWARD(n) scan_backward_head(qkv + b * steps * 3 * dim + h * d, out + b * steps * dim + h * d, \
                                            den + bh * steps, grad_out + b * steps * dim + h * d, \
                                            grad_qkv + b * steps * 3 * dim + h * d, state + bh * (d + 1) * ld, \
                                            gs, gs + steps * ld, steps, dim, d, cos, sin, floor, (n))
        SCAN_DISPATCH(nv, SCAN_BACKWARD);
#undef SCAN_BACKWARD
    }
}

/* RMSNorm of rows [R, D]: out = (x * 1 / sqrt(mean(x^2) + eps)) * w, as torch's rms_norm orders it,
 * for decoding (a few rows: one thread) and training (many rows). With rstd it also stores each row's
 * 1 / sqrt(mean(x^2) + eps) (rstd [R]) for the backward, which makes one pass over x and grad_out:
 *   grad_x = rstd (g w - x rstd^2 mean(g w x)),   grad_w = sum over rows of g x rstd.
 * grad_w is summed in fixed blocks of RMS_BLOCK rows, each by one thread in row order, then the
 * blocks in order (partial [ceil(R / RMS_BLOCK), D] is the caller's scratch), so the result does not
 * depend on the thread count. D % 8 == 0. */
#define RMS_BLOCK 256
static void rms_norm_forward(const float *x, const float *w, float *out, float *rstd, int64_t rows, int64_t dim,
                             float eps) {
#pragma omp parallel for schedule(static) if (rows >= 64)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float *o = out + r * dim;
        vec a = vzero();
        for (int64_t i = 0; i < dim; i += LANES) {
            vec v = vload(xr + i, mask_at(i, dim));
            a = vfma(v, v, a);
        }
        float s = 1.0f / sqrtf(sum1(a) / (float)dim + eps);
        if (rstd)
            rstd[r] = s;
        vec scale = vset1(s);
        for (int64_t i = 0; i < dim; i += LANES) {
            lanes_mask mi = mask_at(i, dim);
            vstore(o + i, vmul(vmul(vload(xr + i, mi), scale), vload(w + i, mi)), mi);
        }
    }
}

static void rms_norm_backward(const float *x, const float *w, const float *rstd, const float *grad_out,
                              float *grad_x, float *grad_w, float *partial, int64_t rows, int64_t dim) {
    int64_t blocks = (rows + RMS_BLOCK - 1) / RMS_BLOCK;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        float *acc = partial + b * dim;
        for (int64_t i = 0; i < dim; i += LANES)
            vstore(acc + i, vzero(), mask_at(i, dim));
        int64_t end = (b + 1) * RMS_BLOCK < rows ? (b + 1) * RMS_BLOCK : rows;
        for (int64_t r = b * RMS_BLOCK; r < end; r++) {
            const float *xr = x + r * dim, *g = grad_out + r * dim;
            float s = rstd[r];
            vec dot = vzero();
            for (int64_t i = 0; i < dim; i += LANES) {
                lanes_mask mi = mask_at(i, dim);
                dot = vfma(vmul(vload(g + i, mi), vload(w + i, mi)), vload(xr + i, mi), dot);
            }
            vec vs = vset1(s), coefficient = vset1(s * s * s * sum1(dot) / (float)dim);
            float *gx = grad_x + r * dim;
            for (int64_t i = 0; i < dim; i += LANES) {
                lanes_mask mi = mask_at(i, dim);
                vec gi = vload(g + i, mi), xi = vload(xr + i, mi);
                /* rstd g w - rstd^3 mean(g w x) x */
                vstore(gx + i, vsub(vmul(vmul(gi, vload(w + i, mi)), vs), vmul(coefficient, xi)), mi);
                vstore(acc + i, vfma(vmul(gi, xi), vs, vload(acc + i, mi)), mi);
            }
        }
    }
    for (int64_t i = 0; i < dim; i++) {
        float total = 0.0f;
        for (int64_t b = 0; b < blocks; b++)
            total += partial[b * dim + i];
        grad_w[i] = total;
    }
}

/* ---- One cached decode step of a hybrid block in three pieces (decode_stack below runs them) -------
 * B rows, one token each, S residual streams [S, B, D] (stream_stride floats apart: B * D, or 0 while
 * they are still the broadcast embedding). The eager block is the test oracle; these calls only save
 * the ~25 Python-level operations per layer between the products above, which cost a decode step of
 * the flash model more than its arithmetic. */

/* softmax of n <= 64 logits. */
static void small_softmax(const float *logits, int64_t n, float *out) {
    float largest = logits[0], total = 0.0f;
    for (int64_t i = 1; i < n; i++)
        largest = logits[i] > largest ? logits[i] : largest;
    for (int64_t i = 0; i < n; i++)
        total += (out[i] = expf(logits[i] - largest));
    for (int64_t i = 0; i < n; i++)
        out[i] /= total;
}

/* Before attention: the streams' softmax(input_logits)-weighted mix into mixed [B, D], its RMSNorm,
 * and the q | k | v product qkv [B, 3D] = norm(mixed) @ qkv_w^T. Returns 0, or 1 when out of memory. */
static int decode_attention_in(const float *streams, int64_t stream_stride, int64_t n_streams, int64_t batch,
                               int64_t dim, const float *input_logits, const float *norm_w, float eps,
                               const void *qkv_w, int bf16, float *mixed, float *qkv) {
    float w[LIMIT_STREAMS];
    small_softmax(input_logits, n_streams, w);
    int64_t count = batch * dim;
    for (int64_t i = 0; i < count; i++) {
        float total = 0.0f;
        for (int64_t s = 0; s < n_streams; s++)
            total += w[s] * streams[s * stream_stride + i];
        mixed[i] = total;
    }
    float *normed = malloc(count * sizeof(float));
    if (!normed)
        return 1;
    rms_norm_forward(mixed, norm_w, normed, NULL, batch, dim, eps);
    linear_any(normed, qkv_w, qkv, batch, 3 * dim, dim, bf16);
    free(normed);
    return 0;
}

/* One token of the local + strided sparse layer (model/sparse_attention.py) on its cached keys and
 * values [B, H, capacity, d], of which the first n are kept: q and k of qkv [B, 3 * H * d] are rotated
 * (cos, sin [d], interleaved pairs), the query attends to the n kept keys and its own (softmax of
 * q.k / sqrt(d), every kept key is visible), out [B, H * d]; then the new key and value are stored
 * at `slot` (n to append, the slot of the key that left the window, or -1 for none). n < 4096,
 * d % 8 == 0, d <= 256. */
static void sparse_attention_step(const float *qkv, float *keys, float *values, int64_t capacity, int64_t n,
                                  int64_t slot, int64_t batch, int64_t heads, int64_t d, const float *cos,
                                  const float *sin, float *out) {
    int64_t dim = heads * d;
    float scale = 1.0f / sqrtf((float)d);
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < batch * heads; bh++) {
        int64_t b = bh / heads, h = bh % heads;
        const float *q = qkv + b * 3 * dim + h * d, *k = q + dim, *v = q + 2 * dim;
        float rq[LIMIT_HEAD_DIM], rk[LIMIT_HEAD_DIM], scores[LIMIT_KEYS];
        rotate_pairs(q, cos, sin, d, rq);
        rotate_pairs(k, cos, sin, d, rk);
        float *kb = keys + bh * capacity * d, *vb = values + bh * capacity * d;
        float largest = -INFINITY;
        for (int64_t j = 0; j <= n; j++) {
            const float *key = j < n ? kb + j * d : rk;
            vec a = vzero();
            for (int64_t i = 0; i < d; i += LANES) {
                lanes_mask mi = mask_at(i, d);
                a = vfma(vload(rq + i, mi), vload(key + i, mi), a);
            }
            scores[j] = sum1(a) * scale;
            largest = scores[j] > largest ? scores[j] : largest;
        }
        float total = 0.0f;
        for (int64_t j = 0; j <= n; j++)
            total += (scores[j] = expf(scores[j] - largest));
        float *o = out + b * dim + h * d;
        for (int64_t i = 0; i < d; i += LANES) {
            lanes_mask mi = mask_at(i, d);
            vec a = vmul(vset1(scores[n]), vload(v + i, mi));
            for (int64_t j = 0; j < n; j++)
                a = vfma(vset1(scores[j]), vload(vb + j * d + i, mi), a);
            vstore(o + i, vmul(a, vset1(1.0f / total)), mi);
        }
        if (slot >= 0)
            for (int64_t i = 0; i < d; i++) {
                kb[slot * d + i] = rk[i];
                vb[slot * d + i] = v[i];
            }
    }
}

/* After attention: attn_out = attn @ out_w^T, the residual hidden = mixed + attn_out, its RMSNorm, the
 * mixture of experts on it (routing, the routed experts, the shared expert, the gate-weighted sum, as
 * moe_dispatch .. moe_combine), update = attn_out + moe, and the streams' write into
 * new_streams [S, B, D]: streams + softmax(output_logits)_s * (mixed + update) ("double-residual") or
 * streams + S softmax(output_logits)_s * update ("delta"). counts [E] receives the routed slots per
 * expert. gate_up [E, 2H, D], down [E, H, D] (x @ W), shared_up [2H, D], shared_down [D, H]. Returns
 * 0, or 1 when out of memory. D % 16 == 0, H % 8 == 0, E <= 64, top_k <= 8. */
static int decode_moe_out(const float *streams, int64_t stream_stride, int64_t n_streams, int64_t batch,
                          int64_t dim, const float *output_logits, int64_t double_residual, const float *attn,
                          const void *out_w, const float *mixed, const float *norm_w, float eps,
                          const float *router, int64_t experts, int64_t top_k, const void *gate_up,
                          const void *down, int64_t hidden, const void *shared_up, const void *shared_down,
                          int bf16, int64_t *counts, float *new_streams) {
    int64_t count = batch * dim, slots = batch * top_k;
    size_t floats = 4 * (size_t)count + (size_t)slots * (dim + 1 + 3 * hidden + dim) + 3 * (size_t)batch * hidden;
    float *work = malloc(floats * sizeof(float));
    int64_t *ints = malloc((experts + slots) * sizeof(int64_t));
    if (!work || !ints) {
        free(work);
        free(ints);
        return 1;
    }
    float *attn_out = work, *normed = attn_out + count, *value = normed + count, *moe = value + count;
    float *rows = moe + count, *gates = rows + slots * dim, *h = gates + slots, *act = h + slots * 2 * hidden;
    float *expert_out = act + slots * hidden, *shared_h = expert_out + slots * dim;
    float *shared_act = shared_h + batch * 2 * hidden;
    int64_t *offsets = ints, *position = ints + experts;
    linear_any(attn, out_w, attn_out, batch, dim, dim, bf16);
    for (int64_t i = 0; i < count; i++)
        value[i] = mixed[i] + attn_out[i];
    rms_norm_forward(value, norm_w, normed, NULL, batch, dim, eps);
    moe_dispatch(normed, router, batch, dim, experts, top_k, rows, counts, offsets, position, gates);  /* router: float32 */
    grouped_linear(rows, gate_up, bf16, offsets, h, experts, 2 * hidden, dim);
    swiglu_forward(h, act, slots, hidden);
    grouped_matmul(act, down, bf16, offsets, expert_out, experts, dim, hidden);
    linear_any(normed, shared_up, shared_h, batch, 2 * hidden, dim, bf16);
    swiglu_forward(shared_h, shared_act, batch, hidden);
    linear_any(shared_act, shared_down, value, batch, dim, hidden, bf16);  /* the shared expert's output */
    moe_combine(expert_out, position, gates, value, moe, batch, dim, top_k);
    float w[LIMIT_STREAMS];
    small_softmax(output_logits, n_streams, w);
    for (int64_t i = 0; i < count; i++) {
        float update = attn_out[i] + moe[i];
        value[i] = double_residual ? mixed[i] + update : update;
    }
    for (int64_t s = 0; s < n_streams; s++) {
        float ws = double_residual ? w[s] : (float)n_streams * w[s];
        const float *src = streams + s * stream_stride;
        float *dst = new_streams + s * count;
        for (int64_t i = 0; i < count; i++)
            dst[i] = src[i] + ws * value[i];
    }
    free(work);
    free(ints);
    return 0;
}

/* ---- A whole decode step of the stack of hybrid blocks in one call (model/lm.py, GLM53Flash) ------
 * For each layer in order: decode_attention_in, its attention step (linear_attention_step or
 * sparse_attention_step), decode_moe_out, each the function above with its arithmetic unchanged, so
 * the result equals the three calls per layer bit for bit; what it saves is the Python between them
 * (a flash decode step spent about as long there as in the kernels). The streams pass from layer to
 * layer in two buffers of [S, B, D]; the last layer writes new_streams. Each layer's operands are
 * LAYER_FIELDS int64 values in `layers` (pointers as integers, as ctypes passes them): */
enum layer_field {
    L_SPARSE,          /* 0: linear attention (state a = kv [B, H, d, d], b = z [B, H, d]); 1: sparse */
    L_INPUT_LOGITS, L_ATTN_NORM, L_QKV_W,
    L_STATE_A, L_STATE_B, /* sparse: keys, values [B, H, capacity, d] */
    L_CAPACITY, L_KEPT, L_SLOT,  /* sparse only: buffer capacity, kept keys, where the new key goes */
    L_ROTATE,          /* linear only: 1 to rotate q and k by cos/sin first (the sparse layer always does) */
    L_OUTPUT_LOGITS, L_OUT_W, L_MOE_NORM, L_ROUTER, L_GATE_UP, L_DOWN, L_SHARED_UP, L_SHARED_DOWN,
    LAYER_FIELDS
};
#define AT(type, value) ((type)(intptr_t)(value))

/* How many fields a layer has (ops/decode_block.py names them in the same order; a test compares). */
int64_t glm53_layer_fields(void) { return LAYER_FIELDS; }

/* The model's head after the stack, where the caller asks for it (head_w not NULL): the streams'
 * mean [B, D] (each element summed over the streams in order from zero, then divided by their number:
 * what torch's mean over the first dimension computes for up to 16 streams, bit for bit; the caller
 * holds the head to those, ops/decode_block.py HEAD_MAX_STREAMS), rms_norm_forward of it with
 * head_norm -> hidden_out [B, D], and linear of that with head_w [V, D] -> logits_out [B, V]: the
 * model's final norm and tied head by the functions its one-row-at-a-time path calls (ops.rms_norm,
 * ops.linear), with their arithmetic unchanged. `mean` is [B, D] scratch. */
static void decode_head(const float *new_streams, int64_t n_streams, int64_t batch, int64_t dim, const float *head_norm,
                        float head_eps, const float *head_w, int64_t vocab, float *mean, float *hidden_out,
                        float *logits_out) {
    int64_t count = batch * dim;
    for (int64_t i = 0; i < count; i++) {
        float acc = 0.0f;  /* from zero, as torch's sum: -0.0 streams give +0.0 */
        for (int64_t s = 0; s < n_streams; s++)
            acc += new_streams[s * count + i];
        mean[i] = acc / (float)n_streams;
    }
    rms_norm_forward(mean, head_norm, hidden_out, NULL, batch, dim, head_eps);
    linear(hidden_out, head_w, logits_out, batch, vocab, dim);
}

/* counts [layers, E] receives each layer's routed slots per expert; with head_w, the head above writes
 * hidden_out and logits_out too. Returns OK or NO_MEMORY; the entry point glm53_decode_stack checks
 * every layer's fields before any layer runs. */
static int decode_stack(const int64_t *layers, int64_t n_layers, const float *streams, int64_t stream_stride,
                        int64_t n_streams, int64_t batch, int64_t dim, int64_t heads, int64_t experts, int64_t top_k,
                        int64_t hidden, int64_t double_residual, int bf16, float eps, float floor, const float *cos,
                        const float *sin, int64_t *counts, float *new_streams, const float *head_norm, float head_eps,
                        const float *head_w, int64_t vocab, float *hidden_out, float *logits_out) {
    int64_t count = batch * dim, d = dim / heads;
    float *work = malloc((2 * (size_t)n_streams * count + 5 * (size_t)count) * sizeof(float));
    if (!work)
        return NO_MEMORY;
    float *buffers[2] = {work, work + n_streams * count}, *mixed = buffers[1] + n_streams * count;
    float *qkv = mixed + count, *attn = qkv + 3 * count;
    const float *in = streams;
    int64_t stride = stream_stride;
    for (int64_t l = 0; l < n_layers; l++) {
        const int64_t *f = layers + l * LAYER_FIELDS;
        float *out = l == n_layers - 1 ? new_streams : buffers[l % 2];
        if (decode_attention_in(in, stride, n_streams, batch, dim, AT(const float *, f[L_INPUT_LOGITS]),
                                AT(const float *, f[L_ATTN_NORM]), eps, AT(const void *, f[L_QKV_W]), bf16, mixed, qkv)) {
            free(work);
            return NO_MEMORY;
        }
        if (f[L_SPARSE])
            sparse_attention_step(qkv, AT(float *, f[L_STATE_A]), AT(float *, f[L_STATE_B]), f[L_CAPACITY], f[L_KEPT],
                                  f[L_SLOT], batch, heads, d, cos, sin, attn);
        else
            linear_attention_step(qkv, AT(float *, f[L_STATE_A]), AT(float *, f[L_STATE_B]), attn, batch, heads, d,
                                  f[L_ROTATE] ? cos : NULL, f[L_ROTATE] ? sin : NULL, floor);
        if (decode_moe_out(in, stride, n_streams, batch, dim, AT(const float *, f[L_OUTPUT_LOGITS]), double_residual,
                           attn, AT(const void *, f[L_OUT_W]), mixed, AT(const float *, f[L_MOE_NORM]), eps,
                           AT(const float *, f[L_ROUTER]), experts, top_k, AT(const void *, f[L_GATE_UP]),
                           AT(const void *, f[L_DOWN]), hidden, AT(const void *, f[L_SHARED_UP]),
                           AT(const void *, f[L_SHARED_DOWN]), bf16, counts + l * experts, out)) {
            free(work);
            return NO_MEMORY;
        }
        in = out;
        stride = count;
    }
    if (head_w)
        decode_head(new_streams, n_streams, batch, dim, head_norm, head_eps, head_w, vocab, mixed, hidden_out,
                    logits_out);
    free(work);
    return OK;
}

/* ---- Entry points: the sizes checked, then the loops above ----------------------------------------- */

void glm53_limits(int64_t *out) {
    out[0] = LIMIT_EXPERTS;
    out[1] = LIMIT_TOP_K;
    out[2] = LIMIT_HEAD_DIM;
    out[3] = LIMIT_KEYS;
    out[4] = LIMIT_STREAMS;
    out[5] = LIMIT_SLOTS;
}

/* Inner sizes the vector loops read whole: positive multiples of 8. */
static inline int vector_size(int64_t n) { return n > 0 && n % 8 == 0; }

/* offsets [E]: cumulative row counts, non-decreasing from 0 to m_rows. */
static int offsets_hold(const int64_t *offsets, int64_t experts, int64_t m_rows) {
    int64_t previous = 0;
    for (int64_t e = 0; e < experts; e++) {
        if (offsets[e] < previous)
            return 0;
        previous = offsets[e];
    }
    return previous == m_rows;
}

static inline int routing_holds(int64_t experts, int64_t top_k, int64_t tokens) {
    return experts >= 1 && experts <= LIMIT_EXPERTS && top_k >= 1 && top_k <= LIMIT_TOP_K && top_k <= experts
        && tokens >= 0 && tokens * top_k <= LIMIT_SLOTS;
}

static inline int streams_hold(int64_t stride, int64_t n_streams, int64_t batch, int64_t dim) {
    return n_streams >= 1 && n_streams <= LIMIT_STREAMS && batch >= 0 && (stride == 0 || stride == batch * dim);
}

int glm53_linear(const float *x, const float *w, float *out, int64_t m_rows, int64_t n_cols, int64_t k_len) {
    REQUIRE(m_rows >= 0 && n_cols >= 0 && vector_size(k_len));
    linear(x, w, out, m_rows, n_cols, k_len);
    return OK;
}

int glm53_grouped_linear(const float *rows, const float *w, const int64_t *offsets, float *out, int64_t m_rows,
                         int64_t experts, int64_t n_cols, int64_t k_len) {
    REQUIRE(experts >= 1 && n_cols > 0 && n_cols % 4 == 0 && vector_size(k_len));
    REQUIRE(offsets_hold(offsets, experts, m_rows));
    grouped_linear(rows, w, 0, offsets, out, experts, n_cols, k_len);
    return OK;
}

int glm53_grouped_matmul(const float *rows, const float *w, const int64_t *offsets, float *out, int64_t m_rows,
                         int64_t experts, int64_t n_cols, int64_t k_len) {
    REQUIRE(experts >= 1 && n_cols > 0 && n_cols % 16 == 0 && k_len > 0);
    REQUIRE(offsets_hold(offsets, experts, m_rows));
    grouped_matmul(rows, w, 0, offsets, out, experts, n_cols, k_len);
    return OK;
}

int glm53_moe_dispatch(const float *x, const float *router, int64_t tokens, int64_t dim, int64_t experts,
                       int64_t top_k, float *rows, int64_t *counts, int64_t *offsets, int64_t *position,
                       float *gates) {
    REQUIRE(vector_size(dim) && routing_holds(experts, top_k, tokens));
    moe_dispatch(x, router, tokens, dim, experts, top_k, rows, counts, offsets, position, gates);
    return OK;
}

int glm53_moe_combine(const float *expert_out, const int64_t *position, const float *gates, const float *shared,
                      float *out, int64_t tokens, int64_t dim, int64_t top_k) {
    REQUIRE(tokens >= 0 && dim > 0 && top_k >= 1 && top_k <= LIMIT_TOP_K);
    for (int64_t slot = 0; slot < tokens * top_k; slot++)
        REQUIRE(position[slot] >= 0 && position[slot] < tokens * top_k);
    moe_combine(expert_out, position, gates, shared, out, tokens, dim, top_k);
    return OK;
}

/* rows index [0, padded_rows): every slot reads (and its backward writes) a row of out. Two slots of one
 * token may not share a row (the backward's threads write rows, one token each). */
int glm53_moe_combine_rows_bf16(const uint16_t *out, const int64_t *rows, const float *gates, float *routed,
                                int64_t tokens, int64_t dim, int64_t top_k, int64_t padded_rows) {
    REQUIRE(tokens >= 0 && vector_size(dim) && top_k >= 1 && top_k <= LIMIT_TOP_K && padded_rows >= 0);
    for (int64_t slot = 0; slot < tokens * top_k; slot++)
        REQUIRE(rows[slot] >= 0 && rows[slot] < padded_rows);
    moe_combine_rows_bf16(out, rows, gates, routed, tokens, dim, top_k);
    return OK;
}

int glm53_moe_combine_rows_bf16_backward(const uint16_t *out, const int64_t *rows, const float *gates,
                                         const float *grad, uint16_t *grad_out, float *grad_gates, int64_t tokens,
                                         int64_t dim, int64_t top_k, int64_t padded_rows) {
    REQUIRE(tokens >= 0 && vector_size(dim) && top_k >= 1 && top_k <= LIMIT_TOP_K && padded_rows >= 0);
    for (int64_t slot = 0; slot < tokens * top_k; slot++)
        REQUIRE(rows[slot] >= 0 && rows[slot] < padded_rows);
    moe_combine_rows_bf16_backward(out, rows, gates, grad, grad_out, grad_gates, tokens, dim, top_k);
    return OK;
}

int glm53_linear_attention_step(const float *qkv, float *kv, float *z, float *out, int64_t batch, int64_t heads,
                                int64_t d, const float *cos, const float *sin, float floor) {
    REQUIRE(batch >= 0 && heads >= 1 && vector_size(d) && d <= LIMIT_HEAD_DIM && (cos == NULL) == (sin == NULL));
    linear_attention_step(qkv, kv, z, out, batch, heads, d, cos, sin, floor);
    return OK;
}

int glm53_linear_attention_scan_forward(const float *qkv, float *out, float *den, float *kv, float *z, float *work,
                                        int64_t batch, int64_t steps, int64_t heads, int64_t d, const float *cos,
                                        const float *sin, float floor) {
    REQUIRE(batch >= 0 && steps >= 0 && heads >= 1 && vector_size(d) && d <= LIMIT_HEAD_DIM
            && (cos == NULL) == (sin == NULL));
    linear_attention_scan_forward(qkv, out, den, kv, z, work, batch, steps, heads, d, cos, sin, floor);
    return OK;
}

int glm53_linear_attention_scan_backward(const float *qkv, const float *out, const float *den, const float *grad_out,
                                         float *grad_qkv, float *state, float *gscratch, int64_t batch, int64_t steps,
                                         int64_t heads, int64_t d, const float *cos, const float *sin, float floor) {
    REQUIRE(batch >= 0 && steps >= 0 && heads >= 1 && vector_size(d) && d <= LIMIT_HEAD_DIM
            && (cos == NULL) == (sin == NULL));
    linear_attention_scan_backward(qkv, out, den, grad_out, grad_qkv, state, gscratch, batch, steps, heads, d, cos,
                                   sin, floor);
    return OK;
}

int glm53_swiglu_forward(const float *h, float *out, int64_t rows, int64_t hidden) {
    REQUIRE(rows >= 0 && vector_size(hidden));
    swiglu_forward(h, out, rows, hidden);
    return OK;
}

int glm53_swiglu_backward(const float *h, const float *grad_out, float *grad, int64_t rows, int64_t hidden) {
    REQUIRE(rows >= 0 && vector_size(hidden));
    swiglu_backward(h, grad_out, grad, rows, hidden);
    return OK;
}

int glm53_swiglu_forward_bf16(const uint16_t *h, uint16_t *out, int64_t rows, int64_t hidden) {
    REQUIRE(rows >= 0 && vector_size(hidden));
    swiglu_forward_bf16(h, out, rows, hidden);
    return OK;
}

int glm53_swiglu_backward_bf16(const uint16_t *h, const uint16_t *grad_out, uint16_t *grad, int64_t rows,
                               int64_t hidden) {
    REQUIRE(rows >= 0 && vector_size(hidden));
    swiglu_backward_bf16(h, grad_out, grad, rows, hidden);
    return OK;
}

int glm53_rms_norm_forward(const float *x, const float *w, float *out, float *rstd, int64_t rows, int64_t dim,
                           float eps) {
    REQUIRE(rows >= 0 && vector_size(dim));
    rms_norm_forward(x, w, out, rstd, rows, dim, eps);
    return OK;
}

int glm53_rms_norm_backward(const float *x, const float *w, const float *rstd, const float *grad_out, float *grad_x,
                            float *grad_w, float *partial, int64_t rows, int64_t dim) {
    REQUIRE(rows >= 0 && vector_size(dim));
    rms_norm_backward(x, w, rstd, grad_out, grad_x, grad_w, partial, rows, dim);
    return OK;
}

/* bf16 (0 or 1): whether the weight products' weights (qkv_w here; out_w, gate_up, down, shared_up and
 * shared_down below; never the router or the norms) are bf16 rather than float32. */
int glm53_decode_attention_in(const float *streams, int64_t stream_stride, int64_t n_streams, int64_t batch,
                              int64_t dim, const float *input_logits, const float *norm_w, float eps,
                              const void *qkv_w, int64_t bf16, float *mixed, float *qkv) {
    REQUIRE(vector_size(dim) && streams_hold(stream_stride, n_streams, batch, dim) && (bf16 == 0 || bf16 == 1));
    return decode_attention_in(streams, stream_stride, n_streams, batch, dim, input_logits, norm_w, eps, qkv_w,
                               (int)bf16, mixed, qkv) ? NO_MEMORY : OK;
}

int glm53_sparse_attention_step(const float *qkv, float *keys, float *values, int64_t capacity, int64_t n,
                                int64_t slot, int64_t batch, int64_t heads, int64_t d, const float *cos,
                                const float *sin, float *out) {
    REQUIRE(batch >= 0 && heads >= 1 && vector_size(d) && d <= LIMIT_HEAD_DIM);
    REQUIRE(n >= 0 && n + 1 <= LIMIT_KEYS && n <= capacity && slot >= -1 && slot < capacity);
    sparse_attention_step(qkv, keys, values, capacity, n, slot, batch, heads, d, cos, sin, out);
    return OK;
}

int glm53_decode_moe_out(const float *streams, int64_t stream_stride, int64_t n_streams, int64_t batch,
                         int64_t dim, const float *output_logits, int64_t double_residual, const float *attn,
                         const void *out_w, const float *mixed, const float *norm_w, float eps,
                         const float *router, int64_t experts, int64_t top_k, const void *gate_up,
                         const void *down, int64_t hidden, const void *shared_up, const void *shared_down,
                         int64_t bf16, int64_t *counts, float *new_streams) {
    REQUIRE(dim > 0 && dim % 16 == 0 && vector_size(hidden) && streams_hold(stream_stride, n_streams, batch, dim));
    REQUIRE(routing_holds(experts, top_k, batch) && (bf16 == 0 || bf16 == 1));
    return decode_moe_out(streams, stream_stride, n_streams, batch, dim, output_logits, double_residual, attn,
                          out_w, mixed, norm_w, eps, router, experts, top_k, gate_up, down, hidden, shared_up,
                          shared_down, (int)bf16, counts, new_streams) ? NO_MEMORY : OK;
}

/* The stack's sizes as decode_moe_out and the attention steps check them, and each layer's fields: its
 * kind, every pointer it reads present, a sparse layer's kept keys and slot inside its buffers. */
int glm53_decode_stack(const int64_t *layers, int64_t n_layers, const float *streams, int64_t stream_stride,
                       int64_t n_streams, int64_t batch, int64_t dim, int64_t heads, int64_t experts, int64_t top_k,
                       int64_t hidden, int64_t double_residual, int64_t bf16, float eps, float floor, const float *cos,
                       const float *sin, int64_t *counts, float *new_streams, const float *head_norm, float head_eps,
                       const float *head_w, int64_t vocab, float *hidden_out, float *logits_out) {
    REQUIRE(n_layers >= 1 && dim > 0 && dim % 16 == 0 && vector_size(hidden) && streams_hold(stream_stride, n_streams, batch, dim));
    REQUIRE(routing_holds(experts, top_k, batch) && (bf16 == 0 || bf16 == 1) && (double_residual == 0 || double_residual == 1));
    REQUIRE(heads >= 1 && dim % heads == 0 && vector_size(dim / heads) && dim / heads <= LIMIT_HEAD_DIM);
    int any_rotates = 0;
    for (int64_t l = 0; l < n_layers; l++) {
        const int64_t *f = layers + l * LAYER_FIELDS;
        REQUIRE(f[L_SPARSE] == 0 || f[L_SPARSE] == 1);
        REQUIRE(f[L_ROTATE] == 0 || f[L_ROTATE] == 1);
        for (int field = L_INPUT_LOGITS; field < LAYER_FIELDS; field++)
            REQUIRE(f[field] != 0 || field == L_CAPACITY || field == L_KEPT || field == L_SLOT || field == L_ROTATE);
        if (f[L_SPARSE])
            REQUIRE(f[L_KEPT] >= 0 && f[L_KEPT] + 1 <= LIMIT_KEYS && f[L_KEPT] <= f[L_CAPACITY] && f[L_SLOT] >= -1
                    && f[L_SLOT] < f[L_CAPACITY]);
        any_rotates |= f[L_SPARSE] || f[L_ROTATE];
    }
    REQUIRE(!any_rotates || (cos != NULL && sin != NULL));
    /* the head: all of its pointers and a vocabulary, or none of them */
    REQUIRE(head_w == NULL ? head_norm == NULL && hidden_out == NULL && logits_out == NULL
                           : head_norm != NULL && hidden_out != NULL && logits_out != NULL && vocab >= 1);
    return decode_stack(layers, n_layers, streams, stream_stride, n_streams, batch, dim, heads, experts, top_k, hidden,
                        double_residual, (int)bf16, eps, floor, cos, sin, counts, new_streams, head_norm, head_eps,
                        head_w, vocab, hidden_out, logits_out);
}
