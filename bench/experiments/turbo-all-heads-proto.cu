// A prototype of the decode loop that turbo2's 1.5x needs, timed and checked without ggml's graph: the series'
// loop (0023, 0025, 0028: K scored on int8, V expanded from registers, the lazy maximum) on two mappings of the
// cache to blocks, for the Llama-3-8B shape (head size 128, 8 KV heads, 4 query heads each, one token, turbo2 K
// and V in llama.cpp's layout: a token's 8 KV heads adjacent):
//   per-head   the series' mapping: a block of 8 warps per (KV head, part of the sequence), the warps take turns at
//              16-row steps, each copying its rows with 4-byte cp.async into two buffers of its own
//   all-heads  a block of 8 warps per part of the sequence, warp w on KV head w: each step's 16 tokens of all heads
//              are one contiguous 4608-byte piece of K and one of V, which the block stages with 16-byte cp.async
//              through STAGES buffers (copy-pattern-bench.cu measured this memory side at the streaming rate)
// The loop body is the series' own: this file includes the patched tree's fattn-turbo-mma.cuh and uses its types
// and helpers, so only the staging and the mapping differ. Not the series' parts: the query arrives already rotated
// and rounded to int8 (the host builds the fragments as the kernel's prologue does), there is no sink, soft-cap or
// ALiBi, and every warp writes its own part (the host merges them), so the prologue, the warps' merge and the
// combine kernel are left out.
// Build (from the repository root, with the patched tree that scripts/prepare_h200.py writes):
//   T=.h200/llama.cpp; nvcc -std=c++17 -arch=sm_90a -O3 -DNDEBUG -use_fast_math -extended-lambda \
//       -I $T/ggml/include -I $T/ggml/src -I $T/ggml/src/ggml-cuda -o proto bench/experiments/turbo-all-heads-proto.cu
//   ./proto
// Output: for each mapping, the outputs against a double-precision reference on the dequantized cache at 32768
// tokens (the error is int8 rounding of Q and of the codebook, and f16 weights; "WRONG" above 10%), then microseconds per launch at 262144 and 32768
// tokens, cold (after other memory filled the L2) and warm (back to back).

#include "fattn-turbo-mma.cuh"
#include "bench-timing.cuh"

#include <cmath>
#include <random>
#include <vector>

namespace proto {

constexpr ggml_type TT     = GGML_TYPE_TURBO2_0;
using T2                   = fattn_tmma_type<TT>;
constexpr int D            = 128;
constexpr int G            = 4;                  // query heads per KV head
constexpr int NH           = 8;                  // KV heads
constexpr int NQ           = NH*G;               // query heads
constexpr int NG           = D/T2::QB;           // scale groups per row (2)
constexpr int MTV          = T2::QB/16;          // output tiles per V group (4)
constexpr int NKS          = D/16;               // output tiles (8)
constexpr int ROW          = NG*T2::BS;          // 36 bytes
constexpr int TOKEN        = NH*ROW;             // 288 bytes
constexpr int NWARPS       = 8;
constexpr int ROWS         = FATTN_TMMA_ROWS;    // 16
constexpr int TPITCH       = TOKEN + 16;         // staged token pitch (all-heads): 76 words, so that the 8 rows a
                                                 // load reads start in different banks
constexpr int NPIECE       = ROWS*TOKEN/16;      // 16-byte pieces per side and step (288)
constexpr int PIECES_TOKEN = TOKEN/16;           // 18
constexpr int HPITCH       = 48;                 // staged row pitch (per-head; the series' for 9-word rows)

__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wait_group() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }

