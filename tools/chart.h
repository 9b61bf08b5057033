/*
 * `braid bench --png FILE`: the run's results as one image. For each collective measured, in the order of the
 * tables, a row of two charts: bus bandwidth against size (left) and time per call against size (right,
 * log scale), with each library as a line of its own colour, and the floor kernel's time as one more line
 * in the time chart when the run measured it (--floor). A row shows the collective's first type and
 * operation, out-of-place; the JSON file has every figure.
 */
#ifndef BRAID_TOOLS_CHART_H
#define BRAID_TOOLS_CHART_H

#include "report.h"

/* Draws the report and writes the PNG. Returns 0, or -1 with the reason on stderr. */
int chart_write(const report_t *r, const char *path);

#endif
