// How fast can a decode kernel bring a turbo2 KV cache into shared memory, depending on how it maps the cache to
// blocks? A standalone benchmark (no ggml): the Llama-3-8B shape's turbo2 cache, K and V each [T tokens][8 KV heads]
// [36 bytes] as llama.cpp lays it out (a token's 8 KV heads adjacent, 288 bytes per token), read by kernels that
// stage rows through shared memory and consume them with a minimal loop (one shared-memory load per lane and row,
// XOR-ed into a sink), so the times are the memory side of a decode loop without its arithmetic:
//   per-head  the series' mapping (0019, 0029, 0031): a block of 8 warps per (KV head, part of the sequence); each
//             warp copies its next 16 rows with 4-byte cp.async, 16 lanes per row (9 of them active), two buffers
//             per warp. The twenty-second round timed this loop inside the real kernel (probe mode 4) at 71 us for
//             T = 262144 with the merge and the set-up.
//   warp-heads a block of 8 warps per part of the sequence, warp w copying and reading head w's rows as per-head
//             does: the same copies, but the 8 heads of a token are read by one SM at about the same time
//   all-heads a block of 8 warps per part of the sequence covers all 8 KV heads (warp w reads head w's rows), so
//             a step's 16 tokens are one contiguous 4608-byte piece of K and one of V, copied with 16-byte cp.async
//             by the whole block through STAGES buffers (block barriers)
//   bulk      the same mapping with one cp.async.bulk (the Hopper copy engine, completion on an mbarrier) per side
//             and step, issued by one thread
//   stream    every byte of K and V read once with 16-byte loads: what the memory delivers to this access volume
// Each kernel is timed with CUDA events cold (alone, after other memory has filled the 50 MB L2 with clean lines) and
// warm (back to back, as test-backend-ops perf times kernels).
// Build and run (sm_90 for the bulk copies):
//   nvcc -O3 -arch=sm_90a -std=c++17 -o copy-pattern-bench bench/experiments/copy-pattern-bench.cu && ./copy-pattern-bench
// Output: one line per kernel and depth: microseconds per launch (mean of 20) and TB/s of K+V bytes, cold and warm.

#include "bench-timing.cuh"

#include <vector>

constexpr int NH       = 8;        // KV heads
constexpr int ROW      = 36;       // bytes per row (turbo2, head size 128: two 18-byte blocks)
constexpr int TOKEN    = NH*ROW;   // 288 bytes per token
constexpr int NWARPS   = 8;
constexpr int ROWS     = 16;       // rows per warp and step
constexpr int NW       = ROW/4;    // 9 words per row
constexpr int PITCH    = 48;       // the series' staged row pitch for 9-word rows (a word count of 4 mod 8)

__device__ __forceinline__ uint32_t smem_addr(const void * p) {
    return (uint32_t) __cvta_generic_to_shared(p);
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wait_group() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }

// the consumer: as the decode kernel, lane (r, t) reads rows r and 8 + r of a step's staged K and V (pitch bytes
// apart), a word of each of the row's two blocks
__device__ __forceinline__ uint32_t read_rows(const char * k, const char * v, int pitch, int r, int t) {
    uint32_t acc = 0;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        acc ^= *(const uint32_t *) (k + (8*hh + r)*pitch + 4*t);
        acc ^= *(const uint32_t *) (k + (8*hh + r)*pitch + 20 + 4*t);
        acc ^= *(const uint32_t *) (v + (8*hh + r)*pitch + 4*t);
        acc ^= *(const uint32_t *) (v + (8*hh + r)*pitch + 20 + 4*t);
    }
    return acc;
}

// the series' per-warp staging: rows k0 .. k0 + 15 of one head (nb bytes apart) to the warp's buffer
__device__ __forceinline__ void copy_rows_4(uint32_t dst, const char * src, int64_t nb, int lane) {
    const int lw = lane % 16;
    const uint32_t d = dst + (lane / 16)*PITCH + 4*lw;
    const char * s = src + (lane / 16)*nb + 4*lw;
    if (lw < NW) {
#pragma unroll
        for (int a = 0; a < ROWS/2; ++a) {
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(d + a*2*PITCH), "l"(s + a*2*nb) : "memory");
        }
    }
}

