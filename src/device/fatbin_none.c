/*
 * The kernels' fatbin in a build without a CUDA compiler: empty, so the GPU executor is never chosen.
 */
#include "device/dev.h"

const unsigned char dev_fatbin[1] = {0};
const unsigned long long dev_fatbin_size = 0;
const char dev_fatbin_archs[] = "";
