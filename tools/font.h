/*
 * A 5x7 bitmap font for the bench's plots: digits, letters A-Z and a-z, and the punctuation that axis labels
 * and legends use. Each glyph is 7 rows, top first; in a row, bit 4 is the leftmost column. A line of text is
 * FONT_H + FONT_DROP rows high: letters with a descender are drawn lower (font_drop).
 */
#ifndef BRAID_TOOLS_FONT_H
#define BRAID_TOOLS_FONT_H

#include <stdint.h>

#define FONT_W       5 /* glyph width in pixels */
#define FONT_H       7 /* glyph height in pixels */
#define FONT_ADVANCE 6 /* horizontal distance from one character to the next */
#define FONT_DROP    2 /* rows below the baseline that descenders reach */

/* The 7 rows of character c; characters the font lacks are drawn as '?'. */
const uint8_t *font_glyph(char c);
/* Whether the font has a glyph of its own for c. */
int font_has(char c);
/* How many rows lower than others c's glyph is drawn: FONT_DROP for letters with a descender, else 0. */
int font_drop(char c);

#endif
