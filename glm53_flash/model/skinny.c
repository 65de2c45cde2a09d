/* Skinny float32 matrix products for cached decoding on the CPU: a few rows (one per sequence in the
 * batch) against a weight matrix that is read once per step from memory. BLAS libraries tune for
 * large M; at 4-32 rows they stream the weights at a fraction of the memory bandwidth. These loops
 * keep a block of weight rows in registers/L1 and run every input row past it, so each weight byte is
 * loaded from memory once per call.
 *
 * Built on first use by glm53_flash/model/kernels.py (cc -O3 -mavx2 -mfma -fopenmp) when the CPU has
 * AVX2 and FMA; the eager torch path is the fallback and the test oracle. OpenMP shares the runtime
 * torch already loaded (the same libgomp soname), so the threads are torch's.
 *
 * Every output element is computed by exactly one thread in a fixed order, so results do not depend
 * on the thread count.
 */
#include <immintrin.h>
#include <stdint.h>

/* Four 8-lane accumulators -> their four horizontal sums. */
static inline __m128 sum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d), abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

static inline float sum1(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_hadd_ps(s, s);
    s = _mm_hadd_ps(s, s);
    return _mm_cvtss_f32(s);
}

/* out[m, n] = sum_k x[m, k] * w[n, k] for weight rows n0 <= n < n0 + 4 (nn.Linear's layout). K % 8 == 0. */
static void rows_by_4(const float *x, const float *w, float *out, int64_t m_rows, int64_t n0,
                      int64_t ldo, int64_t k_len) {
    const float *w0 = w + n0 * k_len, *w1 = w0 + k_len, *w2 = w1 + k_len, *w3 = w2 + k_len;
    int64_t m = 0;
    for (; m + 3 <= m_rows; m += 3) {
        const float *x0 = x + m * k_len, *x1 = x0 + k_len, *x2 = x1 + k_len;
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
        __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00;
        for (int64_t k = 0; k < k_len; k += 8) {
            __m256 v0 = _mm256_loadu_ps(w0 + k), v1 = _mm256_loadu_ps(w1 + k);
            __m256 v2 = _mm256_loadu_ps(w2 + k), v3 = _mm256_loadu_ps(w3 + k);
            __m256 y = _mm256_loadu_ps(x0 + k);
            a00 = _mm256_fmadd_ps(y, v0, a00); a01 = _mm256_fmadd_ps(y, v1, a01);
            a02 = _mm256_fmadd_ps(y, v2, a02); a03 = _mm256_fmadd_ps(y, v3, a03);
            y = _mm256_loadu_ps(x1 + k);
            a10 = _mm256_fmadd_ps(y, v0, a10); a11 = _mm256_fmadd_ps(y, v1, a11);
            a12 = _mm256_fmadd_ps(y, v2, a12); a13 = _mm256_fmadd_ps(y, v3, a13);
            y = _mm256_loadu_ps(x2 + k);
            a20 = _mm256_fmadd_ps(y, v0, a20); a21 = _mm256_fmadd_ps(y, v1, a21);
            a22 = _mm256_fmadd_ps(y, v2, a22); a23 = _mm256_fmadd_ps(y, v3, a23);
        }
        float *o = out + m * ldo + n0;
        _mm_storeu_ps(o, sum4(a00, a01, a02, a03));
        _mm_storeu_ps(o + ldo, sum4(a10, a11, a12, a13));
        _mm_storeu_ps(o + 2 * ldo, sum4(a20, a21, a22, a23));
    }
    for (; m < m_rows; m++) {
        const float *x0 = x + m * k_len;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t k = 0; k < k_len; k += 8) {
            __m256 y = _mm256_loadu_ps(x0 + k);
            a0 = _mm256_fmadd_ps(y, _mm256_loadu_ps(w0 + k), a0);
            a1 = _mm256_fmadd_ps(y, _mm256_loadu_ps(w1 + k), a1);
            a2 = _mm256_fmadd_ps(y, _mm256_loadu_ps(w2 + k), a2);
            a3 = _mm256_fmadd_ps(y, _mm256_loadu_ps(w3 + k), a3);
        }
        _mm_storeu_ps(out + m * ldo + n0, sum4(a0, a1, a2, a3));
    }
}

/* The same for one weight row n (the tail when N % 4 != 0). */
static void rows_by_1(const float *x, const float *w, float *out, int64_t m_rows, int64_t n,
                      int64_t ldo, int64_t k_len) {
    const float *w0 = w + n * k_len;
    for (int64_t m = 0; m < m_rows; m++) {
        const float *x0 = x + m * k_len;
        __m256 a = _mm256_setzero_ps();
        for (int64_t k = 0; k < k_len; k += 8)
            a = _mm256_fmadd_ps(_mm256_loadu_ps(x0 + k), _mm256_loadu_ps(w0 + k), a);
        out[m * ldo + n] = sum1(a);
    }
}

