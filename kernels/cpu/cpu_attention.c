/* cpu_attention.c - causal multi-head attention on the CPU with flash-attention's tiling.
 *
 * What it computes (kernels/backend_ops.h): per (batch, head), out = softmax(q k^T / sqrt(hs),
 * causal) v, reading q, k, v straight out of the (B,T,3C) qkv buffer. What it keeps for the
 * backward is the log-sum-exp of every query row's scaled scores, (B,NH,T) floats: O(T) per
 * head instead of the (T,T) probabilities. Nothing (T,T)-sized exists at any time, in forward or
 * backward; the scratch is O(T*hs) per head (the packed keys and values) plus fixed tiles.
 *
 * Forward (FlashAttention-2's loop order): a tile of BQ = 32 queries against tiles of BK = 32
 * keys up to the diagonal (32 wastes less on the diagonal tiles than 64 and measured the same
 * or better at T = 128 and 1024). Per key tile: the scores S (BK x BQ) = K_tile Q_tile^T, the
 * causal mask on the diagonal tile, the online softmax (the running row maximum m and sum l; the
 * output so far is rescaled by exp(m_old - m_new)), then O += P V_tile. At the end of the query
 * tile O /= l and lse = m + log(l).
 * Backward: per query tile, the scores are recomputed tile by tile from the saved lse
 * (P = exp(S - lse), exact, no running maximum), dP = dO V^T likewise; the row sums
 * D = sum_j P dP (= rowsum(dO * O)) need every key tile of the row first, so P and dP of the
 * query tile's keys are kept in a strip of BQ x T floats (O(T) per head, two of them), then
 * dS = P (dP - D) scale gives dV += P^T dO, dK += dS^T Q and dQ += dS K (P renormalised by its
 * recomputed row sum first: see head_bwd).
 *
 * Why not sgemm per tile (as the previous kernel did per block of 64 query rows): the products
 * are small (64 x 64 x hs with hs = 32 or 64) and OpenBLAS reaches only 0.3-0.6x of its large-
 * product rate on them, and the softmax between the GEMMs went through memory (the (T,T)
 * matrix of a head is 4 MiB at T = 1024). Here every product is a register-blocked
 * micro-kernel written with GCC vector extensions (16 floats per vector) and the softmax works
 * on the tile while it is in L1:
 *   - layout: vectors run along the QUERIES of the tile (the scores tile is stored transposed,
 *     key-major: st[j][i]), so the softmax's maximum and sums over keys are element-wise
 *     operations between vectors (no horizontal reduction), and the per-query rescale of O is a
 *     vector multiply (O is kept transposed too, ot[d][i]);
 *   - the three products of the forward and the five of the backward are three micro-kernels:
 *     A (scores-like): st[j][i] = sum_d x[j][d] yt[d][i]   (S = K Q^T, dP = V dO^T)
 *     B (output-like): ot[d][i] += sum_j x[j][d] st[j][i]  (O += V^T P, dQ^T += K^T dS)
 *     C (key-side):    y[j][d] += sum_i st[j][i] z[i][d]   (dV += P^T dO, dK += dS^T Q), this
 *                      one vectorised along d (rows padded to 16 floats);
 *   - keys and values of the head are first copied to contiguous (T, hs) buffers: in the qkv
 *     layout consecutive rows are 3C floats apart, which maps a tile's rows onto a handful of
 *     L1 sets (3C*4 bytes = 9216 for C = 768: 4 sets of 64), and the micro-kernels re-read
 *     them; the copy costs T*hs per head against T*T*hs of work.
 * exp is evaluated as 2^x on scores pre-multiplied by log2(e) (one FMA less per element than
 * exp), with Cephes' degree-6 polynomial (relative error about 2e-7), 0 for x < -126 so that
 * masked entries are exactly zero and causality holds bit for bit.
 *
 * Each per-head routine is compiled three times: for x86-64-v4 (AVX-512: 32 vector registers,
 * register blocks of 8 rows x 2 vectors, 16x16 transposes by shuffles), x86-64-v3 (AVX2: a
 * 16-float vector is two registers, so 2 x 2) and the baseline, picked at run time by the CPU's
 * features (DTRAIN_CPU_ATTN_ISA can force a lower one: the tests run all three). Results are
 * deterministic on a machine and depend only on the head's own data and T (not on B, NH or the
 * other heads), so
 * every parallel layout computes the same bits; two machines that run different variants may
 * differ in the last bits, as cpu.h says of the other clones. Accuracy against float64 (tests/
 * test_kernels.c attention_tiles): output and lse within 1e-6 relative, gradients within 1e-5,
 * as the sgemm kernel it replaces.
 *
 * Measured (docs/BENCHMARKS.md, `dtrain bench kernels`): see there; the profiler reports the
 * micro-kernels' time as the op's GEMM time and the packing, masking and softmax under
 * attention_softmax_fwd/bwd; FLOPs are those executed (2*nk*nq*hs per product per tile pair of
 * nk keys and nq real queries, diagonal tiles whole; backward's five products include the
 * recomputation of S, as FlashAttention counts it).
 *
 * Single-threaded: the backend's `threads` speeds up the GEMMs of matmul and conv (OpenBLAS),
 * not this loop over heads.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/env.h"
#include "common/log.h"
#include "common/util.h"
#include "kernels/cpu/cpu.h"

DT_CPU_OPTIMIZE

/* 64-byte vectors passed and returned by value between this file's static (inlined) helpers:
 * GCC warns that their ABI differs with and without AVX-512, which matters only for functions
 * called across objects; none of these is. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#define VL 16        /* floats per vector */
