/* device_profile.c: the cards ddtree plans for and their limits (ddk.h, ddk_device_profile): the
 * one table of these figures. The planner reads a card's memory from it (`ddtreed plan --card`),
 * tests/simt runs every CUDA kernel under each card's shared memory and thread limits, and the
 * CUDA backend reads the same attributes from the GPU it runs on. Tested by tests/simt
 * (test_simt_kernels: the limits each profile gives the launches) and tests/engine/test_engine.c (the
 * plan of the 96 GB card).
 *
 * Sources: CUDA C++ Programming Guide, "Technical Specifications per Compute Capability" (9.0,
 * 10.0, 12.0: shared memory per SM and per block, threads per SM, registers); the cards' data
 * sheets for the multiprocessors; memory as nvidia-smi reports it (MiB).
 */
#include "ddk.h"

#include <strings.h>

#define MIB(x) ((int64_t)(x) << 20)

static const ddk_device_profile profiles[] = {
    /* name            card                              cc   SMs  memory          optin   per SM  threads regs */
    { "h100",          "NVIDIA H100 80GB HBM3",          90,  132, MIB(81559),     232448, 233472, 2048, 65536 },
    { "h200",          "NVIDIA H200",                    90,  132, MIB(143771),    232448, 233472, 2048, 65536 },
    { "b200",          "NVIDIA B200",                    100, 148, MIB(183359),    232448, 233472, 2048, 65536 },
    { "rtx-pro-6000",  "NVIDIA RTX PRO 6000 Blackwell",  120, 188, MIB(97887),     101376, 102400, 1536, 65536 },
};

const ddk_device_profile *ddk_device_profiles(int *count)
{
    *count = (int)(sizeof profiles / sizeof profiles[0]);
    return profiles;
}

const ddk_device_profile *ddk_device_profile_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof profiles / sizeof profiles[0]; i++)
        if (strcasecmp(profiles[i].name, name) == 0)
            return &profiles[i];
    return NULL;
}
