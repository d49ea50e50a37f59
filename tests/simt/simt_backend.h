/* simt_backend.h: the SIMT emulation's backend (simt_backend.cpp): the CPU backend's table with
 * every op that is a kernel of kernels/cuda/ run through the emulator under the profile in force
 * (simt::set_profile). */
#ifndef DDK_SIMT_BACKEND_H
#define DDK_SIMT_BACKEND_H
#include "ddk.h"
const ddk_backend *simt_backend(void);
#endif