#define BQ 32        /* queries per tile */
#define NQ (BQ / VL) /* vectors per tile row */
#define BK 32        /* keys per tile (== BQ: key tiles start on query tiles' boundaries) */
_Static_assert(NQ == 2 && BK == BQ, "the diagonal tile's halves (tile_a, tile_b) assume two query vectors");
#define LOG2E 1.44269504088896341f
#define LN2 0.69314718055994531f

#define INLINE static inline __attribute__((always_inline))

typedef float vf __attribute__((vector_size(64)));               /* aligned: scratch */
typedef float vfu __attribute__((vector_size(64), aligned(4)));  /* unaligned: any float* */
typedef int32_t vi __attribute__((vector_size(64)));

INLINE vf splat(float x) { return (vf){0} + x; }
INLINE vf sel(vi m, vf a, vf b) { return (vf)((m & (vi)a) | (~m & (vi)b)); }
/* Element-wise maximum that keeps a NaN of a (a > b is false for NaN: b is kept only when a is
 * a number below it). */
INLINE vf vmax_keep(vf a, vf b) { return sel(a < b, b, a); }

/* 2^x, element-wise; exactly 0 for x < -126 (and -inf); NaN stays NaN. */
INLINE vf vexp2(vf x)
{
    const vi dead = x < -126.0f;
    x = sel(dead, splat(-126.0f), x);
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    vf n = (x + magic) - magic;
    vf f = x - n; /* [-0.5, 0.5] */
    vf p = splat(1.535336188319500e-4f);
    p = p * f + 1.339887440266574e-3f;
    p = p * f + 9.618437357674640e-3f;
    p = p * f + 5.550332471162809e-2f;
    p = p * f + 2.402264791363012e-1f;
    p = p * f + 6.931472028550421e-1f;
    p = p * f + 1.0f;
    vi e = (__builtin_convertvector(n, vi) + 127) << 23;
    return (vf)((vi)(p * (vf)e) & ~dead);
}

/* ---- micro-kernels ------------------------------------------------------------------------ */
/* R (a compile-time constant once inlined) rows of the register block; RMAX bounds it. */
#define RMAX 8

/* A: st[j][i] = sum_d x[j][d] yt[d][i] for the R key rows j of x (row stride ldx) and the NQ
 * vectors of queries; yt is (hs, BQ). */
INLINE void mk_a(vf *restrict st, const float *restrict x, int ldx, int hs, const vf *restrict yt,
                 const int R, const int B0)
{
    vf acc[RMAX][NQ];
    for (int a = 0; a < R; a++)
        for (int b = B0; b < NQ; b++)
            acc[a][b] = splat(0.0f);
    for (int d = 0; d < hs; d++) {
        const vf *y = yt + (size_t)d * NQ;
        for (int a = 0; a < R; a++) {
            const float xa = x[(size_t)a * ldx + d];
            for (int b = B0; b < NQ; b++)
                acc[a][b] += xa * y[b];
        }
    }
    for (int a = 0; a < R; a++)
        for (int b = B0; b < NQ; b++)
            st[(size_t)a * NQ + b] = acc[a][b];
}

/* Key rows [j0, nk) of the tile; vectors b < B0 of st are left alone (the diagonal tile's keys
 * that come after all their queries: see skip_rows). */
INLINE void tile_a_from(vf *st, const float *x, int ldx, int hs, int j0, int nk, const vf *yt,
                        const int R, const int B0)
{
    int j = j0;
    for (; j + R <= nk; j += R)
        mk_a(st + (size_t)j * NQ, x + (size_t)j * ldx, ldx, hs, yt, R, B0);
    for (; j < nk; j++)
        mk_a(st + (size_t)j * NQ, x + (size_t)j * ldx, ldx, hs, yt, 1, B0);
}

/* The whole tile, or on the diagonal (diag: key tile c0 == r0) the first VL keys against every
 * query vector and the rest against the second only: key c0+j >= r0+VL comes after every query
 * of vector 0, whose scores there are all masked, so they are neither computed nor used
 * (st[j][0] for j >= VL stays as it was; mask_tile and the softmax write it as 0). */
INLINE void tile_a(vf *st, const float *x, int ldx, int hs, int nk, const vf *yt, const int R,
                   bool diag)
{
    if (diag && nk > VL) {
        tile_a_from(st, x, ldx, hs, 0, VL, yt, R, 0);
        tile_a_from(st, x, ldx, hs, VL, nk, yt, R, 1);
    } else
        tile_a_from(st, x, ldx, hs, 0, nk, yt, R, 0);
}

/* B: ot[d][i] = ot[d][i] * alpha[i] + sum_j x[j][d] st[j][i] for R columns d of x (nk rows,
 * stride ldx); alpha NULL = 1. */
