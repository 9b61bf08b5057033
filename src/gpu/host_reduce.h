/*
 * Element-wise reductions on host memory: the host backend's counterpart of the reduction kernels.
 *
 * Every NCCL type is supported, the 16- and 8-bit floats through float with round-to-nearest-even (fp8
 * saturates to the largest finite value, as CUDA's satfinite conversions do). Integer arithmetic wraps.
 */
#ifndef BRAID_GPU_HOST_REDUCE_H
#define BRAID_GPU_HOST_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* The arithmetic of a reduction. ncclAvg becomes PREMULSUM by 1/nranks on floats, SUM_POSTDIV on integers. */
typedef enum { RED_SUM, RED_PROD, RED_MAX, RED_MIN, RED_PREMULSUM, RED_SUM_POSTDIV } red_kind_t;

/* A reduction, ready to apply. */
typedef struct {
  red_kind_t kind;
  ncclDataType_t type;
  double fscale;          /* PREMULSUM on a float type: the factor */
  int64_t iscale;         /* PREMULSUM on an integer type: the factor */
  int64_t divisor;        /* SUM_POSTDIV: what the final sum is divided by */
  const void *scalar_dev; /* PREMULSUM on the GPU backend with a device-resident factor: its address (the
                             kernels read it when they run); NULL otherwise */
} red_t;

/* Whether preparing and finishing a value with `red` leaves it as it is (a factor of 1, a divisor of 1, or no
 * scaling at all): a transfer that only prepares and finishes with it is a plain copy. */
int red_is_identity(const red_t *red);
/* out[i] = f(local[i]), f scaling by the PREMULSUM factor and the identity otherwise: what a rank sends or
 * keeps of its own input before combining. `out` may be `local`. */
void red_prepare(const red_t *red, void *out, const void *local, size_t count);
/* out[i] = f(local[i]) (+) in[i], then, when `last` and the kind is SUM_POSTDIV, divided by the divisor.
 * `in` holds contributions already prepared. `out` may be `local` or `in`. */
void red_combine(const red_t *red, void *out, const void *local, const void *in, size_t count, int last);

/* Conversions of the 16- and 8-bit float formats (for reductions and for tests' references). */
float red_half_to_float(uint16_t h);
uint16_t red_float_to_half(float f);
float red_bf16_to_float(uint16_t h);
uint16_t red_float_to_bf16(float f);
float red_e4m3_to_float(uint8_t v);
uint8_t red_float_to_e4m3(float f);
float red_e5m2_to_float(uint8_t v);
uint8_t red_float_to_e5m2(float f);

#endif
