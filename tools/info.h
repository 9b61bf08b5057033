/*
 * `braid info`: what Braid would run on here (CUDA driver, backend) and every knob of the parameter
 * registry with its current value and where that value came from; or, with --markdown, the registry as the
 * page docs/knobs.md (defaults and help, independent of the environment).
 */
#ifndef BRAID_TOOLS_INFO_H
#define BRAID_TOOLS_INFO_H

/* `braid info [--params [--markdown]]`: returns the exit status. */
int info_main(int argc, char **argv);

#endif
