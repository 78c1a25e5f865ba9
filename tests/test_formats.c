/* test_formats.c - exact tables for every number format. */
#include "harness.h"
#include "numfmt.h"

DSATTN_TEST(formats, e2m1_ties)
{
    const float in[]  = { 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 7.0f, -0.1f };
    const float out[] = { 0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f, 6.0f, -0.0f };
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
        uint8_t c = dsattn_f32_to_e2m1(in[i]);
        CHECK_MSG(dsattn_e2m1_to_f32(c) == out[i], "e2m1(%g) = %g", (double)in[i],
                  (double)dsattn_e2m1_to_f32(c));
    }
    CHECK_EQ_INT(dsattn_f32_to_e2m1(-0.1f), 8);
}