// per-head: grid (parts, NH), block (32, NWARPS); block p of head h covers tokens [p*T/parts, (p + 1)*T/parts),
// its warps take turns at 16-row steps. WARP_HEADS (the all-heads mapping with the series' per-warp copies): grid
// (parts), warp w takes head w and every step of the block's tokens. !READ: the staged rows are waited for, not read
// (as the decode kernel's probe mode 4).
template <bool WARP_HEADS, bool READ = true>
__global__ void __launch_bounds__(NWARPS*32, 2) per_head(const char * K, const char * V, int T, uint32_t * sink) {
    __shared__ __align__(16) char st[NWARPS][2][2][ROWS*PITCH]; // warp, buffer, K/V
    const int lane = threadIdx.x, warp = threadIdx.y;
    const int h = WARP_HEADS ? warp : blockIdx.y;
    const int per = (T + gridDim.x - 1)/gridDim.x;
    const int k_begin = blockIdx.x*per, k_end = min(k_begin + per, T);
    constexpr int stride = WARP_HEADS ? ROWS : NWARPS*ROWS; // rows from one step of a warp to its next
    const char * Kh = K + h*ROW;
    const char * Vh = V + h*ROW;
    uint32_t acc = 0;
    int k0 = k_begin + (WARP_HEADS ? 0 : warp*ROWS);
    if (k0 + ROWS <= k_end) {
        copy_rows_4(smem_addr(st[warp][0][0]), Kh + int64_t(k0)*TOKEN, TOKEN, lane);
        copy_rows_4(smem_addr(st[warp][0][1]), Vh + int64_t(k0)*TOKEN, TOKEN, lane);
    }
    commit();
    int buf = 0;
    for (; k0 + ROWS <= k_end; k0 += stride) {
        const int kn = k0 + stride;
        if (kn + ROWS <= k_end) {
            copy_rows_4(smem_addr(st[warp][buf ^ 1][0]), Kh + int64_t(kn)*TOKEN, TOKEN, lane);
            copy_rows_4(smem_addr(st[warp][buf ^ 1][1]), Vh + int64_t(kn)*TOKEN, TOKEN, lane);
        }
        commit();
        wait_group<1>();
        __syncwarp();
        if (READ) {
            acc ^= read_rows(st[warp][buf][0], st[warp][buf][1], PITCH, lane / 4, lane % 4);
        }
        __syncwarp();
        buf ^= 1;
    }
    if (acc == 0x12345678u) { sink[0] = acc; } // keeps the loads; practically never taken
}

// all-heads with 16-byte cp.async: grid (parts), block (32, NWARPS); a step is 16 tokens of all heads
template <int STAGES>
__global__ void __launch_bounds__(NWARPS*32, 2) all_heads(const char * K, const char * V, int T, uint32_t * sink) {
    constexpr int CHUNK = ROWS*TOKEN; // 4608 bytes per side and step
    constexpr int NPIECE = CHUNK/16;  // 288
    __shared__ __align__(16) char st[STAGES][2][CHUNK];
    const int tid = threadIdx.y*32 + threadIdx.x;
    const int lane = threadIdx.x, warp = threadIdx.y;
    const int per = ((T + gridDim.x - 1)/gridDim.x + ROWS - 1)/ROWS*ROWS;
    const int k_begin = blockIdx.x*per, k_end = min(k_begin + per, T);
    const int nsteps = max(0, (k_end - k_begin)/ROWS);
    auto issue = [&](int step) {
        if (step < nsteps) {
            const int s = step % STAGES;
            const char * Ks = K + int64_t(k_begin + step*ROWS)*TOKEN;
            const char * Vs = V + int64_t(k_begin + step*ROWS)*TOKEN;
            for (int i = tid; i < NPIECE; i += NWARPS*32) {
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(smem_addr(st[s][0] + 16*i)), "l"(Ks + 16*i) : "memory");
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(smem_addr(st[s][1] + 16*i)), "l"(Vs + 16*i) : "memory");
            }
        }
        commit();
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        issue(s);
    }
    uint32_t acc = 0;
    const int r = lane / 4, t = lane % 4;
    for (int step = 0; step < nsteps; ++step) {
        wait_group<STAGES - 2>();
        __syncthreads(); // every thread's pieces of this step are in; the stage refilled next was consumed
        issue(step + STAGES - 1);
        const int s = step % STAGES;
        acc ^= read_rows(st[s][0] + warp*ROW, st[s][1] + warp*ROW, TOKEN, r, t);
    }
    if (acc == 0x12345678u) { sink[1] = acc; }
}

// all-heads with the bulk copy engine: thread 0 copies a step's K and V pieces with cp.async.bulk, completion on
// the stage's mbarrier; the consumers wait on it, and a block barrier before a stage is refilled
template <int STAGES>
__global__ void __launch_bounds__(NWARPS*32, 2) all_heads_bulk(const char * K, const char * V, int T, uint32_t * sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int CHUNK = ROWS*TOKEN;
    __shared__ __align__(128) char st[STAGES][2][CHUNK];
    __shared__ __align__(8) uint64_t bar[STAGES];
    const int tid = threadIdx.y*32 + threadIdx.x;
    const int lane = threadIdx.x, warp = threadIdx.y;
    const int per = ((T + gridDim.x - 1)/gridDim.x + ROWS - 1)/ROWS*ROWS;
    const int k_begin = blockIdx.x*per, k_end = min(k_begin + per, T);
    const int nsteps = max(0, (k_end - k_begin)/ROWS);
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(&bar[s])) : "memory");
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();
    auto issue = [&](int step) {
        if (tid == 0 && step < nsteps) {
            const int s = step % STAGES;
            const uint32_t b = smem_addr(&bar[s]);
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(b), "r"(2*CHUNK) : "memory");
            const char * Ks = K + int64_t(k_begin + step*ROWS)*TOKEN;
            const char * Vs = V + int64_t(k_begin + step*ROWS)*TOKEN;
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                :: "r"(smem_addr(st[s][0])), "l"(Ks), "r"(CHUNK), "r"(b) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                :: "r"(smem_addr(st[s][1])), "l"(Vs), "r"(CHUNK), "r"(b) : "memory");
        }
    };
    for (int s = 0; s < STAGES; ++s) {
        issue(s);
    }
    uint32_t acc = 0;
    const int r = lane / 4, t = lane % 4;
    for (int step = 0; step < nsteps; ++step) {
        const int s = step % STAGES;
        const uint32_t phase = (step / STAGES) & 1;
        uint32_t done = 0;
        while (!done) {
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                : "=r"(done) : "r"(smem_addr(&bar[s])), "r"(phase) : "memory");
        }
        acc ^= read_rows(st[s][0] + warp*ROW, st[s][1] + warp*ROW, TOKEN, r, t);
        __syncthreads(); // stage s consumed by every warp
        issue(step + STAGES);
    }
    if (acc == 0x12345678u) { sink[2] = acc; }