/* x [M, K] @ w[N, K]^T -> out [M, N], all contiguous; K % 8 == 0. */
void skinny_linear(const float *x, const float *w, float *out, int64_t m_rows, int64_t n_cols, int64_t k_len) {
    int64_t blocks = n_cols / 4;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++)
        rows_by_4(x, w, out, m_rows, 4 * b, n_cols, k_len);
    for (int64_t n = 4 * blocks; n < n_cols; n++)
        rows_by_1(x, w, out, m_rows, n, n_cols, k_len);
}

/* Rows sorted by expert: rows [M, K], offsets[e] = end of expert e's rows (cumulative counts),
 * w [E, N, K] (nn.Linear layout per expert) -> out [M, N], row i through its expert. K % 8 == 0,
 * N % 4 == 0. The work is split over (expert, block of 4 outputs) pairs. */
void skinny_grouped_linear(const float *rows, const float *w, const int64_t *offsets, float *out,
                           int64_t experts, int64_t n_cols, int64_t k_len) {
    int64_t blocks = n_cols / 4;
#pragma omp parallel for schedule(static)
    for (int64_t item = 0; item < experts * blocks; item++) {
        int64_t e = item / blocks, b = item % blocks;
        int64_t start = e ? offsets[e - 1] : 0, count = offsets[e] - start;
        if (count > 0)
            rows_by_4(rows + start * k_len, w + e * n_cols * k_len, out + start * n_cols, count, 4 * b,
                      n_cols, k_len);
    }
}

/* out[m, n0:n0+16] = sum_k x[m, k] * w[k, n0:n0+16] (x @ W layout, w [K, N]). N % 16 == 0. */
static void cols_by_16(const float *x, const float *w, float *out, int64_t m_rows, int64_t n0,
                       int64_t n_cols, int64_t k_len) {
    int64_t m = 0;
    for (; m + 4 <= m_rows; m += 4) {
        const float *x0 = x + m * k_len, *x1 = x0 + k_len, *x2 = x1 + k_len, *x3 = x2 + k_len;
        __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0;
        for (int64_t k = 0; k < k_len; k++) {
            const float *wk = w + k * n_cols + n0;
            __m256 lo = _mm256_loadu_ps(wk), hi = _mm256_loadu_ps(wk + 8);
            __m256 y = _mm256_broadcast_ss(x0 + k);
            a0 = _mm256_fmadd_ps(y, lo, a0); b0 = _mm256_fmadd_ps(y, hi, b0);
            y = _mm256_broadcast_ss(x1 + k);
            a1 = _mm256_fmadd_ps(y, lo, a1); b1 = _mm256_fmadd_ps(y, hi, b1);
            y = _mm256_broadcast_ss(x2 + k);
            a2 = _mm256_fmadd_ps(y, lo, a2); b2 = _mm256_fmadd_ps(y, hi, b2);
            y = _mm256_broadcast_ss(x3 + k);
            a3 = _mm256_fmadd_ps(y, lo, a3); b3 = _mm256_fmadd_ps(y, hi, b3);
        }
        float *o = out + m * n_cols + n0;
        _mm256_storeu_ps(o, a0); _mm256_storeu_ps(o + 8, b0); o += n_cols;
        _mm256_storeu_ps(o, a1); _mm256_storeu_ps(o + 8, b1); o += n_cols;
        _mm256_storeu_ps(o, a2); _mm256_storeu_ps(o + 8, b2); o += n_cols;
        _mm256_storeu_ps(o, a3); _mm256_storeu_ps(o + 8, b3);
    }
    for (; m < m_rows; m++) {
        const float *x0 = x + m * k_len;
        __m256 a0 = _mm256_setzero_ps(), b0 = a0;
        for (int64_t k = 0; k < k_len; k++) {
            const float *wk = w + k * n_cols + n0;
            __m256 y = _mm256_broadcast_ss(x0 + k);
            a0 = _mm256_fmadd_ps(y, _mm256_loadu_ps(wk), a0);
            b0 = _mm256_fmadd_ps(y, _mm256_loadu_ps(wk + 8), b0);
        }
        _mm256_storeu_ps(out + m * n_cols + n0, a0);
        _mm256_storeu_ps(out + m * n_cols + n0 + 8, b0);
    }
}

/* Rows sorted by expert: rows [M, K], offsets as above, w [E, K, N] (x @ W layout per expert)
 * -> out [M, N]. N % 16 == 0. */
void skinny_grouped_matmul(const float *rows, const float *w, const int64_t *offsets, float *out,
                           int64_t experts, int64_t n_cols, int64_t k_len) {
    int64_t blocks = n_cols / 16;
#pragma omp parallel for schedule(static)
    for (int64_t item = 0; item < experts * blocks; item++) {
        int64_t e = item / blocks, b = item % blocks;
        int64_t start = e ? offsets[e - 1] : 0, count = offsets[e] - start;
        if (count > 0)
            cols_by_16(rows + start * k_len, w + e * k_len * n_cols, out + start * n_cols, count, 16 * b,
                       n_cols, k_len);
    }
}
