/* cuda_runtime.h of the SIMT emulation (tests/simt): the kernels' sources include this name;
 * under DDK_SIMT it is the emulator's runtime (simt.h). */
#include "../simt.h"
