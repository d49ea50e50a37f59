/* test_simt_step.cpp: the drafter's whole training step (ddt_drafter_step: DFlash and DFlash2,
 * forward, the fused loss with the selector term, backward into every parameter) with every op
 * that is a CUDA kernel run from its own source by the SIMT emulator (simt_backend()), against
 * the float64 reference of SPEC.md 1, 2 and 2.1 (tests/engine/model/drafter_check.c: the loss, the
 * hidden states, every gradient by central differences of the reference), under the limits of a
 * card: the matrix products stay the CPU's (cuBLAS is not emulated), the kernels are the GPU's.
 * Every setting of drafter_check.c with the fp32 SIMT attention kernels (the tolerances of the
 * CPU's check, a little wider: the kernels sum in another order), and DFlash2's settings with the
 * tensor-core flash attention (bf16 operands: the loss and the hidden states to 5e-3, gradients to 3e-2; measured 4e-4, 2.2e-3 and 1.7e-2).
 *
 * Usage: test_simt_step CARD (h200, b200, rtx-pro-6000). ctest: simt_step_CARD (labels unit,
 * sanitize); one line per case; "N passed, M failed".
 */
#include "simt.h"
#include "simt_backend.h"
#include "check.h"
#include "engine/model/drafter_check.h"

int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : "h200";
    const ddk_device_profile *p = ddk_device_profile_find(name);
    if (!p) {
        fprintf(stderr, "test_simt_step: %s is not a card of ddk_device_profiles\n", name);
        return 2;
    }
    simt::set_profile(p);
    const ddk_backend *emu = simt_backend();
    static const struct { int kind; const char *what; double tol, grad_tol; } kernels[] = {
        { DDK_CUDA_ATTENTION_SIMT, "SIMT attention", 1e-4, 3e-3 },
        { DDK_CUDA_ATTENTION_FLASH, "flash attention", 5e-3, 3e-2 },
    };
    for (const auto &k : kernels) {
        ddk_cuda_set_attention_kernels(k.kind);
        for (int i = 0; i < drafter_setting_count; i++) {
            const drafter_setting *st = &drafter_settings[i];
            if (k.kind == DDK_CUDA_ATTENTION_FLASH && !st->dflash2)
                continue;
            const int failed = drafter_check_step(emu, st, k.tol, k.grad_tol);
            check(failed == 0, "an expectation failed");
            char line[240];
            snprintf(line, sizeof line, "%s, %s: %s", p->name, k.what, st->name);
            case_done(line);
        }
    }
    ddk_cuda_set_attention_kernels(-1);
    const int failed = drafter_check_init_is_dflash(emu);
    check(failed == 0, "an expectation failed");
    case_done("dflash2 at initialisation is dflash");
    return cases_summary();
}
