/*
 * The floor kernel's fatbin in a build without a CUDA compiler: empty, so `braid bench --floor` is refused.
 */
#include "bench_floor.h"

const unsigned char bench_floor_fatbin[1] = {0};
const unsigned long long bench_floor_fatbin_size = 0;