INLINE void mk_b(vf *restrict ot, const vf *restrict alpha, const float *restrict x, int ldx,
                 int nk, const vf *restrict st, const int R, int j1)
{
    vf acc[RMAX][NQ];
    for (int a = 0; a < R; a++)
        for (int b = 0; b < NQ; b++)
            acc[a][b] = alpha ? ot[(size_t)a * NQ + b] * alpha[b] : ot[(size_t)a * NQ + b];
    for (int j = 0; j < j1; j++) {
        const vf *p = st + (size_t)j * NQ;
        const float *xr = x + (size_t)j * ldx;
        for (int a = 0; a < R; a++) {
            const float xa = xr[a];
            for (int b = 0; b < NQ; b++)
                acc[a][b] += xa * p[b];
        }
    }
    for (int j = j1; j < nk; j++) { /* keys after every query of vector 0: vector 1 only */
        const vf *p = st + (size_t)j * NQ;
        const float *xr = x + (size_t)j * ldx;
        for (int a = 0; a < R; a++) {
            const float xa = xr[a];
            for (int b = 1; b < NQ; b++)
                acc[a][b] += xa * p[b];
        }
    }
    for (int a = 0; a < R; a++)
        for (int b = 0; b < NQ; b++)
            ot[(size_t)a * NQ + b] = acc[a][b];
}

/* diag: as tile_a's (keys from VL on contribute to the second query vector only). */
INLINE void tile_b(vf *ot, const vf *alpha, const float *x, int ldx, int hs, int nk, const vf *st,
                   const int R, bool diag)
{
    const int j1 = diag ? DT_MIN(nk, VL) : nk;
    int d = 0;
    for (; d + R <= hs; d += R)
        mk_b(ot + (size_t)d * NQ, alpha, x + d, ldx, nk, st, R, j1);
    for (; d < hs; d++)
        mk_b(ot + (size_t)d * NQ, alpha, x + d, ldx, nk, st, 1, j1);
}

/* C: y[j][:] += sum_{i < nq} st[j][i] z[i][:] for R key rows j and NV vectors of d; y and z
 * rows are ld floats apart (a multiple of VL), st rows BQ. */
INLINE void mk_c(float *restrict y, const float *restrict st, const float *restrict z, int ld,
                 int i0, int nq, const int R, const int NV)
{
    vf acc[RMAX][4];
    for (int a = 0; a < R; a++)
        for (int v = 0; v < NV; v++)
            acc[a][v] = *(const vf *)(y + (size_t)a * ld + v * VL);
    for (int i = i0; i < nq; i++) {
        vf zv[4];
        for (int v = 0; v < NV; v++)
            zv[v] = *(const vf *)(z + (size_t)i * ld + v * VL);
        for (int a = 0; a < R; a++) {
            const float pa = st[(size_t)a * BQ + i];
            for (int v = 0; v < NV; v++)
                acc[a][v] += pa * zv[v];
        }
    }
    for (int a = 0; a < R; a++)
        for (int v = 0; v < NV; v++)
            *(vf *)(y + (size_t)a * ld + v * VL) = acc[a][v];
}

/* Key rows [j0, nk) against queries [i0, nq). */
INLINE void tile_c_nv(float *y, const float *st, const float *z, int ld, int j0, int nk, int i0,
                      int nq, const int R, const int NV)
{
    int j = j0;
    for (; j + R <= nk; j += R)
        mk_c(y + (size_t)j * ld, st + (size_t)j * BQ, z, ld, i0, nq, R, NV);
    for (; j < nk; j++)
        mk_c(y + (size_t)j * ld, st + (size_t)j * BQ, z, ld, i0, nq, 1, NV);
}

INLINE void tile_c_rows(float *y, const float *st, const float *z, int ld, int j0, int nk, int i0,
                        int nq, const bool wide)
{
    for (int d0 = 0; d0 < ld; d0 += 4 * VL) {
        int nv = DT_MIN(4, (ld - d0) / VL);
        float *yd = y + d0;
        const float *zd = z + d0;
        if (nv == 4)
            tile_c_nv(yd, st, zd, ld, j0, nk, i0, nq, wide ? 4 : 1, 4);
        else if (nv == 3)
            tile_c_nv(yd, st, zd, ld, j0, nk, i0, nq, wide ? 4 : 1, 3);
        else if (nv == 2)
            tile_c_nv(yd, st, zd, ld, j0, nk, i0, nq, wide ? 8 : 2, 2);
        else
            tile_c_nv(yd, st, zd, ld, j0, nk, i0, nq, wide ? 8 : 4, 1);
    }
}

/* y (nk, ld) += st^T-weighted rows of z (nq, ld): the columns in chunks of up to 4 vectors.
 * diag: as tile_a's (key rows from VL on against the queries from VL on only). */
INLINE void tile_c(float *y, const float *st, const float *z, int ld, int nk, int nq,
                   const bool wide, bool diag)
{
    if (diag && nk > VL) {
        tile_c_rows(y, st, z, ld, 0, VL, 0, nq, wide);
        tile_c_rows(y, st, z, ld, VL, nk, VL, nq, wide);
    } else
        tile_c_rows(y, st, z, ld, 0, nk, 0, nq, wide);
}

/* ---- tile helpers ------------------------------------------------------------------------- */

/* r (16 vectors of 16) transposed in place: four rounds of two-input shuffles (vpermt2ps on
 * AVX-512), 64 in all for 256 floats, against one scalar load and store per float. */
