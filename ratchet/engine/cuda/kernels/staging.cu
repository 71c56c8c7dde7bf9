// A decode step's inputs and outputs cross between the host's pinned buffers and the GPU
// inside the step's graph, as plain loads and stores over PCIe (pinned memory is mapped into
// the device's address space), instead of copy-engine copies around the graph: consecutive
// steps then run back to back without a hand-over between the compute and copy engines
// (docs/KERNELS.md, run 6).
#include "dtype.cuh"

// copy_rows: dst[r, c] = src[r, c] for r < rows, c < cols, both row-major with their pitches.
extern "C" __global__ void copy_rows(const int* __restrict__ src, int src_pitch, int* __restrict__ dst,
                                     int dst_pitch, int rows, int cols) {
    pdl_begin();
    const int n = rows * cols;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const int r = i / cols, c = i - r * cols;
        dst[(long long)r * dst_pitch + c] = src[(long long)r * src_pitch + c];
    }
}
