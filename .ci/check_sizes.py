#!/usr/bin/env python3
"""Size limits of the library's sources: no file in src/ over 1,000 lines, no function over 80.

A function is a top-level brace block whose opening statement ends with a parameter list (not a struct, enum,
union, initialiser or extern "C" block); its length is the number of lines between its braces' lines."""
import pathlib
import re
import sys

MAX_FILE, MAX_FUNC = 1000, 80


def code_only(text):
    """The text with comments, strings and character literals blanked, newlines kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j]))
            i = j
        elif text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i))
            i = j
        elif c in '"\'':
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == '\\' else 1
            out.append(c + ' ' * (j - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return ''.join(out)


def functions(text):
    """(first line, lines inside) of each top-level function body."""
    code = code_only(text)
    depth, stmt_start, found = 0, 0, []
    open_at = None
    for i, c in enumerate(code):
        if c == '{':
            if depth == 0:
                head = code[stmt_start:i]
                head_words = head.split()
                is_func = (head.rstrip().endswith(')') or re.search(r'\)\s*(const|noexcept)?\s*$', head)) \
                    and '=' not in head.split('(')[0] \
                    and not re.match(r'\s*(typedef\s+)?(struct|union|enum)\b', head) \
                    and head_words != ['extern', '""']
                open_at = i if is_func else None
            depth += 1
        elif c == '}':
            depth -= 1
            if depth == 0:
                if open_at is not None:
                    first = code.count('\n', 0, open_at) + 1
                    last = code.count('\n', 0, i) + 1
                    found.append((first, last - first - 1))
                open_at = None
                stmt_start = i + 1
        elif c in ';#' and depth == 0:
            stmt_start = i + 1
        elif c == '\n' and depth == 0 and code[stmt_start:i].lstrip().startswith('#'):
            stmt_start = i + 1
    return found


def main(root):
    bad = []
    for path in sorted(pathlib.Path(root, 'src').rglob('*')):
        if path.suffix not in ('.c', '.h', '.cu', '.cuh'):
            continue
        text = path.read_text()
        nlines = text.count('\n')
        if nlines > MAX_FILE:
            bad.append(f'{path.relative_to(root)}: {nlines} lines (at most {MAX_FILE})')
        for first, inside in functions(text):
            if inside > MAX_FUNC:
                bad.append(f'{path.relative_to(root)}:{first}: a function of {inside} lines (at most {MAX_FUNC})')
    for b in bad:
        print(b)
    if bad:
        return 1
    print(f'sizes: no file in src/ over {MAX_FILE} lines, no function over {MAX_FUNC}')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else '.'))
