// Shared by the standalone CUDA programs in this folder (copy-pattern-bench.cu, turbo-all-heads-proto.cu): an error
// check, the device line and the cold/warm timing of a launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

namespace bench_timing {

// prints the device's name and returns its SM count
static int print_device() {
    int nsm = 0;
    CHECK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs\n", prop.name, nsm);
    return nsm;
}

__global__ void fill(int4 * p, int64_t n16, int v) {
    for (int64_t i = blockIdx.x*int64_t(blockDim.x) + threadIdx.x; i < n16; i += int64_t(gridDim.x)*blockDim.x) {
        p[i] = make_int4(v, v, v, v);
    }
}

__global__ void read_all(const int4 * p, int64_t n16, int * sink) {
    int acc = 0;
    for (int64_t i = blockIdx.x*int64_t(blockDim.x) + threadIdx.x; i < n16; i += int64_t(gridDim.x)*blockDim.x) {
        const int4 a = __ldcs(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == 0x12345678) { sink[0] = acc; } // keeps the loads; practically never taken
}

// Microseconds per launch, the mean of `reps`, two ways. Cold: before each timed launch, 256 MiB are written and
// then 256 MiB of other memory read, so that the 50 MB L2 holds none of the kernel's data and no dirty lines whose
// write-back would share its time (two untimed rounds first). Warm: `reps` launches back to back in one timing, as
// test-backend-ops perf runs kernels.
struct cold_warm {
    static constexpr size_t scratch_bytes = size_t(256) << 20;
    int nsm = 0;
    int4 * written = nullptr;
    int4 * read = nullptr;
    int * sink = nullptr;
    cudaEvent_t e0, e1;

    cold_warm() {
        CHECK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
        CHECK(cudaMalloc(&written, scratch_bytes));
        CHECK(cudaMalloc(&read, scratch_bytes));
        CHECK(cudaMemset(read, 0, scratch_bytes));
        CHECK(cudaMalloc(&sink, 16));
        CHECK(cudaEventCreate(&e0));
        CHECK(cudaEventCreate(&e1));
    }

    template <typename F>
    std::pair<double, double> time(F launch, const int reps = 20) {
        float cold = 0.0f;
        for (int i = 0; i < reps + 2; ++i) {
            fill<<<4*nsm, 512>>>(written, scratch_bytes/16, i);
            read_all<<<4*nsm, 512>>>(read, scratch_bytes/16, sink);
            CHECK(cudaEventRecord(e0));
            launch();
            CHECK(cudaEventRecord(e1));
            CHECK(cudaEventSynchronize(e1));
            float ms = 0.0f;
            CHECK(cudaEventElapsedTime(&ms, e0, e1));
            if (i >= 2) { cold += ms; }
        }
        launch();
        CHECK(cudaEventRecord(e0));
        for (int i = 0; i < reps; ++i) {
            launch();
        }
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float warm = 0.0f;
        CHECK(cudaEventElapsedTime(&warm, e0, e1));
        CHECK(cudaGetLastError());
        return {1e3*cold/reps, 1e3*warm/reps};
    }
};

} // namespace bench_timing
