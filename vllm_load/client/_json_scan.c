/* The SSE parser's validating JSON scanner (_sse.c's first half): strings, numbers, literals and the skipping of
 * whole values over one line, validated as orjson validates them (UTF-8, control characters, surrogate escapes,
 * number grammar, infinities), so a line the parser keeps is one Python would have kept alike. */
#include "_json_scan.h"

#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* JSON's numbers read in the C locale, whatever locale a user's locustfile set (a decimal comma would end
 * "1.5e400" at its point) */
static locale_t c_numeric;
static pthread_once_t c_numeric_once = PTHREAD_ONCE_INIT;

static void make_c_numeric(void);

void js_init(void) {
    pthread_once(&c_numeric_once, make_c_numeric);
}

static void make_c_numeric(void) {
    c_numeric = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
}

int sse_buf_add(sse_buf *b, const char *p, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q)
            return P_MEM;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    return P_OK;
}

/* ---- a validating JSON scanner over one line ---- */


void js_ws(cur_t *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int hex4(const unsigned char *p, unsigned *v) {
    unsigned x = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char h = p[i];
        x <<= 4;
        if (h >= '0' && h <= '9')
            x |= h - '0';
        else if (h >= 'a' && h <= 'f')
            x |= h - 'a' + 10;
        else if (h >= 'A' && h <= 'F')
            x |= h - 'A' + 10;
        else
            return 0;
    }
    *v = x;
    return 1;
}

