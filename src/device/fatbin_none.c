/*
 * The kernels' fatbins in a build without a CUDA compiler: none, so the GPU executor is never chosen.
 */
#include "device/dev.h"

const void *const dev_fatbins[1] = {0};
const int dev_nfatbins = 0;
const char dev_fatbin_archs[] = "";
