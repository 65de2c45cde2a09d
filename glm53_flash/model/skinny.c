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
#include <math.h>
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

/* A block kernel: out[m, n0 : n0 + width] for m_rows rows of x against one expert's weights. */
typedef void (*block_kernel)(const float *x, const float *w, float *out, int64_t m_rows, int64_t n0,
                             int64_t n_cols, int64_t k_len);

/* Rows sorted by expert (offsets[e] = end of expert e's rows, the cumulative counts), each expert's
 * weights n_cols * k_len floats apart: the work is split over (expert, block of `width` outputs). */
static void grouped(block_kernel kernel, int64_t width, const float *rows, const float *w,
                    const int64_t *offsets, float *out, int64_t experts, int64_t n_cols, int64_t k_len) {
    int64_t blocks = n_cols / width;
#pragma omp parallel for schedule(static)
    for (int64_t item = 0; item < experts * blocks; item++) {
        int64_t e = item / blocks, b = item % blocks;
        int64_t start = e ? offsets[e - 1] : 0, count = offsets[e] - start;
        if (count > 0)
            kernel(rows + start * k_len, w + e * n_cols * k_len, out + start * n_cols, count, width * b,
                   n_cols, k_len);
    }
}

/* rows [M, K] sorted by expert, w [E, N, K] (nn.Linear layout per expert) -> out [M, N], row i
 * through its expert. K % 8 == 0, N % 4 == 0. */
void skinny_grouped_linear(const float *rows, const float *w, const int64_t *offsets, float *out,
                           int64_t experts, int64_t n_cols, int64_t k_len) {
    grouped(rows_by_4, 4, rows, w, offsets, out, experts, n_cols, k_len);
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

/* rows [M, K] sorted by expert, w [E, K, N] (x @ W layout per expert) -> out [M, N]. N % 16 == 0. */
void skinny_grouped_matmul(const float *rows, const float *w, const int64_t *offsets, float *out,
                           int64_t experts, int64_t n_cols, int64_t k_len) {
    grouped(cols_by_16, 16, rows, w, offsets, out, experts, n_cols, k_len);
}

/* Cached decoding's routing, in one pass: router logits x @ router^T [N, E], each token's top-k
 * experts (the larger logit first, the lower index on a tie) and their gates (softmax over the k
 * chosen logits), the slots sorted by expert (stable: token-major order within an expert), each
 * slot's input row copied into `rows` in that order, and per expert the row count and the cumulative
 * offset. `position[t * k + j]` is where token t's j-th slot landed, `gates` is token-major [N, k].
 * D % 8 == 0, k <= 8, E <= 64. */
void skinny_moe_dispatch(const float *x, const float *router, int64_t tokens, int64_t dim, int64_t experts,
                         int64_t top_k, float *rows, int64_t *counts, int64_t *offsets, int64_t *position,
                         float *gates) {
    int64_t chosen[tokens * top_k];
    for (int64_t e = 0; e < experts; e++)
        counts[e] = 0;
    for (int64_t t = 0; t < tokens; t++) {
        float logits[64];
        const float *xt = x + t * dim;
        for (int64_t e = 0; e < experts; e++) {
            const float *we = router + e * dim;
            __m256 a = _mm256_setzero_ps();
            for (int64_t i = 0; i < dim; i += 8)
                a = _mm256_fmadd_ps(_mm256_loadu_ps(xt + i), _mm256_loadu_ps(we + i), a);
            logits[e] = sum1(a);
        }
        float top[8];
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
    int64_t next[64];
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
void skinny_moe_combine(const float *expert_out, const int64_t *position, const float *gates,
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

/* RMSNorm of rows [R, D]: out = (x * 1 / sqrt(mean(x^2) + eps)) * w, as torch's rms_norm orders it.
 * D % 8 == 0. */
void skinny_rms_norm(const float *x, const float *w, float *out, int64_t rows, int64_t dim, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float *o = out + r * dim;
        __m256 a = _mm256_setzero_ps();
        for (int64_t i = 0; i < dim; i += 8) {
            __m256 v = _mm256_loadu_ps(xr + i);
            a = _mm256_fmadd_ps(v, v, a);
        }
        __m256 scale = _mm256_set1_ps(1.0f / sqrtf(sum1(a) / (float)dim + eps));
        for (int64_t i = 0; i < dim; i += 8)
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), scale),
                                                  _mm256_loadu_ps(w + i)));
    }
}

/* One cached decode step of feature-map linear attention (model/linear_attention.py) for B rows and
 * H heads of size d: qkv [B, 3 * H * d] (q | k | v, heads in order within each), the state kv
 * [B, H, d, d] and z [B, H, d] updated in place, out [B, H * d] = phi(q) S / max(phi(q) . z, floor)
 * after S += phi(k) v^T, z += phi(k). phi(u) = ELU(u) + 1. With cos and sin (the rotary tables' rows
 * at this position, [d]) q and k are first rotated in interleaved pairs, the original's order.
 * d % 8 == 0, d <= 256. */
void skinny_linear_attention_step(const float *qkv, float *kv, float *z, float *out, int64_t batch,
                                  int64_t heads, int64_t d, const float *cos, const float *sin, float floor) {
    int64_t dim = heads * d;
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < batch * heads; bh++) {
        int64_t b = bh / heads, h = bh % heads;
        const float *q = qkv + b * 3 * dim + h * d, *k = q + dim, *v = q + 2 * dim;
        float pq[256], pk[256], num[256];
        for (int64_t i = 0; i < d; i++) {
            float qi = q[i], ki = k[i];
            if (cos) {  /* pairs (2j, 2j + 1) rotate: x * cos + (-x_odd, x_even) * sin */
                float qo = (i & 1) ? q[i - 1] : -q[i + 1], ko = (i & 1) ? k[i - 1] : -k[i + 1];
                qi = qi * cos[i] + qo * sin[i];
                ki = ki * cos[i] + ko * sin[i];
            }
            pq[i] = qi > 0.0f ? qi + 1.0f : expf(qi);
            pk[i] = ki > 0.0f ? ki + 1.0f : expf(ki);
        }
        float *state = kv + bh * d * d, *zs = z + bh * d;
        float den = 0.0f;
        for (int64_t j = 0; j < d; j += 8)
            _mm256_storeu_ps(num + j, _mm256_setzero_ps());
        for (int64_t i = 0; i < d; i++) {
            float *row = state + i * d;
            __m256 ki = _mm256_set1_ps(pk[i]), qi = _mm256_set1_ps(pq[i]);
            for (int64_t j = 0; j < d; j += 8) {
                __m256 s = _mm256_fmadd_ps(ki, _mm256_loadu_ps(v + j), _mm256_loadu_ps(row + j));
                _mm256_storeu_ps(row + j, s);
                _mm256_storeu_ps(num + j, _mm256_fmadd_ps(qi, s, _mm256_loadu_ps(num + j)));
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