static const vi tr_lo[4] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
    {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
    {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
    {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30},
};
static const vi tr_hi[4] = {
    {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31},
    {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31},
    {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
    {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31},
};

INLINE void tr16(vf r[VL])
{
    for (int k = 0, m = 8; k < 4; k++, m >>= 1)
        for (int i = 0; i < VL; i++)
            if (!(i & m)) {
                vf a = r[i], b = r[i + m];
                r[i] = __builtin_shuffle(a, b, tr_lo[k]);
                r[i + m] = __builtin_shuffle(a, b, tr_hi[k]);
            }
}

/* yt (hs, BQ) = c * x[0 .. nq) transposed (x rows ldx apart), queries nq.. zero. wide: 16 x 16
 * blocks through tr16 (the head sizes that are multiples of 16), else one float at a time. */
INLINE void pack_t(vf *yt, const float *x, int ldx, int hs, int nq, float c, const bool wide)
{
    int d0 = 0;
    if (wide)
        for (; d0 + VL <= hs; d0 += VL)
            for (int b = 0; b < NQ; b++) {
                vf r[VL];
                for (int z = 0; z < VL; z++) {
                    int i = b * VL + z;
                    r[z] = i < nq ? (vf) * (const vfu *)(x + (size_t)i * ldx + d0) : splat(0.0f);
                }
                tr16(r);
                for (int z = 0; z < VL; z++)
                    yt[(size_t)(d0 + z) * NQ + b] = r[z] * c;
            }
    float *o = (float *)yt;
    for (int d = d0; d < hs; d++) {
        float *od = o + (size_t)d * BQ;
        const float *xd = x + d;
        for (int i = 0; i < nq; i++)
            od[i] = c * xd[(size_t)i * ldx];
        for (int i = nq; i < BQ; i++)
            od[i] = 0.0f;
    }
}

/* The other way: rows i < nq of y (ldy apart) get yt[d][i] (hs, BQ) transposed, divided by
 * div[i] (div != NULL: the forward's row sums; then y is overwritten) or added (div == NULL). */
INLINE void unpack_t(float *y, int ldy, const vf *yt, int hs, int nq, const float *div,
                     const bool wide)
{
    int d0 = 0;
    if (wide)
        for (; d0 + VL <= hs; d0 += VL)
            for (int b = 0; b < NQ && b * VL < nq; b++) {
                vf r[VL];
                for (int z = 0; z < VL; z++)
                    r[z] = yt[(size_t)(d0 + z) * NQ + b];
                tr16(r);
                for (int z = 0; z < VL && b * VL + z < nq; z++) {
                    vfu *dst = (vfu *)(y + (size_t)(b * VL + z) * ldy + d0);
                    *dst = div ? r[z] / div[b * VL + z] : *dst + r[z];
                }
            }
    const float *t = (const float *)yt;
    for (int i = 0; i < nq; i++) {
        float *yr = y + (size_t)i * ldy;
        for (int d = d0; d < hs; d++)
            yr[d] = div ? t[(size_t)d * BQ + i] / div[i] : yr[d] + t[(size_t)d * BQ + i];
    }
}

/* Rows of x (ldx apart) into dst (ld apart, hs floats each, zero up to ld). */
INLINE void pack_rows(float *dst, int ld, const float *x, int ldx, int hs, int n)
{
    for (int i = 0; i < n; i++) {
        memcpy(dst + (size_t)i * ld, x + (size_t)i * ldx, sizeof(float) * (size_t)hs);
        if (ld > hs)
            memset(dst + (size_t)i * ld + hs, 0, sizeof(float) * (size_t)(ld - hs));
    }
}

/* The causal mask of a key tile [c0, c0+nk) against queries [r0, r0+BQ): st[j][i] = -inf where
 * key c0+j comes after query r0+i. */
INLINE void mask_tile(vf *st, int c0, int nk, int r0)
{
    vf iota;
    for (int z = 0; z < VL; z++)
        iota[z] = (float)z;
    for (int j = 0; j < nk; j++) {
        const float key = (float)(c0 + j);
        for (int b = 0; b < NQ; b++) {
            vf q = iota + (float)(r0 + b * VL);
            st[(size_t)j * NQ + b] = sel(q < key, splat(-INFINITY), st[(size_t)j * NQ + b]);
        }
    }
}

/* Bytes between the 64-byte aligned pieces of the scratch. */
static size_t rup(size_t n) { return (n + VL - 1) / VL * VL; }

/* Whether the rows of a key tile, ld floats apart, crowd the L1 data cache's sets (64 sets of
 * 64-byte lines): more than 4 of a tile's lines in one set, of the 12 ways the scores, queries
 * and output tiles share. qkv rows are 3C floats apart: C = 768 (9216 bytes) puts 32 rows of a
 * head into 4 sets, 8 lines each, and copying K and V contiguous first pays (0.33 against 0.43 s
 * at T = 256); C = 128 (1536 bytes) spreads them over 8 sets, 4 lines each, and the copy only
 * costs (0.95 against 1.05 s for gpt-tiny's forward). */
static bool rows_crowd_l1(int ld, int hs)
{
    int count[64] = {0}, worst = 0;
    const size_t lines = ((size_t)hs * sizeof(float) + 63) / 64;
    for (size_t r = 0; r < BK; r++)
        for (size_t k = 0; k < lines; k++) {
            int set = (int)((r * (size_t)ld * sizeof(float) / 64 + k) % 64);
            worst = ++count[set] > worst ? count[set] : worst;
        }
    return worst > 4;
}

/* ---- forward ------------------------------------------------------------------------------ */

/* Scratch of one head's forward, in floats. */
static size_t fwd_scratch(int T, int hs)
{
    return 2 * rup((size_t)T * hs) + 2 * (size_t)hs * BQ + (size_t)BK * BQ;
}

typedef struct att_head {
    const float *q, *k, *v; /* (T,hs), rows ld apart */
    int ld, T, hs;
    float scale;
    double *t_soft;         /* profiler: seconds outside the micro-kernels (NULL: off) */
    const dt_cpu *c;
} att_head;

/* One head: out (T,hs) rows ldo apart, lse (T). */
INLINE void head_fwd(const att_head *h, float *out, int ldo, float *lse, float *scr,
                     const bool wide)
{
    const int T = h->T, hs = h->hs;
    const float cq = h->scale * LOG2E;
    float *Kp = scr, *Vp = Kp + rup((size_t)T * hs);
    vf *QT = (vf *)(Vp + rup((size_t)T * hs)), *OT = QT + (size_t)hs * NQ;
    vf *ST = OT + (size_t)hs * NQ;
    double t0 = h->t_soft ? dt_cpu_prof_now(h->c) : 0, tk = 0;
    /* keys and values contiguous when their rows would crowd the L1 sets, else in place */
    const bool pack = rows_crowd_l1(h->ld, hs);
    const float *Ks = pack ? Kp : h->k, *Vs = pack ? Vp : h->v;
    const int ldk = pack ? hs : h->ld;
    if (pack) {
        pack_rows(Kp, hs, h->k, h->ld, hs, T);
        pack_rows(Vp, hs, h->v, h->ld, hs, T);
    }
    for (int r0 = 0; r0 < T; r0 += BQ) {
        const int nq = DT_MIN(BQ, T - r0), r1 = r0 + nq;
        pack_t(QT, h->q + (size_t)r0 * h->ld, h->ld, hs, nq, cq, wide);
        vf m[NQ], l[NQ], alpha[NQ];
        for (int b = 0; b < NQ; b++) {
            m[b] = splat(-INFINITY);
            l[b] = splat(0.0f);
        }
        memset(OT, 0, sizeof(vf) * (size_t)hs * NQ);
        for (int c0 = 0; c0 < r1; c0 += BK) {
            const int nk = DT_MIN(BK, r1 - c0);
            const bool diag = c0 == r0; /* the one tile the causal mask cuts */
            double t1 = h->t_soft ? dt_cpu_prof_now(h->c) : 0;
            tile_a(ST, Ks + (size_t)c0 * ldk, ldk, hs, nk, QT, wide ? 8 : 2, diag);
            double t2 = h->t_soft ? dt_cpu_prof_now(h->c) : 0;
            if (diag)
                mask_tile(ST, c0, nk, r0);
            for (int b = 0; b < NQ; b++) { /* online softmax, element-wise over the queries */
                const int kb = diag && b == 0 ? DT_MIN(nk, VL) : nk; /* keys not all masked */
                vf mx = m[b];
                for (int j = 0; j < kb; j++)
                    mx = vmax_keep(ST[(size_t)j * NQ + b], mx);
                alpha[b] = vexp2(m[b] - mx);
                vf s = splat(0.0f);
                for (int j = 0; j < kb; j++) {
                    vf e = vexp2(ST[(size_t)j * NQ + b] - mx);
                    ST[(size_t)j * NQ + b] = e;
                    s += e;
                }
                l[b] = l[b] * alpha[b] + s;
                m[b] = mx;
            }
            double t3 = h->t_soft ? dt_cpu_prof_now(h->c) : 0;
            tile_b(OT, alpha, Vs + (size_t)c0 * ldk, ldk, hs, nk, ST, wide ? 8 : 2, diag);
            if (h->t_soft)
                tk += (t2 - t1) + (dt_cpu_prof_now(h->c) - t3);
        }
        const float *mf = (const float *)m, *lf = (const float *)l;
        unpack_t(out + (size_t)r0 * ldo, ldo, OT, hs, nq, lf, wide);
        for (int i = 0; i < nq; i++)
            lse[r0 + i] = (mf[i] + log2f(lf[i])) * LN2;
    }
    if (h->t_soft)
        *h->t_soft += dt_cpu_prof_now(h->c) - t0 - tk;
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__OPTIMIZE__)
#define DT_ATT_VARIANTS 1
__attribute__((target("arch=x86-64-v4"))) static void head_fwd_v4(const att_head *h, float *out,
                                                                   int ldo, float *lse, float *scr)
{
    head_fwd(h, out, ldo, lse, scr, true);
}
__attribute__((target("arch=x86-64-v3"))) static void head_fwd_v3(const att_head *h, float *out,
                                                                   int ldo, float *lse, float *scr)
{
    head_fwd(h, out, ldo, lse, scr, false);
}
#endif
static void head_fwd_base(const att_head *h, float *out, int ldo, float *lse, float *scr)
{
    head_fwd(h, out, ldo, lse, scr, false);
}

typedef void (*head_fwd_fn)(const att_head *, float *, int, float *, float *);

static head_fwd_fn fwd_variant(int v)
{
#ifdef DT_ATT_VARIANTS
    if (v == DT_CPU_ATT_V4)
        return head_fwd_v4;
    if (v == DT_CPU_ATT_V3)
        return head_fwd_v3;
#endif
    (void)v;
    return head_fwd_base;
}

/* ---- backward ----------------------------------------------------------------------------- */

static size_t bwd_scratch(int T, int hs)
{
    const size_t hsp = rup((size_t)hs), Tq = rup((size_t)T);
    return 2 * rup((size_t)T * hs) + 2 * (size_t)T * hsp + 2 * Tq * BQ +
           3 * (size_t)hs * BQ + 2 * (size_t)BQ * hsp;
}

/* One head: dq, dk, dv (T,hs) rows ldg apart += gradients from dO (T,hs) rows ldo apart and the
 * forward's lse (T). */
INLINE void head_bwd(const att_head *h, float *dq, float *dk, float *dv, int ldg, const float *dO,
                     int ldo, const float *lse, float *scr, const bool wide)
{
    const int T = h->T, hs = h->hs, hsp = (int)rup((size_t)hs);
    const float cq = h->scale * LOG2E;
    float *Kp = scr, *Vp = Kp + rup((size_t)T * hs);
    float *dKp = Vp + rup((size_t)T * hs), *dVp = dKp + (size_t)T * hsp;
    vf *Ps = (vf *)(dVp + (size_t)T * hsp), *Ds = Ps + rup((size_t)T) * NQ;
    vf *QT = Ds + rup((size_t)T) * NQ, *dOT = QT + (size_t)hs * NQ, *dQT = dOT + (size_t)hs * NQ;
    float *Qr = (float *)(dQT + (size_t)hs * NQ), *dOr = Qr + (size_t)BQ * hsp;
    double t0 = h->t_soft ? dt_cpu_prof_now(h->c) : 0, tk = 0, t1 = 0;
#define KERNEL_BEGIN() (t1 = h->t_soft ? dt_cpu_prof_now(h->c) : 0)
#define KERNEL_END() (tk += h->t_soft ? dt_cpu_prof_now(h->c) - t1 : 0)
    const bool pack = rows_crowd_l1(h->ld, hs);
    const float *Ks = pack ? Kp : h->k, *Vs = pack ? Vp : h->v;
    const int ldk = pack ? hs : h->ld;
    if (pack) {
        pack_rows(Kp, hs, h->k, h->ld, hs, T);
        pack_rows(Vp, hs, h->v, h->ld, hs, T);
    }
    memset(dKp, 0, sizeof(float) * (size_t)T * hsp);
    memset(dVp, 0, sizeof(float) * (size_t)T * hsp);
    for (int r0 = 0; r0 < T; r0 += BQ) {
        const int nq = DT_MIN(BQ, T - r0), r1 = r0 + nq;
        pack_t(QT, h->q + (size_t)r0 * h->ld, h->ld, hs, nq, cq, wide);
        pack_t(dOT, dO + (size_t)r0 * ldo, ldo, hs, nq, 1.0f, wide);
        pack_rows(Qr, hsp, h->q + (size_t)r0 * h->ld, h->ld, hs, nq);
        pack_rows(dOr, hsp, dO + (size_t)r0 * ldo, ldo, hs, nq);
        memset(dQT, 0, sizeof(vf) * (size_t)hs * NQ);
        vf L[NQ], D[NQ], Z[NQ];
        for (int b = 0; b < NQ; b++) {
            for (int z = 0; z < VL; z++) {
                int i = b * VL + z; /* padding queries: P = exp2(s - inf) = 0 */
                L[b][z] = i < nq ? lse[r0 + i] * LOG2E : INFINITY;
            }
            D[b] = splat(0.0f);
            Z[b] = splat(0.0f);
        }
        /* pass 1: P and dP for every key tile of the strip, D = sum_j P dP and Z = sum_j P */
        for (int c0 = 0; c0 < r1; c0 += BK) {
            const int nk = DT_MIN(BK, r1 - c0);
            vf *P = Ps + (size_t)c0 * NQ, *dP = Ds + (size_t)c0 * NQ;
            const bool diag = c0 == r0; /* as in head_fwd */
            KERNEL_BEGIN();
            tile_a(P, Ks + (size_t)c0 * ldk, ldk, hs, nk, QT, wide ? 8 : 2, diag);
            tile_a(dP, Vs + (size_t)c0 * ldk, ldk, hs, nk, dOT, wide ? 8 : 2, diag);
            KERNEL_END();
            if (diag)
                mask_tile(P, c0, nk, r0);
            for (int b = 0; b < NQ; b++) {
                const int kb = diag && b == 0 ? DT_MIN(nk, VL) : nk; /* keys not all masked */
                for (int j = 0; j < kb; j++) {
                    vf p = vexp2(P[(size_t)j * NQ + b] - L[b]);
                    P[(size_t)j * NQ + b] = p;
                    D[b] += p * dP[(size_t)j * NQ + b];
                    Z[b] += p;
                }
            }
        }
        /* The recomputed P sums to 1 only to the rounding of the saved lse (~1e-6); P / Z is
         * normalised to float rounding, which keeps sum_j dS = 0 (the softmax Jacobian's rows)
         * as exact as a stored softmax did: gradients that are zero analytically (the key
         * bias's) stay at rounding noise instead of 1e-6 of the rest, which AdamW would turn into
         * full-size updates. */
        vf iz[NQ];
        for (int b = 0; b < NQ; b++) {
            Z[b] = sel(Z[b] > 0.0f, Z[b], splat(1.0f)); /* padding queries: P = 0 */
            iz[b] = 1.0f / Z[b];
            D[b] *= iz[b];
        }
        /* pass 2: P /= Z, dS = scale P (dP - D), then the three products */
        for (int c0 = 0; c0 < r1; c0 += BK) {
            const int nk = DT_MIN(BK, r1 - c0);
            vf *P = Ps + (size_t)c0 * NQ, *dS = Ds + (size_t)c0 * NQ;
            const bool diag = c0 == r0;
            for (int b = 0; b < NQ; b++) {
                const int kb = diag && b == 0 ? DT_MIN(nk, VL) : nk;
                for (int j = 0; j < kb; j++) {
                    vf p = P[(size_t)j * NQ + b] * iz[b];
                    P[(size_t)j * NQ + b] = p;
                    dS[(size_t)j * NQ + b] = h->scale * p * (dS[(size_t)j * NQ + b] - D[b]);
                }
            }
            KERNEL_BEGIN();
            tile_c(dVp + (size_t)c0 * hsp, (const float *)P, dOr, hsp, nk, nq, wide, diag);
            tile_c(dKp + (size_t)c0 * hsp, (const float *)dS, Qr, hsp, nk, nq, wide, diag);
            tile_b(dQT, NULL, Ks + (size_t)c0 * ldk, ldk, hs, nk, dS, wide ? 8 : 2, diag);
            KERNEL_END();
        }
        unpack_t(dq + (size_t)r0 * ldg, ldg, dQT, hs, nq, NULL, wide);
    }
    for (int j = 0; j < T; j++) {
        float *gk = dk + (size_t)j * ldg, *gv = dv + (size_t)j * ldg;
        const float *sk = dKp + (size_t)j * hsp, *sv = dVp + (size_t)j * hsp;
        for (int d = 0; d < hs; d++) {
            gk[d] += sk[d];
            gv[d] += sv[d];
        }
    }
#undef KERNEL_BEGIN
#undef KERNEL_END
    if (h->t_soft)
        *h->t_soft += dt_cpu_prof_now(h->c) - t0 - tk;
}

typedef void (*head_bwd_fn)(const att_head *, float *, float *, float *, int, const float *, int,
                            const float *, float *);

#ifdef DT_ATT_VARIANTS
__attribute__((target("arch=x86-64-v4"))) static void
head_bwd_v4(const att_head *h, float *dq, float *dk, float *dv, int ldg, const float *dO, int ldo,
            const float *lse, float *scr)
{
    head_bwd(h, dq, dk, dv, ldg, dO, ldo, lse, scr, true);
}
__attribute__((target("arch=x86-64-v3"))) static void
head_bwd_v3(const att_head *h, float *dq, float *dk, float *dv, int ldg, const float *dO, int ldo,
            const float *lse, float *scr)
{
    head_bwd(h, dq, dk, dv, ldg, dO, ldo, lse, scr, false);
}
#endif
static void head_bwd_base(const att_head *h, float *dq, float *dk, float *dv, int ldg,
                          const float *dO, int ldo, const float *lse, float *scr)
{
    head_bwd(h, dq, dk, dv, ldg, dO, ldo, lse, scr, false);
}

static head_bwd_fn bwd_variant(int v)
{
#ifdef DT_ATT_VARIANTS
    if (v == DT_CPU_ATT_V4)
        return head_bwd_v4;
    if (v == DT_CPU_ATT_V3)
        return head_bwd_v3;
#endif
    (void)v;
    return head_bwd_base;
}

/* ---- which variant ------------------------------------------------------------------------ */

static const char *const variant_names[] = {
    [DT_CPU_ATT_BASE] = "base",
    [DT_CPU_ATT_V3] = "v3",
    [DT_CPU_ATT_V4] = "v4",
};

const char *dt_cpu_attention_variant_name(int v)
{
    return v >= 0 && v < (int)DT_ARRAY_LEN(variant_names) ? variant_names[v] : "?";
}

/* The best variant this CPU runs. */
static int variant_auto(void)
{
#ifdef DT_ATT_VARIANTS
    if (__builtin_cpu_supports("x86-64-v4"))
        return DT_CPU_ATT_V4;
    if (__builtin_cpu_supports("x86-64-v3"))
        return DT_CPU_ATT_V3;
#endif
    return DT_CPU_ATT_BASE;
}

int dt_cpu_attention_variant(void)
{
    const char *want = dt_env("DTRAIN_CPU_ATTN_ISA");
    const int best = variant_auto();
    if (!want || !strcmp(want, "auto"))
        return best;
    for (int v = 0; v < (int)DT_ARRAY_LEN(variant_names); v++)
        if (!strcmp(want, variant_names[v])) {
            if (v <= best)
                return v;
            DT_WARN("cpu backend: DTRAIN_CPU_ATTN_ISA=%s: this CPU (or this build) cannot run "
                    "it; using %s",
                    want, variant_names[best]);
            return best;
        }
    DT_WARN("cpu backend: DTRAIN_CPU_ATTN_ISA=%s is not auto, v4, v3 or base; using %s", want,
            variant_names[best]);
    return best;
}

/* ---- the op table's entries --------------------------------------------------------------- */

/* FLOPs of one product over the tile pairs of a head: sum over query tiles of 2*nq*keys*hs. */
static double head_product_flops(int T, int hs)
{
    double f = 0;
    for (int r0 = 0; r0 < T; r0 += BQ) {
        int nq = DT_MIN(BQ, T - r0), keys = r0 + nq;
        f += 2.0 * nq * keys * hs;
    }
    return f;
}

void dt_cpu_attention_sizes(dt_backend *be, int B, int T, int C, int NH, size_t *att,
                            size_t *datt)
{
    (void)be;
    (void)C;
    if (att)
        *att = (size_t)B * NH * T;
    if (datt)
        *datt = 0;
}

/* The instance's variant, chosen on its first call. */
static int variant_of(dt_cpu *c)
{
    if (!c->attn_resolved) {
        c->attn_variant = dt_cpu_attention_variant();
        c->attn_resolved = true;
    }
    return c->attn_variant;
}

static void prof_attn(dt_cpu *c, int op, int soft_op, double t_start, double t_soft,
                      double flops)
{
    double total = dt_cpu_prof_now(c) - t_start;
    c->stats[op].calls++;
    c->stats[op].seconds += total - t_soft;
    c->stats[op].flops += flops;
    c->stats[soft_op].calls++;
    c->stats[soft_op].seconds += t_soft;
}

void dt_cpu_attention_fwd(dt_backend *be, float *out, float *att, const float *qkv, int B, int T,
                          int C, int NH)
{
    dt_cpu *c = dt_cpu_of(be);
    if (B <= 0 || T <= 0 || NH <= 0)
        return;
    const int hs = C / NH, C3 = 3 * C;
    if (!dt_cpu_scratch_reserve(c, fwd_scratch(T, hs))) {
        DT_ERROR("attention_fwd: out of memory for %zu floats of scratch", fwd_scratch(T, hs));
        return;
    }
    const head_fwd_fn fn = fwd_variant(variant_of(c));
    double t_start = dt_cpu_prof_now(c), t_soft = 0;
    att_head h = {.ld = C3, .T = T, .hs = hs, .scale = 1.0f / sqrtf((float)hs),
                  .t_soft = c->prof_on ? &t_soft : NULL, .c = c};
    for (int b = 0; b < B; b++)
        for (int hd = 0; hd < NH; hd++) {
            h.q = qkv + (size_t)b * T * C3 + (size_t)hd * hs;
            h.k = h.q + C;
            h.v = h.q + 2 * C;
            fn(&h, out + (size_t)b * T * C + (size_t)hd * hs, C, att + ((size_t)b * NH + hd) * T,
               c->scratch);
        }
    if (c->prof_on)
        prof_attn(c, DT_CPU_OP_ATTN_FWD, DT_CPU_OP_ATTN_SOFTMAX_FWD, t_start, t_soft,
                  2.0 * B * NH * head_product_flops(T, hs));
}

void dt_cpu_attention_bwd(dt_backend *be, float *dqkv, float *datt, const float *dout,
                          const float *qkv, const float *att, int B, int T, int C, int NH)
{
    (void)datt;
    dt_cpu *c = dt_cpu_of(be);
    if (B <= 0 || T <= 0 || NH <= 0)
        return;
    const int hs = C / NH, C3 = 3 * C;
    if (!dt_cpu_scratch_reserve(c, bwd_scratch(T, hs))) {
        DT_ERROR("attention_bwd: out of memory for %zu floats of scratch", bwd_scratch(T, hs));
        return;
    }
    const head_bwd_fn fn = bwd_variant(variant_of(c));
    double t_start = dt_cpu_prof_now(c), t_soft = 0;
    att_head h = {.ld = C3, .T = T, .hs = hs, .scale = 1.0f / sqrtf((float)hs),
                  .t_soft = c->prof_on ? &t_soft : NULL, .c = c};
    for (int b = 0; b < B; b++)
        for (int hd = 0; hd < NH; hd++) {
            size_t off = (size_t)b * T * C3 + (size_t)hd * hs;
            h.q = qkv + off;
            h.k = h.q + C;
            h.v = h.q + 2 * C;
            float *dq = dqkv + off;
            fn(&h, dq, dq + C, dq + 2 * C, C3, dout + (size_t)b * T * C + (size_t)hd * hs, C,
               att + ((size_t)b * NH + hd) * T, c->scratch);
        }
    if (c->prof_on)
        prof_attn(c, DT_CPU_OP_ATTN_BWD, DT_CPU_OP_ATTN_SOFTMAX_BWD, t_start, t_soft,
                  5.0 * B * NH * head_product_flops(T, hs));
}
