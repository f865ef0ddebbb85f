/* The validating JSON scanner (_json_scan.c) the SSE parser (_sse.c) reads each line with: a cursor over one line and
 * the few reads the parser needs. Every function returns P_OK, P_NO (leave the line to Python) or P_MEM. */
#ifndef VLLM_LOAD_JSON_SCAN_H
#define VLLM_LOAD_JSON_SCAN_H

#include "_sse.h"

#define MAX_DEPTH 64 /* deeper JSON is left to Python (orjson allows 1,024) */

enum { P_OK = 0, P_NO = 1, P_MEM = -1 }; /* parsed / leave the line to Python / out of memory */

typedef struct {
    const unsigned char *p, *end;
    int depth;
} cur_t;

/* once per process, before any number is read: JSON's numbers in the C locale, whatever a locustfile set */
void js_init(void);
int sse_buf_add(sse_buf *b, const char *p, size_t n);
void js_ws(cur_t *c);                                        /* skip JSON whitespace */
int js_string(cur_t *c, sse_buf *out);                       /* a string, decoded into out (NULL: skipped) */
int js_number(cur_t *c, long long *iv, int *is_int);         /* a number; *is_int when integral and in range */
int js_literal(cur_t *c, const char *word);                  /* true, false or null */
int js_skip_value(cur_t *c);                                 /* any value, validated and skipped */
int js_open_bracket(cur_t *c, unsigned char open, int *more); /* '{' or '[', *more: not empty */
int js_next_in(cur_t *c, unsigned char close, int *more);    /* ',' or the closing bracket */

#endif