static int put_utf8(sse_buf *out, unsigned cp) {
    char b[4];
    size_t n;
    if (cp < 0x80) {
        b[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        b[0] = (char)(0xC0 | (cp >> 6));
        b[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        b[0] = (char)(0xE0 | (cp >> 12));
        b[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        b[0] = (char)(0xF0 | (cp >> 18));
        b[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    return sse_buf_add(out, b, n);
}

/* the length of a valid UTF-8 sequence at p (no overlongs, no surrogates, at most U+10FFFF), 0 if invalid */
static size_t utf8_len(const unsigned char *p, const unsigned char *end) {
    unsigned char c = p[0];
    size_t n;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if ((size_t)(end - p) < n)
        return 0;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    return n;
}

/* a string at c->p (its opening quote); its decoded UTF-8 appended to out when out is not NULL */
int js_string(cur_t *c, sse_buf *out) {
    const unsigned char *p = c->p + 1, *end = c->end;
    while (p < end) {
        const unsigned char *run = p;
        while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\')
            p++;
        if (out && p > run && sse_buf_add(out, (const char *)run, (size_t)(p - run)))
            return P_MEM;
        if (p >= end)
            return P_NO;
        unsigned char ch = *p;
        if (ch == '"') {
            c->p = p + 1;
            return P_OK;
        }
        if (ch < 0x20)
            return P_NO; /* orjson: unexpected control character in string */
        if (ch >= 0x80) {
            size_t n = utf8_len(p, end);
            if (!n)
                return P_NO;
            if (out && sse_buf_add(out, (const char *)p, n))
                return P_MEM;
            p += n;
            continue;
        }
        /* an escape */
        if (p + 1 >= end)
            return P_NO;
        unsigned char e = p[1];
        char one;
        switch (e) {
        case '"': one = '"'; break;
        case '\\': one = '\\'; break;
        case '/': one = '/'; break;
        case 'b': one = '\b'; break;
        case 'f': one = '\f'; break;
        case 'n': one = '\n'; break;
        case 'r': one = '\r'; break;
        case 't': one = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (end - p < 6 || !hex4(p + 2, &cp))
                return P_NO;
            p += 6;
            if (cp >= 0xDC00 && cp <= 0xDFFF)
                return P_NO; /* a low surrogate first */
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || !hex4(p + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                    return P_NO; /* no low surrogate after a high one */
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p += 6;
            }
            if (out && put_utf8(out, cp))
                return P_MEM;
            continue;
        }
        default:
            return P_NO;
        }
        if (out && sse_buf_add(out, &one, 1))
            return P_MEM;
        p += 2;
    }
    return P_NO;
}

/* a number; *iv set and *is_int 1 when it is an integer of at most 18 digits (a Python int for certain) */
int js_number(cur_t *c, long long *iv, int *is_int) {
    const unsigned char *p = c->p, *end = c->end, *start = p;
    int neg = 0, frac = 0, digits = 0;
    long long v = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end || *p < '0' || *p > '9')
        return P_NO;
    if (*p == '0') {
        p++;
        digits = 1;
        if (p < end && *p >= '0' && *p <= '9')
            return P_NO; /* a leading zero */
    } else {
        while (p < end && *p >= '0' && *p <= '9') {
            if (digits < 18)
                v = v * 10 + (*p - '0');
            digits++;
            p++;
        }
    }
    if (p < end && *p == '.') {
        frac = 1;
        p++;
        if (p >= end || *p < '0' || *p > '9')
            return P_NO;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        frac = 1;
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (p >= end || *p < '0' || *p > '9')
            return P_NO;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    c->p = p;
    *is_int = !frac && digits <= 18;
    *iv = neg ? -v : v;
    if (frac || digits > 18) { /* orjson refuses a number that is infinite as a double */
        char tmp[512];
        size_t n = (size_t)(p - start);
        if (n >= sizeof tmp)
            return P_NO;
        memcpy(tmp, start, n);
        tmp[n] = 0;
        if (!c_numeric || isinf(strtod_l(tmp, NULL, c_numeric)))
            return P_NO;
    }
    return P_OK;
}

int js_literal(cur_t *c, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0)
        return P_NO;
    c->p += n;
    return P_OK;
}

/* a container's opening bracket (open) at c->p, taken with the space after it; *more: it is not empty (an
 * empty one is taken whole) */
int js_open_bracket(cur_t *c, unsigned char open, int *more) {
    unsigned char close = open == '{' ? '}' : ']';
    if (c->p >= c->end || *c->p != open)
        return P_NO;
    if (++c->depth > MAX_DEPTH)
        return P_NO;
    c->p++;
    js_ws(c);
    *more = !(c->p < c->end && *c->p == close);
    if (!*more) {
        c->p++;
        c->depth--;
    }
    return P_OK;
}

/* after a member or an element: a comma (*more: another follows) or the closing bracket (taken) */
int js_next_in(cur_t *c, unsigned char close, int *more) {
    js_ws(c);
    if (c->p >= c->end)
        return P_NO;
    if (*c->p == ',') {
        c->p++;
        js_ws(c);
        *more = 1;
        return P_OK;
    }
    if (*c->p != close)
        return P_NO;
    c->p++;
    c->depth--;
    *more = 0;
    return P_OK;
}

/* an object or array whose opening bracket is at c->p, validated and skipped */
static int skip_container(cur_t *c) {
    unsigned char close = *c->p == '{' ? '}' : ']';
    int object = close == '}', more, rc;
    if ((rc = js_open_bracket(c, *c->p, &more)))
        return rc;
    while (more) {
        if (object) {
            if (c->p >= c->end || *c->p != '"')
                return P_NO;
            if ((rc = js_string(c, NULL)))
                return rc;
            js_ws(c);
            if (c->p >= c->end || *c->p != ':')
                return P_NO;
            c->p++;
            js_ws(c);
        }
        if ((rc = js_skip_value(c)) || (rc = js_next_in(c, close, &more)))
            return rc;
    }
    return P_OK;
}

int js_skip_value(cur_t *c) {
    if (c->p >= c->end)
        return P_NO;
    long long iv;
    int is_int;
    switch (*c->p) {
    case '"': return js_string(c, NULL);
    case '{':
    case '[': return skip_container(c);
    case 't': return js_literal(c, "true");
    case 'f': return js_literal(c, "false");
    case 'n': return js_literal(c, "null");
    default: return js_number(c, &iv, &is_int);
    }
}