// parts: per-head: blockIdx.x*NWARPS + warp (each warp its own), all-heads: blockIdx.x; O_part [part][NQ][D]
// (unnormalized), ml_part [part][NQ] (running maximum, sum of weights)
template <bool ALL_HEADS, int STAGES>
__global__ void __launch_bounds__(NWARPS*WARP_SIZE, 2) decode(
        const char * K, const char * V, const half * mask, const int2 * Qi_g, const float * qmax_g, const float scale,
        const float logit_softcap, const int T, const int per, float * O_part, float2 * ml_part) {
    using namespace ggml_cuda_mma;
    const int lane = threadIdx.x, warp = threadIdx.y, tid = warp*WARP_SIZE + lane;
    const int t = lane % 4, r = lane / 4;
    const int h = ALL_HEADS ? warp : blockIdx.y; // this warp's KV head
    const int part = ALL_HEADS ? blockIdx.x : blockIdx.x*NWARPS + warp;
    const int k_begin = blockIdx.x*per;
    const int k_end = min(k_begin + per, T);

    // staging: all-heads [STAGES][K, V][ROWS*TPITCH]; per-head [warp][2 buffers][K, V][ROWS*HPITCH]
    constexpr int st_bytes = ALL_HEADS ? STAGES*2*ROWS*TPITCH : NWARPS*2*2*ROWS*HPITCH;
    __shared__ __align__(16) char st[st_bytes];

    // the query's int8 fragments and scales, the codebooks (the series' prologue builds the same)
    tile<8, 8, int> Qi[2*NG];
#pragma unroll
    for (int j = 0; j < 2*NG; ++j) {
        const int2 w = Qi_g[(h*2*NG + j)*WARP_SIZE + lane];
        Qi[j].x[0] = w.x;
        Qi[j].x[1] = w.y;
    }
    uint32_t cb_lo, cb_hi, cb_v[4];
    const float step = fattn_tmma_i8_codebook<TT>(cb_lo, cb_hi);
    fattn_tmma_f16_codebook<TT>(cb_v);
    float kq_scale[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        kq_scale[e] = 2*t + e < G ? qmax_g[h*G + 2*t + e]*(scale/127.0f)*step : 0.0f;
    }

    // copies: all-heads, this thread's pieces i = tid, tid + 256 of a step (token i/18, piece i%18); per-head, the
    // series' 16 lanes per row (9 active), two rows per instruction
    const int p0 = tid, p1 = tid + NWARPS*WARP_SIZE;
    const int src0 = (p0/PIECES_TOKEN)*TOKEN + 16*(p0%PIECES_TOKEN), dst0 = (p0/PIECES_TOKEN)*TPITCH + 16*(p0%PIECES_TOKEN);
    const int src1 = (p1/PIECES_TOKEN)*TOKEN + 16*(p1%PIECES_TOKEN), dst1 = (p1/PIECES_TOKEN)*TPITCH + 16*(p1%PIECES_TOKEN);
    const uint32_t st_base = fattn_tmma_smem_address(st);
    const int lw = lane % 16;
    const char * Kh = K + h*ROW;
    const char * Vh = V + h*ROW;
    auto issue_all = [&](const int k0, const int s) { // all-heads: the block's step at token k0 into stage s
        if (k0 < k_end) {
            const char * Ks = K + int64_t(k0)*TOKEN;
            const char * Vs = V + int64_t(k0)*TOKEN;
            const uint32_t dK = st_base + (2*s + 0)*ROWS*TPITCH, dV = st_base + (2*s + 1)*ROWS*TPITCH;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dK + dst0), "l"(Ks + src0) : "memory");
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dV + dst0), "l"(Vs + src0) : "memory");
            if (p1 < NPIECE) {
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dK + dst1), "l"(Ks + src1) : "memory");
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dV + dst1), "l"(Vs + src1) : "memory");
            }
        }
        commit();
    };
    auto issue_head = [&](const int k0, const int b) { // per-head: this warp's step at token k0 into buffer b
        if (k0 < k_end && lw < ROW/4) {
            const uint32_t dK = st_base + ((warp*2 + b)*2 + 0)*ROWS*HPITCH + (lane/16)*HPITCH + 4*lw;
            const uint32_t dV = dK + ROWS*HPITCH;
            const char * sK = Kh + int64_t(k0 + lane/16)*TOKEN + 4*lw;
            const char * sV = Vh + int64_t(k0 + lane/16)*TOKEN + 4*lw;
#pragma unroll
            for (int a = 0; a < ROWS/2; ++a) {
                asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(dK + a*2*HPITCH), "l"(sK + a*2*TOKEN) : "memory");
            }
#pragma unroll
            for (int a = 0; a < ROWS/2; ++a) {
                asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(dV + a*2*HPITCH), "l"(sV + a*2*TOKEN) : "memory");
            }
        }
        commit();
    };
    const auto mask_rows = [&](const int kb) {
        half2 mk = make_half2(0.0f, 0.0f);
        if (kb + r < k_end) {
            mk.x = mask[kb + r];
        }
        if (kb + 8 + r < k_end) {
            mk.y = mask[kb + 8 + r];
        }
        return mk;
    };

    constexpr int stride = ALL_HEADS ? ROWS : NWARPS*ROWS; // from a warp's step to its next
    const int k_first = k_begin + (ALL_HEADS ? 0 : warp*ROWS);
    if constexpr (ALL_HEADS) {
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            issue_all(k_begin + s*ROWS, s);
        }
    } else {
        issue_head(k_first, 0);
    }
    half2 mk_next = mask_rows(k_first);

    tile<16, 8, float> O[NKS];
    float m[2] = {-FLT_MAX/2.0f, -FLT_MAX/2.0f};
    float l[2] = {0.0f, 0.0f};
    int n = 0; // this warp's step count
    for (int k0 = k_first; k0 < k_end; k0 += stride, ++n) {
        const half2 mk_step = mk_next;
        mk_next = mask_rows(k0 + stride);
        const char * stK;
        const char * stV;
        int pitch;
        if constexpr (ALL_HEADS) {
            wait_group<STAGES - 2>();
            __syncthreads(); // this step's pieces are in for every thread; the stage refilled next was consumed
            issue_all(k0 + (STAGES - 1)*ROWS, (n + STAGES - 1) % STAGES);
            stK = st + (2*(n % STAGES) + 0)*ROWS*TPITCH + warp*ROW;
            stV = st + (2*(n % STAGES) + 1)*ROWS*TPITCH + warp*ROW;
            pitch = TPITCH;
        } else {
            issue_head(k0 + stride, (n + 1) % 2);
            wait_group<1>();
            __syncwarp();
            stK = st + ((warp*2 + n % 2)*2 + 0)*ROWS*HPITCH;
            stV = st + ((warp*2 + n % 2)*2 + 1)*ROWS*HPITCH;
            pitch = HPITCH;
        }
        uint32_t wk[2][NG][T2::NW];
        uint32_t wv[2][NG][T2::NW];
        float dk[2][NG];
        float dv[2][NG];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
            for (int g = 0; g < NG; ++g) {
                dk[hh][g] = T2::load_i8(stK + (8*hh + r)*pitch, g, t, wk[hh][g]);
                dv[hh][g] = T2::load_i8(stV + (8*hh + r)*pitch, g, t, wv[hh][g]);
            }
        }
        if constexpr (!ALL_HEADS) {
            __syncwarp(); // the next step's copies overwrite the rows
        }

        // from here on the series' loop body (fattn-turbo-mma.cuh, k_i8 and v_reg)
        float S[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
        for (int g = 0; g < NG; ++g) {
            tile<16, 8, int> C;
#pragma unroll
            for (int kk = 0; kk < 2; ++kk) {
                tile<16, 8, int> A;
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    A.x[hh]     = fattn_tmma_prmt(cb_lo, cb_hi, wk[hh][g][kk]);
                    A.x[2 + hh] = fattn_tmma_prmt(cb_lo, cb_hi, wk[hh][g][kk] >> 16);
                }
                mma(C, A, Qi[2*g + kk]);
            }
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    S[hh][e] += float(C.x[2*hh + e])*dk[hh][g];
                }
            }
        }
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                S[hh][e] *= kq_scale[e];
            }
        }

        float mx[2] = {-FLT_MAX/2.0f, -FLT_MAX/2.0f};
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int  k  = k0 + 8*hh + r;
            const bool in = k < k_end;
            const float mk = __half2float(hh == 0 ? __low2half(mk_step) : __high2half(mk_step));
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float x = S[hh][e];
                if (logit_softcap != 0.0f) {
                    x = logit_softcap*tanhf(x);
                }
                x += mk;
                S[hh][e] = in ? x : -INFINITY;
                mx[e] = fmaxf(mx[e], S[hh][e]);
            }
        }
        if (__any_sync(0xFFFFFFFF, mx[0] > m[0] + FATTN_TMMA_MAX_SLACK || mx[1] > m[1] + FATTN_TMMA_MAX_SLACK)) {
            float f[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
#pragma unroll
                for (int o = 4; o < WARP_SIZE; o *= 2) {
                    mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xFFFFFFFF, mx[e], o, WARP_SIZE));
                }
                const float mnew = fmaxf(m[e], mx[e]);
                f[e] = expf(m[e] - mnew);
                m[e] = mnew;
                l[e] *= f[e];
            }
