/* test_drafter_reference.c: the drafter's training step (ddt_drafter_step: forward, the fused loss
 * with DFlash2's selector term, backward into every parameter) and its forward on the CPU backend
 * against the float64 reference of SPEC.md sections 1, 2 and 2.1 (drafter_reference.c), DFlash
 * and DFlash2, under every setting of drafter_check.c: DFlash2's candidates "strict" and
 * "inject", stop_gradient on (the reference's selector term then reads the unperturbed hidden
 * states) and off, alpha_sel 1, 0.5 and 0 (no selector gradient), the loss materialised and
 * streamed in tiles that do not divide V, data and teacher labels, KL and CAP on. Also: a fresh
 * DFlash2 drafter has DFlash's hidden states (the engine's and the reference's).
 * tests/simt/test_simt_step.cpp runs the same checks through the CUDA kernels.
 * ctest: one line per case, a final "N passed, M failed".
 */
#include "check.h"
#include "drafter_check.h"

int main(void)
{
    const ddk_backend *cpu = ddk_backend_cpu();
    for (int i = 0; i < drafter_setting_count; i++) {
        const int failed = drafter_check_step(cpu, &drafter_settings[i], 2e-5, 2e-3);
        check(failed == 0, "an expectation failed");
        case_done(drafter_settings[i].name);
    }
    const int failed = drafter_check_init_is_dflash(cpu);
    check(failed == 0, "an expectation failed");
    case_done("dflash2 at initialisation is dflash");
    return cases_summary();
}
