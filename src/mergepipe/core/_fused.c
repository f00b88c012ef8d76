/* Fused block kernels: decode, delta, operator, encode in one pass over L1-sized tiles.
 *
 * Every float operation is the one the torch kernels of core/operators (linear,
 * task_arithmetic, ties) perform, in the same order, in float32: built with -ffp-contract=off
 * (no fused multiply-add) and without -ffast-math, the results are bit-identical.  NaN bit
 * patterns are the exception (torch's vector and scalar paths disagree on them): the kernels
 * return 1 when an output is NaN and the caller recomputes that block with torch.
 *
 * dtype codes: 0 = F32, 1 = F16, 2 = BF16 (little-endian raw bytes).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define TILE 512
#define INLINE static inline __attribute__((always_inline))
/* The tile loops, compiled three times on x86-64: AVX-512 (x86-64-v4) or AVX2 where the CPU
 * has it (picked at load time), the baseline otherwise. Wider vectors change no result (no
 * FMA: -ffp-contract=off). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define CLONES
#endif

static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* IEEE half -> float, exact (the FP16 library's algorithm, as torch's scalar path). */
INLINE float f16_to_f32(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const uint32_t exp_offset = 0xE0u << 23;
    const float exp_scale = 0x1.0p-112f;
    const float normalized = bits_f32((two_w >> 4) + exp_offset) * exp_scale;
    const uint32_t magic_mask = 126u << 23;
    const float magic_bias = 0.5f;
    const float denormalized = bits_f32((two_w >> 17) | magic_mask) - magic_bias;
    const uint32_t denormalized_cutoff = 1u << 27;
    const uint32_t result = sign | (two_w < denormalized_cutoff ? f32_bits(denormalized)
                                                                : f32_bits(normalized));
    return bits_f32(result);
}