#else
    (void) K; (void) V; (void) T; (void) sink;
#endif
}

// every byte once, 16-byte loads, grid-stride
__global__ void stream(const int4 * K, const int4 * V, int64_t n16, uint32_t * sink) {
    uint32_t acc = 0;
    for (int64_t i = blockIdx.x*int64_t(blockDim.x) + threadIdx.x; i < n16; i += int64_t(gridDim.x)*blockDim.x) {
        const int4 a = __ldcs(K + i), b = __ldcs(V + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
    }
    if (acc == 0x12345678u) { sink[3] = acc; }
}

int main() {
    const int nsm = bench_timing::print_device();
    const int Tmax = 262144;
    const size_t bytes = size_t(Tmax)*TOKEN;
    char *K, *V;
    uint32_t * sink;
    CHECK(cudaMalloc(&K, bytes));
    CHECK(cudaMalloc(&V, bytes));
    CHECK(cudaMalloc(&sink, 64));
    {
        std::vector<uint8_t> h(bytes);
        uint32_t x = 12345;
        for (auto & b : h) { x = x*1664525u + 1013904223u; b = uint8_t(x >> 24); }
        CHECK(cudaMemcpy(K, h.data(), bytes, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(V, h.data(), bytes, cudaMemcpyHostToDevice));
    }
    // cold (alone, after other memory filled the L2) and warm (back to back): bench-timing.cuh
    bench_timing::cold_warm timer;
    auto time = [&](const char * name, int T, auto launch) {
        const auto [us_cold, us_warm] = timer.time(launch);
        const double gb = 2.0*T*TOKEN/1e3; // K+V bytes / 1000, so that gb/us/1000 is TB/s
        printf("%-22s T=%6d  cold %8.2f us %5.2f TB/s   warm %8.2f us %5.2f TB/s\n", name, T,
            us_cold, gb/us_cold/1e3, us_warm, gb/us_warm/1e3);
    };

    for (int T : {262144, 32768}) {
        const dim3 blk(32, NWARPS);
        // the series' grid: 2 blocks per SM in all, so parts = 2*nsm/NH (33 on an H200)
        const int parts_head = 2*nsm/NH;
        time("per-head", T, [&] { per_head<false><<<dim3(parts_head, NH), blk>>>(K, V, T, sink); });
        time("per-head-noread", T, [&] { per_head<false, false><<<dim3(parts_head, NH), blk>>>(K, V, T, sink); });
        for (int parts : {nsm, 2*nsm}) {
            char name[64];
            snprintf(name, sizeof(name), "warp-heads-%d", parts);
            time(name, T, [&] { per_head<true><<<parts, blk>>>(K, V, T, sink); });
            snprintf(name, sizeof(name), "warp-heads-noread-%d", parts);
            time(name, T, [&] { per_head<true, false><<<parts, blk>>>(K, V, T, sink); });
            snprintf(name, sizeof(name), "all-heads-2st-%d", parts);
            time(name, T, [&] { all_heads<2><<<parts, blk>>>(K, V, T, sink); });
            snprintf(name, sizeof(name), "all-heads-3st-%d", parts);
            time(name, T, [&] { all_heads<3><<<parts, blk>>>(K, V, T, sink); });
            snprintf(name, sizeof(name), "all-heads-bulk-2st-%d", parts);
            time(name, T, [&] { all_heads_bulk<2><<<parts, blk>>>(K, V, T, sink); });
            snprintf(name, sizeof(name), "all-heads-bulk-4st-%d", parts);
            time(name, T, [&] { all_heads_bulk<4><<<parts, blk>>>(K, V, T, sink); });
        }
        time("stream", T, [&] { stream<<<4*nsm, 512>>>((const int4 *) K, (const int4 *) V, int64_t(T)*TOKEN/16, sink); });
    }
    return 0;
}