#pragma unroll
            for (int q = 0; q < NKS; ++q) {
#pragma unroll
                for (int i = 0; i < O[q].ne; ++i) {
                    O[q].x[i] *= f[i % 2];
                }
            }
        }

        float P[2][2];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                P[hh][e] = expf(S[hh][e] - m[e]);
                l[e] += P[hh][e];
            }
        }

#pragma unroll
        for (int g = 0; g < NG; ++g) {
            tile<8, 8, half2> Pb;
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                Pb.x[hh] = ggml_cuda_movmatrix(__floats2half2_rn(P[hh][0]*dv[hh][g], P[hh][1]*dv[hh][g]));
            }
            half2 E[2][2][4];
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    fattn_tmma_expand_v(ggml_cuda_movmatrix(wv[hh][g][j]), cb_v, E[hh][j]);
                }
            }
#pragma unroll
            for (int qq = 0; qq < MTV; ++qq) {
                tile<16, 8, half2> A;
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        A.x[2*hh + j] = E[hh][j][qq];
                    }
                }
                mma(O[g*MTV + qq], A, Pb);
            }
        }
    }

    // this warp's part: the rows' sums, then O and (m, l) of its heads
#pragma unroll
    for (int e = 0; e < 2; ++e) {
#pragma unroll
        for (int o = 4; o < WARP_SIZE; o *= 2) {
            l[e] += __shfl_xor_sync(0xFFFFFFFF, l[e], o, WARP_SIZE);
        }
    }