/* float -> IEEE half, round to nearest even (the FP16 library's algorithm, as torch's). */
INLINE uint16_t f32_to_f16(float f) {
    const float scale_to_inf = 0x1.0p+112f;
    const float scale_to_zero = 0x1.0p-110f;
    float base = (__builtin_fabsf(f) * scale_to_inf) * scale_to_zero;
    const uint32_t w = f32_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = bits_f32((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = f32_bits(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

/* float -> bfloat16, round to nearest even (finite and infinite values; NaN: see above). */
INLINE uint16_t f32_to_bf16(float f) {
    const uint32_t u = f32_bits(f);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

INLINE void decode(const void *src, int code, Py_ssize_t at, Py_ssize_t n, float *dst) {
    if (code == 0) {
        memcpy(dst, (const float *)src + at, (size_t)n * 4);
    } else if (code == 2) {
        const uint16_t *s = (const uint16_t *)src + at;
        for (Py_ssize_t i = 0; i < n; i++) dst[i] = bits_f32((uint32_t)s[i] << 16);
    } else {
        const uint16_t *s = (const uint16_t *)src + at;
        for (Py_ssize_t i = 0; i < n; i++) dst[i] = f16_to_f32(s[i]);
    }
}

/* Encode a tile; returns 1 if any value is NaN. */
INLINE int encode(const float *src, void *dst, int code, Py_ssize_t at, Py_ssize_t n) {
    int nan = 0;
    for (Py_ssize_t i = 0; i < n; i++) nan |= src[i] != src[i];
    if (code == 0) {
        memcpy((float *)dst + at, src, (size_t)n * 4);
    } else if (code == 2) {
        uint16_t *d = (uint16_t *)dst + at;
        for (Py_ssize_t i = 0; i < n; i++) d[i] = f32_to_bf16(src[i]);
    } else {
        uint16_t *d = (uint16_t *)dst + at;
        for (Py_ssize_t i = 0; i < n; i++) d[i] = f32_to_f16(src[i]);
    }
    return nan;
}

static const Py_ssize_t SIZES[3] = {4, 2, 2};

/* One input of a kernel call: raw bytes, dtype, and for experts whether they are full models
 * (delta = value - base) or deltas already. */
typedef struct {
    Py_buffer buf;
    int code;
    int full;
    float weight;
    /* trim: 0 none, 1 magnitude (hardshrink(lambd), then the entries tied at tau by `ties`:
     * 0 kept, 1 keyed draw, 2 all dropped), 2 DARE drop (kept where the keyed draw is below
     * `limit`; tau != 0: kept entries divided by tau, the density) */
    int trim, ties;
    float lambd, tau;
    uint64_t start, limit;
} Input;

static void release(Input *in, Py_ssize_t k) {
    for (Py_ssize_t j = 0; j < k; j++)
        if (in[j].buf.obj) PyBuffer_Release(&in[j].buf);
}

static int get_buffer(PyObject *obj, Py_buffer *buf, int code, Py_ssize_t n, int writable) {
    if (code < 0 || code > 2) {
        PyErr_SetString(PyExc_ValueError, "dtype code must be 0, 1 or 2");
        return -1;
    }
    if (PyObject_GetBuffer(obj, buf, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) return -1;
    if (buf->len != n * SIZES[code]) {
        PyErr_Format(PyExc_ValueError, "buffer of %zd bytes for %zd elements", buf->len, n);
        PyBuffer_Release(buf);
        buf->obj = NULL;
        return -1;
    }
    return 0;
}

/* experts: a sequence of tuples (buffer, code, full, weight, trim, lambd, ties, tau, start,
 * limit); see Input. */
static Input *parse_experts(PyObject *seq, Py_ssize_t n, Py_ssize_t *k_out) {
    PyObject *fast = PySequence_Fast(seq, "experts must be a sequence");
    if (!fast) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(fast);
    Input *in = PyMem_Calloc(k ? (size_t)k : 1, sizeof(Input));
    if (!in) { Py_DECREF(fast); PyErr_NoMemory(); return NULL; }
    for (Py_ssize_t j = 0; j < k; j++) {
        PyObject *t = PySequence_Fast_GET_ITEM(fast, j), *obj;
        double w, lambd = 0, tau = 0;
        unsigned long long start = 0, limit = 0;
        int ok = PyArg_ParseTuple(t, "Oiid" "idi" "dKK", &obj, &in[j].code, &in[j].full, &w,
                                  &in[j].trim, &lambd, &in[j].ties, &tau, &start, &limit);
        if (!ok || get_buffer(obj, &in[j].buf, in[j].code, n, 0) < 0) {
            release(in, j);
            PyMem_Free(in);
            Py_DECREF(fast);
            return NULL;
        }
        in[j].weight = (float)w;
        in[j].lambd = (float)lambd;
        in[j].tau = (float)tau;
        in[j].start = start;
        in[j].limit = limit;
    }
    Py_DECREF(fast);
    *k_out = k;
    return in;
}

INLINE uint64_t mix64(uint64_t z) {
    z ^= z >> 30; z *= 0xBF58476D1CE4E5B9ull;
    z ^= z >> 27; z *= 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#define GOLDEN 0x9E3779B97F4A7C15ull

/* Where 64-bit vector multiplies exist (x86-64-v4: AVX-512DQ), drawing every entry's keyed
 * draw in a vector loop is cheaper than drawing the tied ones one by one; set at import. */
static int dense_draws;

/* The tied entries of a tile (|d| == tau, by bits; |d| is no NaN there) that the keyed draw
 * drops (keyed_hash.not_below_at: the draw is not below the kept fraction; ties 2: every one)
 * become `zero` in t.  Either every entry's draw in a vector loop, or the hits as bit masks of
 * 64 entries, each dropped without a branch on its draw (a tie is kept or dropped at random: a
 * branch would be mispredicted). */
INLINE void drop_ties(const Input *e, const float *d, float *t, float zero, Py_ssize_t at,
                      Py_ssize_t m) {
    const uint32_t tb = f32_bits(e->tau), zb = f32_bits(zero);
    const uint64_t start = e->start + (uint64_t)at * GOLDEN;
    const uint64_t limit = e->ties == 2 ? 0 : e->limit;  /* z >= 0: always dropped */
    Py_ssize_t i = 0;
    if (dense_draws) {
        for (; i < m; i++) {
            const uint32_t drop = -(uint32_t)((f32_bits(d[i]) & 0x7FFFFFFFu) == tb)
                                & -(uint32_t)(mix64((uint64_t)i * GOLDEN + start) >= limit);
            t[i] = bits_f32((f32_bits(t[i]) & ~drop) | (zb & drop));
        }
        return;
    }
#ifdef __SSE2__
    const __m128i abs_mask = _mm_set1_epi32(0x7FFFFFFF), want = _mm_set1_epi32((int)tb);
    for (; i + 64 <= m; i += 64) {
        uint64_t hits = 0;
        for (int g = 0; g < 64; g += 4) {
            const __m128i v = _mm_and_si128(_mm_loadu_si128((const __m128i *)(d + i + g)),
                                            abs_mask);
            hits |= (uint64_t)_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(v, want))) << g;
        }
        while (hits) {
            const Py_ssize_t x = i + __builtin_ctzll(hits);
            hits &= hits - 1;
            const uint32_t keep = -(uint32_t)(mix64((uint64_t)x * GOLDEN + start) < limit);
            t[x] = bits_f32((f32_bits(t[x]) & keep) | (zb & ~keep));
        }
    }
#endif
    for (; i < m; i++)
        if ((f32_bits(d[i]) & 0x7FFFFFFFu) == tb
            && mix64((uint64_t)i * GOLDEN + start) >= limit) t[i] = zero;
}

/* One expert's sparsified, weighted delta of a tile (sparsify.trimmed_into or dropped_into,
 * then scale_). */
INLINE void sparsified(const Input *e, const float *b, float *d, float *t, Py_ssize_t at,
                    Py_ssize_t m) {
    const int hard = e->trim && e->trim != 2;  /* sparsify.trimmed_into's hardshrink */
    decode(e->buf.buf, e->code, at, m, d);
    if (hard) {  /* delta and hardshrink in one loop (the same operations) */
        const float l = e->lambd, nl = -e->lambd;
        if (e->full) {
            for (Py_ssize_t i = 0; i < m; i++) {
                const float x = d[i] - b[i];
                d[i] = x;
                t[i] = ((x >= nl) & (x <= l)) ? 0.0f : x;
            }
        } else {
            for (Py_ssize_t i = 0; i < m; i++) t[i] = ((d[i] >= nl) & (d[i] <= l)) ? 0.0f : d[i];
        }
    } else if (e->full) {
        for (Py_ssize_t i = 0; i < m; i++) d[i] = d[i] - b[i];
    }
    if (e->trim == 2) {  /* sparsify.dropped_into: delta * keep, then / density */
        const uint64_t start = e->start + (uint64_t)at * GOLDEN;
        for (Py_ssize_t i = 0; i < m; i++)  /* the keep mask first: a loop without branches */
            t[i] = (float)(mix64((uint64_t)i * GOLDEN + start) < e->limit);
        for (Py_ssize_t i = 0; i < m; i++) t[i] = d[i] * t[i];
        if (e->tau != 0.0f)
            for (Py_ssize_t i = 0; i < m; i++) t[i] = t[i] / e->tau;
    } else if (!hard) {
        memcpy(t, d, (size_t)m * 4);
    }
    if (e->trim != 2 && e->ties) drop_ties(e, d, t, 0.0f, at, m);
    if (e->weight != 1.0f)
        for (Py_ssize_t i = 0; i < m; i++) t[i] = t[i] * e->weight;
}

/* out = base + lam * (sum_j w_j d_j) / divisor, in torch's order (linear, task_arithmetic). */
CLONES static int linear_run(Input *out, Input *base, Input *ex, Py_ssize_t k, Py_ssize_t n,
                      int has_div, float div, int has_lam, float lam) {
    float b[TILE], d[TILE], t[TILE], acc[TILE];
    int nan = 0;
    for (Py_ssize_t at = 0; at < n; at += TILE) {
        const Py_ssize_t m = n - at < TILE ? n - at : TILE;
        decode(base->buf.buf, base->code, at, m, b);
        for (Py_ssize_t j = 0; j < k; j++) {
            const float w = ex[j].weight;
            if (ex[j].trim) {  /* DARE: dropped, rescaled and weighted, then summed */
                sparsified(&ex[j], b, d, t, at, m);
                if (j == 0) memcpy(acc, t, (size_t)m * 4);
                else for (Py_ssize_t i = 0; i < m; i++) acc[i] = acc[i] + t[i];
                continue;
            }
            decode(ex[j].buf.buf, ex[j].code, at, m, d);
            if (ex[j].full)
                for (Py_ssize_t i = 0; i < m; i++) d[i] = d[i] - b[i];
            if (j == 0) {
                if (w != 1.0f) for (Py_ssize_t i = 0; i < m; i++) acc[i] = d[i] * w;
                else memcpy(acc, d, (size_t)m * 4);
            } else if (w != 1.0f) {
                for (Py_ssize_t i = 0; i < m; i++) acc[i] = acc[i] + d[i] * w;
            } else {
                for (Py_ssize_t i = 0; i < m; i++) acc[i] = acc[i] + d[i];
            }
        }
        if (has_div) for (Py_ssize_t i = 0; i < m; i++) acc[i] = acc[i] / div;
        if (has_lam) for (Py_ssize_t i = 0; i < m; i++) acc[i] = acc[i] * lam;
        for (Py_ssize_t i = 0; i < m; i++) acc[i] = b[i] + acc[i];
        nan |= encode(acc, out->buf.buf, out->code, at, m);
    }
    return nan;
}

/* 1.0f if c else 0.0f, as bits: a select that gcc cannot turn into a branch. */
INLINE float one_if(int c) { return bits_f32(-(uint32_t)c & 0x3F800000u); }

/* One expert's trimmed, weighted delta of a tile for TIES (sparsify.trimmed_into, then
 * scale_; a DARE drop goes through `sparsified`): the delta, its hardshrink and weight in one
 * loop, then the dropped ties (which the weight would have turned into 0 * weight). */
INLINE void trimmed(const Input *e, const float *b, float *d, float *t, Py_ssize_t at,
                    Py_ssize_t m) {
    const float l = e->lambd, nl = -e->lambd, w = e->weight;
    decode(e->buf.buf, e->code, at, m, d);
    if (e->full)
        for (Py_ssize_t i = 0; i < m; i++) d[i] = d[i] - b[i];
    if (e->trim && w != 1.0f) {
        for (Py_ssize_t i = 0; i < m; i++)
            t[i] = (((d[i] >= nl) & (d[i] <= l)) ? 0.0f : d[i]) * w;
    } else if (e->trim) {
        for (Py_ssize_t i = 0; i < m; i++) t[i] = ((d[i] >= nl) & (d[i] <= l)) ? 0.0f : d[i];
    } else if (w != 1.0f) {
        for (Py_ssize_t i = 0; i < m; i++) t[i] = d[i] * w;
    } else {
        memcpy(t, d, (size_t)m * 4);
    }
    if (e->ties) drop_ties(e, d, t, 0.0f * w, at, m);
}

/* TIES: trim, sign election, disjoint (normalized) sum, in sparsify.elect_into's order. */
CLONES static int ties_run(Input *out, Input *base, Input *ex, Py_ssize_t k, Py_ssize_t n,
                    int normalize, int has_lam, float lam, float *w) {
    float b[TILE], d[TILE], sign[TILE], mixed[TILE], div[TILE];
    int nan = 0;
    for (Py_ssize_t at = 0; at < n; at += TILE) {
        const Py_ssize_t m = n - at < TILE ? n - at : TILE;
        decode(base->buf.buf, base->code, at, m, b);
        if (at + 3 * TILE <= n)  /* the tile after next of every input, ahead of its use */
            for (Py_ssize_t j = -1; j < k; j++) {
                const Input *e = j < 0 ? base : &ex[j];
                const char *p = (const char *)e->buf.buf + (at + 2 * TILE) * SIZES[e->code];
                for (Py_ssize_t o = 0; o < TILE * SIZES[e->code]; o += 64)
                    __builtin_prefetch(p + o);
            }
        for (Py_ssize_t j = 0; j < k; j++) {
            if (ex[j].trim == 2) sparsified(&ex[j], b, d, w + j * TILE, at, m);
            else trimmed(&ex[j], b, d, w + j * TILE, at, m);
        }
        /* the ordered sum of the experts, and its sign */
        if (k == 1) memcpy(sign, w, (size_t)m * 4);
        for (Py_ssize_t j = 1; j < k; j++) {  /* (in place: loops over aliased arrays
                                                  would not vectorize) */
            const float *wj = w + j * TILE;
            if (j == 1) for (Py_ssize_t i = 0; i < m; i++) sign[i] = w[i] + wj[i];
            else for (Py_ssize_t i = 0; i < m; i++) sign[i] = sign[i] + wj[i];
        }
        for (Py_ssize_t i = 0; i < m; i++) sign[i] = sign[i] < 0.0f ? -1.0f : 1.0f;
        for (Py_ssize_t j = 0; j < k; j++) {  /* keep, mixed and divisor in one loop */
            const float *wj = w + j * TILE, a = ex[j].weight;
            if (!j && normalize) {
                for (Py_ssize_t i = 0; i < m; i++) {
                    const float keep = one_if(wj[i] * sign[i] > 0.0f);
                    mixed[i] = 0.0f + wj[i] * keep;
                    div[i] = 0.0f + a * keep;
                }
            } else if (!j) {
                for (Py_ssize_t i = 0; i < m; i++)
                    mixed[i] = 0.0f + wj[i] * one_if(wj[i] * sign[i] > 0.0f);
            } else if (normalize) {
                for (Py_ssize_t i = 0; i < m; i++) {
                    const float keep = one_if(wj[i] * sign[i] > 0.0f);
                    mixed[i] = mixed[i] + wj[i] * keep;
                    div[i] = div[i] + a * keep;
                }
            } else {
                for (Py_ssize_t i = 0; i < m; i++)
                    mixed[i] = mixed[i] + wj[i] * one_if(wj[i] * sign[i] > 0.0f);
            }
        }
        if (normalize) {
            for (Py_ssize_t i = 0; i < m; i++) {
                const float dv = div[i] + (div[i] == 0.0f ? 1.0f : 0.0f);
                mixed[i] = mixed[i] / dv;
            }
        }
        if (has_lam) for (Py_ssize_t i = 0; i < m; i++) mixed[i] = mixed[i] * lam;
        for (Py_ssize_t i = 0; i < m; i++) mixed[i] = b[i] + mixed[i];
        nan |= encode(mixed, out->buf.buf, out->code, at, m);
    }
    return nan;
}

/* Shared argument handling: (out, out_code, base, base_code, experts, n, ...). */
static int parse_io(PyObject *o_out, int out_code, PyObject *o_base, int base_code, Py_ssize_t n,
                    Input *out, Input *base) {
    if (n < 0) { PyErr_SetString(PyExc_ValueError, "n must be >= 0"); return -1; }
    if (get_buffer(o_out, &out->buf, out_code, n, 1) < 0) return -1;
    if (get_buffer(o_base, &base->buf, base_code, n, 0) < 0) {
        PyBuffer_Release(&out->buf);
        return -1;
    }
    out->code = out_code;
    base->code = base_code;
    return 0;
}

static PyObject *py_linear(PyObject *self, PyObject *args) {
    PyObject *o_out, *o_base, *o_ex;
    int out_code, base_code, has_div, has_lam;
    Py_ssize_t n, k;
    double div, lam;
    Input out = {0}, base = {0};
    if (!PyArg_ParseTuple(args, "OiOiOnpdpd", &o_out, &out_code, &o_base, &base_code, &o_ex, &n,
                          &has_div, &div, &has_lam, &lam))
        return NULL;
    if (parse_io(o_out, out_code, o_base, base_code, n, &out, &base) < 0) return NULL;
    Input *ex = parse_experts(o_ex, n, &k);
    if (!ex) { PyBuffer_Release(&out.buf); PyBuffer_Release(&base.buf); return NULL; }
    int nan;
    Py_BEGIN_ALLOW_THREADS
    nan = linear_run(&out, &base, ex, k, n, has_div, (float)div, has_lam, (float)lam);
    Py_END_ALLOW_THREADS
    release(ex, k);
    PyMem_Free(ex);
    PyBuffer_Release(&out.buf);
    PyBuffer_Release(&base.buf);
    return PyBool_FromLong(nan);
}

static PyObject *py_ties(PyObject *self, PyObject *args) {
    PyObject *o_out, *o_base, *o_ex;
    int out_code, base_code, normalize, has_lam;
    Py_ssize_t n, k;
    double lam;
    Input out = {0}, base = {0};
    if (!PyArg_ParseTuple(args, "OiOiOnppd", &o_out, &out_code, &o_base, &base_code, &o_ex, &n,
                          &normalize, &has_lam, &lam))
        return NULL;
    if (parse_io(o_out, out_code, o_base, base_code, n, &out, &base) < 0) return NULL;
    Input *ex = parse_experts(o_ex, n, &k);
    float *w = ex && k ? PyMem_Malloc((size_t)k * TILE * sizeof(float)) : NULL;
    if (!ex || !k || !w) {
        if (ex && k && !w) PyErr_NoMemory();
        if (ex && !k) PyErr_SetString(PyExc_ValueError, "ties needs at least one expert");
        if (ex) { release(ex, k); PyMem_Free(ex); }
        PyBuffer_Release(&out.buf);
        PyBuffer_Release(&base.buf);
        return NULL;
    }
    int nan;
    Py_BEGIN_ALLOW_THREADS
    nan = ties_run(&out, &base, ex, k, n, normalize, has_lam, (float)lam, w);
    Py_END_ALLOW_THREADS
    PyMem_Free(w);
    release(ex, k);
    PyMem_Free(ex);
    PyBuffer_Release(&out.buf);
    PyBuffer_Release(&base.buf);
    return PyBool_FromLong(nan);
}

/* out = |decode(raw) - decode(base)| (no base: |decode(raw)|), as float32: the |delta| that
 * catalog/scan.py's first pass computes with numpy (decode, subtract, abs). */
CLONES static void abs_delta_run(float *out, const void *raw, int code, const void *base,
                                 int base_code, Py_ssize_t n) {
    float b[TILE];
    for (Py_ssize_t at = 0; at < n; at += TILE) {
        const Py_ssize_t m = n - at < TILE ? n - at : TILE;
        float *o = out + at;
        decode(raw, code, at, m, o);
        if (base) {
            decode(base, base_code, at, m, b);
            for (Py_ssize_t i = 0; i < m; i++) o[i] = o[i] - b[i];
        }
        for (Py_ssize_t i = 0; i < m; i++) o[i] = __builtin_fabsf(o[i]);
    }
}

static PyObject *py_abs_delta(PyObject *self, PyObject *args) {
    PyObject *o_out, *o_raw, *o_base;
    int code, base_code;
    Py_ssize_t n;
    Input out = {0}, raw = {0}, base = {0};
    if (!PyArg_ParseTuple(args, "OOiOin", &o_out, &o_raw, &code, &o_base, &base_code, &n))
        return NULL;
    if (parse_io(o_out, 0, o_raw, code, n, &out, &raw) < 0) return NULL;
    if (o_base != Py_None && get_buffer(o_base, &base.buf, base_code, n, 0) < 0) {
        PyBuffer_Release(&out.buf);
        PyBuffer_Release(&raw.buf);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    abs_delta_run(out.buf.buf, raw.buf.buf, code, o_base != Py_None ? base.buf.buf : NULL,
                  base_code, n);
    Py_END_ALLOW_THREADS
    if (base.buf.obj) PyBuffer_Release(&base.buf);
    PyBuffer_Release(&out.buf);
    PyBuffer_Release(&raw.buf);
    Py_RETURN_NONE;
}

/* One pass over a block's float32 |delta| (catalog/stats.py's block statistics, defined in
 * mergepipe/core/delta_kernels.py, whose numpy twin gives the same bits), tile by tile:
 *  - sums: entry i (|bits|, as float32, widened to float64) goes to lane i mod 8; each lane adds
 *    its entries and their float64 squares (exact) in index order from +0.0; l1 and the sum of
 *    squares are ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)) of the lanes.
 *  - top: the largest |bits| (>= 0x7F800000: an Inf or a NaN).
 *  - counts (2**16 int64, optional): counts[key] += 1, key = (|bits| >> 16) << 1, plus 1 when
 *    the lower 16 bits are not all zero (the level-0 threshold histogram);
 *  - mixed (int32, one per entry, optional): the |bits| of those "mixed" entries, in order.
 * Returns how many entries are mixed (0 without counts). */
typedef struct { double s[8], q[8]; uint32_t top; } Sums;

CLONES static Py_ssize_t stats_run(const uint32_t *bits, Py_ssize_t n, Sums *acc, int64_t *c,
                                   int32_t *mixed) {
    Py_ssize_t k = 0;
    double s[8] = {0}, q[8] = {0};
    uint32_t top = 0;
    for (Py_ssize_t at = 0; at < n; at += TILE) {  /* TILE is a multiple of 8: lanes stay i % 8 */
        const Py_ssize_t m = n - at < TILE ? n - at : TILE;
        const uint32_t *u = bits + at;
        Py_ssize_t i = 0;
        for (; i + 8 <= m; i += 8)
            for (int j = 0; j < 8; j++) {
                const double v = (double)bits_f32(u[i + j] & 0x7FFFFFFFu);
                s[j] = s[j] + v;
                q[j] = q[j] + v * v;
            }
        for (int j = 0; i + j < m; j++) {  /* the last tile's tail: lanes 0.. as always */
            const double v = (double)bits_f32(u[i + j] & 0x7FFFFFFFu);
            s[j] = s[j] + v;
            q[j] = q[j] + v * v;
        }
        for (Py_ssize_t t = 0; t < m; t++) {
            const uint32_t a = u[t] & 0x7FFFFFFFu;
            top = a > top ? a : top;
        }
        if (!c) continue;
        for (Py_ssize_t t = 0; t < m; t++) {
            const uint32_t a = u[t] & 0x7FFFFFFFu;
            const uint32_t low = (a & 0xFFFFu) != 0;
            c[((a >> 16) << 1) | low]++;
            if (mixed) mixed[k] = (int32_t)a;  /* branch-free: written always, kept when mixed */
            k += low;
        }
    }
    memcpy(acc->s, s, sizeof s);
    memcpy(acc->q, q, sizeof q);
    acc->top = top;
    return k;
}

static double lanes_total(const double *x) {
    return ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
}

static PyObject *py_stats(PyObject *self, PyObject *args) {
    PyObject *o_a, *o_counts = Py_None, *o_mixed = Py_None;
    Py_buffer a, counts = {0}, mixed = {0};
    if (!PyArg_ParseTuple(args, "O|OO", &o_a, &o_counts, &o_mixed)) return NULL;
    if (PyObject_GetBuffer(o_a, &a, PyBUF_SIMPLE) < 0) return NULL;
    int bad = a.len % 4 != 0;
    if (!bad && o_counts != Py_None) {
        if (PyObject_GetBuffer(o_counts, &counts, PyBUF_WRITABLE) < 0) goto fail;
        bad = counts.len != (Py_ssize_t)(sizeof(int64_t) << 16);
    }
    if (!bad && o_mixed != Py_None) {
        if (PyObject_GetBuffer(o_mixed, &mixed, PyBUF_WRITABLE) < 0) goto fail;
        bad = mixed.len < a.len || !counts.obj;
    }
    if (bad) {
        PyErr_SetString(PyExc_ValueError,
                        "stats(float32 buffer[, 2**16 int64 counts[, int32 mixed of n]])");
        goto fail;
    }
    Sums acc;
    Py_ssize_t k;
    Py_BEGIN_ALLOW_THREADS
    k = stats_run(a.buf, a.len / 4, &acc, counts.obj ? counts.buf : NULL,
                  mixed.obj ? mixed.buf : NULL);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&a);
    if (counts.obj) PyBuffer_Release(&counts);
    if (mixed.obj) PyBuffer_Release(&mixed);
    return Py_BuildValue("ddkn", lanes_total(acc.s), lanes_total(acc.q),
                         (unsigned long)acc.top, k);
fail:
    PyBuffer_Release(&a);
    if (counts.obj) PyBuffer_Release(&counts);
    if (mixed.obj) PyBuffer_Release(&mixed);
    return NULL;
}

/* Test hook: the keyed draws of ties dense (1) or one by one (0); returns the previous mode. */
static PyObject *py_dense_draws(PyObject *self, PyObject *arg) {
    const int was = dense_draws, on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    dense_draws = on;
    return PyBool_FromLong(was);
}

static PyMethodDef methods[] = {
    {"abs_delta", py_abs_delta, METH_VARARGS,
     "abs_delta(out_f32, raw, code, base_or_None, base_code, n)"},
    {"stats", py_stats, METH_VARARGS,
     "stats(abs_f32[, counts_int64_65536[, mixed_int32]]) -> (l1, sum_sq, top_bits, n_mixed)"},
    {"linear", py_linear, METH_VARARGS,
     "linear(out, out_code, base, base_code, experts, n, has_div, div, has_lam, lam) -> nan"},
    {"dense_draws", py_dense_draws, METH_O,
     "dense_draws(on) -> previous: TIES's keyed draws for every entry, or tie by tie"},
    {"ties", py_ties, METH_VARARGS,
     "ties(out, out_code, base, base_code, experts, n, normalize, has_lam, lam) -> nan"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fused",
                                    "Fused block kernels (see core/operators/fused.py).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__fused(void) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    dense_draws = __builtin_cpu_supports("x86-64-v4");
#endif
    return PyModule_Create(&module);
}
