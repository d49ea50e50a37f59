/* cuda_bf16.h of the SIMT emulation (tests/simt): the bf16 conversions are simt.h's. */
#include "../simt.h"
