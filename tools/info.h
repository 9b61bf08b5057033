/*
 * `braid info`: what Braid would run on here (CUDA driver, backend) and every knob of the parameter
 * registry with its current value and where that value came from.
 */
#ifndef BRAID_TOOLS_INFO_H
#define BRAID_TOOLS_INFO_H

/* `braid info [--params]`: returns the exit status. */
int info_main(int argc, char **argv);

#endif