#pragma unroll
    for (int q = 0; q < NKS; ++q) {
        const int g  = q / MTV;
        const int qq = q % MTV;
#pragma unroll
        for (int i = 0; i < O[q].ne; ++i) {
            const int hd = 2*t + i % 2;
            if (hd < G) {
                O_part[(int64_t(part)*NQ + h*G + hd)*D + g*T2::QB + fattn_tmma_vreg_dim(r, qq, i)] = O[q].x[i];
            }
        }
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        if (r == 0 && 2*t + e < G) {
            ml_part[int64_t(part)*NQ + h*G + 2*t + e] = make_float2(m[e], l[e]);
        }
    }
}

__global__ void levels(float * out) {
    for (int i = 0; i < 4; ++i) {
        out[i] = turbo_level_cuda<4>(i);
    }
}

// the head-dim position of byte n of register hr of k-step kk for lane t (fattn_tmma_i8_pos, on the host)
static int i8_pos(int t, int kk, int hr, int n) {
    return 4*t + 2*hr + n/2 + 32*(n%2) + 16*kk;
}

} // namespace proto

int main() {
    using namespace proto;
    const int nsm = bench_timing::print_device();

    const int Tmax = 262144;
    const size_t bytes = size_t(Tmax)*TOKEN;
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::vector<uint8_t> hK(bytes), hV(bytes);
    for (auto * buf : {&hK, &hV}) {
        for (size_t b = 0; b < bytes; b += T2::BS) { // blocks: a scale in [0.5, 1.5], random indices
            const half d = __float2half(1.0f + 0.5f*uni(rng));
            memcpy(buf->data() + b, &d, sizeof(d));
            for (int i = 2; i < T2::BS; ++i) {
                (*buf)[b + i] = uint8_t(rng());
            }
        }
    }
    std::vector<float> hQ(NQ*D);
    for (auto & x : hQ) { x = uni(rng); }
    std::vector<half> hmask(Tmax, __float2half(0.0f));
    const float scale = 1.0f/sqrtf(float(D));

    // the int8 fragments of Q^T per KV head, as the kernel's prologue builds them
    std::vector<float> qmax(NQ, 0.0f);
    for (int q = 0; q < NQ; ++q) {
        for (int d = 0; d < D; ++d) { qmax[q] = fmaxf(qmax[q], fabsf(hQ[q*D + d])); }
    }
    std::vector<int2> hQi(NH*2*NG*WARP_SIZE);
    for (int h = 0; h < NH; ++h) {
        for (int j = 0; j < 2*NG; ++j) {
            for (int ln = 0; ln < WARP_SIZE; ++ln) {
                int regs[2] = {0, 0};
                const int hd = ln/4;
                for (int hr = 0; hr < 2; ++hr) {
                    uint32_t v = 0;
                    if (hd < G) {
                        const float * Qr = hQ.data() + (h*G + hd)*D + (j/2)*T2::QB;
                        const float qinv = qmax[h*G + hd] > 0.0f ? 127.0f/qmax[h*G + hd] : 0.0f;
                        for (int n = 0; n < 4; ++n) {
                            const int q = int(nearbyintf(Qr[i8_pos(ln % 4, j % 2, hr, n)]*qinv));
                            v |= uint32_t(q & 0xFF) << (8*n);
                        }
                    }
                    regs[hr] = int(v);
                }
                hQi[(h*2*NG + j)*WARP_SIZE + ln] = make_int2(regs[0], regs[1]);
            }
        }
    }

    char *K, *V;
    half * mask;
    int2 * Qi;
    float * dqmax;
    float * O_part;
    float2 * ml_part;
    float * dlev;
    const int max_parts = 2*nsm*NWARPS;
    CHECK(cudaMalloc(&K, bytes));
    CHECK(cudaMalloc(&V, bytes));
    CHECK(cudaMalloc(&mask, Tmax*sizeof(half)));
    CHECK(cudaMalloc(&Qi, hQi.size()*sizeof(int2)));
    CHECK(cudaMalloc(&dqmax, NQ*sizeof(float)));
    CHECK(cudaMalloc(&O_part, size_t(max_parts)*NQ*D*sizeof(float)));
    CHECK(cudaMalloc(&ml_part, size_t(max_parts)*NQ*sizeof(float2)));
    CHECK(cudaMalloc(&dlev, 4*sizeof(float)));
    CHECK(cudaMemcpy(K, hK.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(V, hV.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(mask, hmask.data(), Tmax*sizeof(half), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(Qi, hQi.data(), hQi.size()*sizeof(int2), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dqmax, qmax.data(), NQ*sizeof(float), cudaMemcpyHostToDevice));
    float lev[4];
    levels<<<1, 1>>>(dlev);
    CHECK(cudaMemcpy(lev, dlev, sizeof(lev), cudaMemcpyDeviceToHost));

    const dim3 blk(WARP_SIZE, NWARPS);
    const int nblocks = 2*nsm; // two blocks of 8 warps per SM, as the series
    struct config { const char * name; bool all; };
    // (per-head: grid (parts, NH) with nblocks/NH parts, as the series' launcher picks for this shape)
    auto launch = [&](bool all, int T) {
        if (all) {
            const int per = (T + nblocks*ROWS - 1)/(nblocks*ROWS)*ROWS;
            decode<true, 3><<<nblocks, blk>>>(K, V, mask, Qi, dqmax, scale, 0.0f, T, per, O_part, ml_part);
            return (T + per - 1)/per;
        }
        const int parts = nblocks/NH;
        const int per = (T + parts*NWARPS*ROWS - 1)/(parts*NWARPS*ROWS)*NWARPS*ROWS;
        decode<false, 2><<<dim3(parts, NH), blk>>>(K, V, mask, Qi, dqmax, scale, 0.0f, T, per, O_part, ml_part);
        return parts*NWARPS;
    };

    // correctness at 32768 tokens: merge the parts on the host, against the reference on the dequantized cache
    auto deq = [&](const std::vector<uint8_t> & c, int k, int h, int d) {
        const uint8_t * blk0 = c.data() + size_t(k)*TOKEN + h*ROW + (d/T2::QB)*T2::BS;
        half dh;
        memcpy(&dh, blk0, sizeof(dh));
        const int j = d % T2::QB;
        const int idx = (blk0[2 + j % 16] >> (2*(j/16))) & 3;
        return double(__half2float(dh))*lev[idx];
    };
    const int Tc = 32768;
    std::vector<double> ref(NQ*D, 0.0);
    {
        std::vector<double> s(size_t(G)*Tc);
        std::vector<double> row(D);
        for (int h = 0; h < NH; ++h) {
            double mx[G], l[G];
            for (int g = 0; g < G; ++g) { mx[g] = -1e300; l[g] = 0.0; }
            for (int k = 0; k < Tc; ++k) {
                for (int d = 0; d < D; ++d) { row[d] = deq(hK, k, h, d); }
                for (int g = 0; g < G; ++g) {
                    double acc = 0.0;
                    for (int d = 0; d < D; ++d) { acc += double(hQ[(h*G + g)*D + d])*row[d]; }
                    s[size_t(g)*Tc + k] = acc*scale;
                    mx[g] = fmax(mx[g], acc*scale);
                }
            }
            for (int g = 0; g < G; ++g) {
                for (int k = 0; k < Tc; ++k) { s[size_t(g)*Tc + k] = exp(s[size_t(g)*Tc + k] - mx[g]); l[g] += s[size_t(g)*Tc + k]; }
            }
            for (int k = 0; k < Tc; ++k) {
                for (int d = 0; d < D; ++d) { row[d] = deq(hV, k, h, d); }
                for (int g = 0; g < G; ++g) {
                    const double w = s[size_t(g)*Tc + k]/l[g];
                    for (int d = 0; d < D; ++d) { ref[(h*G + g)*D + d] += w*row[d]; }
                }
            }
        }
    }
    for (const config c : {config{"per-head", false}, config{"all-heads", true}}) {
        const int parts = launch(c.all, Tc);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        std::vector<float> hO(size_t(parts)*NQ*D);
        std::vector<float2> hml(size_t(parts)*NQ);
        CHECK(cudaMemcpy(hO.data(), O_part, hO.size()*sizeof(float), cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(hml.data(), ml_part, hml.size()*sizeof(float2), cudaMemcpyDeviceToHost));
        double err2 = 0.0, ref2 = 0.0, errmax = 0.0;
        for (int q = 0; q < NQ; ++q) {
            double M = -1e300;
            for (int p = 0; p < parts; ++p) { if (hml[p*NQ + q].y > 0.0f) { M = fmax(M, hml[p*NQ + q].x); } }
            double L = 0.0;
            std::vector<double> o(D, 0.0);
            for (int p = 0; p < parts; ++p) {
                if (hml[p*NQ + q].y <= 0.0f) { continue; }
                const double w = exp(hml[p*NQ + q].x - M);
                L += w*hml[p*NQ + q].y;
                for (int d = 0; d < D; ++d) { o[d] += w*hO[(size_t(p)*NQ + q)*D + d]; }
            }
            for (int d = 0; d < D; ++d) {
                const double e = o[d]/L - ref[q*D + d];
                err2 += e*e;
                ref2 += ref[q*D + d]*ref[q*D + d];
                errmax = fmax(errmax, fabs(e));
            }
        }
        const double rel = sqrt(err2/ref2);
        printf("%-10s T=%d: rms error / rms output %.2e, max error %.2e: %s\n", c.name, Tc, rel, errmax,
            rel < 0.1 ? "ok" : "WRONG");
    }

    bench_timing::cold_warm timer; // cold (after other memory filled the L2) and warm (back to back)
    for (int T : {262144, 32768}) {
        for (const config c : {config{"per-head", false}, config{"all-heads", true}}) {
            const auto [us_cold, us_warm] = timer.time([&] { launch(c.all, T); });
            const double tb = 2.0*T*TOKEN/1e12;
            printf("%-10s T=%6d  cold %8.2f us %5.2f TB/s   warm %8.2f us %5.2f TB/s\n", c.name, T,
                us_cold, tb/(us_cold*1e-6), us_warm, tb/(us_warm*1e-6));
        }
    }
    return 0;
}
