/* launch.h: how the kernels of kernels/cuda/ launch and declare shared memory, in one spelling
 * for both builds: nvcc's (<<<>>>, __shared__) on a GPU build, the SIMT emulator's under
 * DDK_SIMT (tests/simt/simt.h: each thread a coroutine, shared memory allocated per block at its
 * exact size). Not installed.
 *   DDK_LAUNCH(kernel, grid, block, smem, stream, args...)   kernel<<<grid, block, smem, stream>>>(args...)
 *   DDK_SHARED(type, name, dims);                             __shared__ type name dims;
 *   DDK_DYNAMIC_SHARED(type, name);                           extern __shared__ type name[];
 * A template kernel is named through a local pointer (a comma in a macro argument). */
#ifndef DDK_CUDA_LAUNCH_H
#define DDK_CUDA_LAUNCH_H

#ifdef DDK_SIMT
#include "simt.h"
#define DDK_LAUNCH(kernel, grid, block, smem, stream, ...) \
    simt_launch((kernel), #kernel, (grid), (block), (smem), (stream), __VA_ARGS__)
#define DDK_SHARED(type, name, dims)                                                                \
    type(&name) dims = *reinterpret_cast<type(*) dims>(                                             \
        simt::static_shared(sizeof(type dims), __PRETTY_FUNCTION__, __FILE__, __LINE__))
#define DDK_DYNAMIC_SHARED(type, name) type *name = reinterpret_cast<type *>(simt::dynamic_shared())
#else
#define DDK_LAUNCH(kernel, grid, block, smem, stream, ...) kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#define DDK_SHARED(type, name, dims) __shared__ type name dims
#define DDK_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

#endif
