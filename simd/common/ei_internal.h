/* Declarations shared by the files of the native core (not part of the public API). */
#ifndef EI_INTERNAL_H
#define EI_INTERNAL_H

#include "../include/edgeinfer.h"
#include "ei_kernels.h"

/* the kernel table of an instruction set, or NULL when it is not supported here */
const ei_kernels *ei_kernels_for(int isa);

/* GELU of every fp16 value, as fp16 (65536 entries) */
void ei_gelu_table(ei_f16 *tab);

/* records a one-line message for ei_last_error() and returns the status */
ei_status ei_fail(ei_status status, const char *fmt, ...);

#endif
