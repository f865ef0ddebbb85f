/* The receive thread's SSE parser: StreamState.feed (client/sse.py) in C, for the shapes vLLM streams.
 *
 * Why: with every chunk read and stamped by the receive thread, what was left on the event loop per chunk
 * was handing the line over (a bytes object and a tuple per line, a hub pass per wake) and parsing it in
 * Python (orjson, then a dozen dict lookups): ~6 us of loop time per line at 512 streams x 64 tokens,
 * more than the thread's own read. Here each line is parsed as it is cut, into the same fields the Python
 * parser keeps (chunk offsets and token counts, the id, the texts, the finish reason, the usage), and
 * the event loop receives them once, when the body ends.
 *
 * Exactness first: a line is taken only when it is certain StreamState.feed would make the same of it.
 * Everything else (an error event, tool calls, several choices, non-integer usage, duplicate keys, JSON
 * that orjson would refuse, a line that is not SSE) is left to Python with the rest of the body, which
 * then raises or parses as it always did. The JSON is validated as orjson validates it (UTF-8, control
 * characters, surrogate escapes, number grammar, infinities) before anything of the line is kept.
 */
#include "_json_scan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

sse_state *sse_new(double start_perf) {
    js_init();
    sse_state *st = calloc(1, sizeof(sse_state));
    if (st) {
        st->start_perf = start_perf;
        st->prompt = st->completion = st->cached = st->reasoning_reported = -1;
    }
    return st;
}

void sse_free(sse_state *st) {
    if (!st)
        return;
    free(st->offsets);
    free(st->tokens);
    free(st->id.p);
    free(st->content.p);
    free(st->reasoning.p);
    free(st->text.p);
    free(st->finish.p);
    free(st);
}


/* ---- the fields of one line ---- */

typedef struct {
    int id_str;                  /* "id" is a string (copied to id) */
    int usage_truthy;            /* "usage" is a non-empty object */
    int has_prompt, has_completion, has_cached, has_reasoning;
    long long prompt, completion, cached, reasoning_tokens;
    int nchoices;                /* 0 or 1 (more are left to Python) */
    int delta_truthy;            /* the choice's "delta" is a non-empty object */
    int has_text;                /* the choice's "text" is a non-empty string (completions) */
    sse_buf id, content, reasoning_content, reasoning, text, finish;
} line_t;

/* a key at c->p: *k set to which of names[] it is (-1 none); the key, its colon and the space after taken */
static int key(cur_t *c, const char *const *names, int *k) {
    if (c->p >= c->end || *c->p != '"')
        return P_NO;
    const unsigned char *start = c->p + 1;
    int rc = js_string(c, NULL);
    if (rc)
        return rc;
    size_t n = (size_t)(c->p - 1 - start);
    if (memchr(start, '\\', n))
        return P_NO; /* an escaped key may spell one of ours (a backslash-u escape of "id"): Python's */
    *k = -1;
    for (int i = 0; names[i]; i++) {
        if (strlen(names[i]) == n && memcmp(names[i], start, n) == 0) {
            *k = i;
            break;
        }
    }
    js_ws(c);
    if (c->p >= c->end || *c->p != ':')
        return P_NO;
    c->p++;
    js_ws(c);
    return P_OK;
}

/* an object's members: call at its '{'; *more tells whether a member follows */
static int obj_open(cur_t *c, int *more) {
    return js_open_bracket(c, '{', more);
}

static int obj_next(cur_t *c, int *more) {
    return js_next_in(c, '}', more);
}

static int is_null(cur_t *c) {
    return c->end - c->p >= 4 && memcmp(c->p, "null", 4) == 0;
}

/* a token count: an integer of at most 18 digits, not negative (-1 means "not reported" here; anything
 * else is Python's to judge) */
static int int_value(cur_t *c, long long *v) {
    int is_int;
    if (c->p >= c->end || *c->p < '0' || *c->p > '9')
        return P_NO;
    int rc = js_number(c, v, &is_int);
    return rc ? rc : (is_int ? P_OK : P_NO);
}

/* a value that must be a string (copied to out) or null (*present 0) */
static int str_or_null(cur_t *c, sse_buf *out, int *present) {
    if (is_null(c)) {
        c->p += 4;
        *present = 0;
        return P_OK;
    }
    if (c->p >= c->end || *c->p != '"')
        return P_NO;
    *present = 1;
    return js_string(c, out);
}

typedef int (*member_fn)(cur_t *c, line_t *L, int k);

/* an object's members: each one named in names[] handed to on() with its index (once: a duplicate key, of
 * which orjson keeps the last, is Python's), the others validated and skipped; with nullable, null is an
 * absent object; *truthy (when given): it has members, as Python's truth of a dict */
static int members(cur_t *c, line_t *L, const char *const *names, int nullable, int *truthy, member_fn on) {
    if (nullable && is_null(c)) {
        c->p += 4;
        return P_OK;
    }
    int more, rc, k;
    unsigned seen = 0;
    if ((rc = obj_open(c, &more)))
        return rc; /* not an object: Python's to judge */
    if (truthy)
        *truthy = more;
    while (more) {
        if ((rc = key(c, names, &k)))
            return rc;
        if (k >= 0) {
            if (seen & (1u << k))
                return P_NO;
            seen |= 1u << k;
            rc = on(c, L, k);
        } else {
            rc = js_skip_value(c);
        }
        if (rc)
            return rc;
        if ((rc = obj_next(c, &more)))
            return rc;
    }
    return P_OK;
}

static const char *const DETAILS[] = {"cached_tokens", NULL};
static const char *const OUT_DETAILS[] = {"reasoning_tokens", NULL};
static const char *const USAGE[] = {"prompt_tokens", "completion_tokens", "prompt_tokens_details",
                                    "completion_tokens_details", NULL};
static const char *const DELTA[] = {"content", "reasoning_content", "reasoning", "tool_calls", NULL};
static const char *const CHOICE[] = {"delta", "text", "finish_reason", NULL};
static const char *const TOP[] = {"id", "error", "usage", "choices", "metrics", NULL};

static int details_member(cur_t *c, line_t *L, int k) { /* cached_tokens: a count, or null */
    if (is_null(c)) {
        c->p += 4;
        return P_OK;
    }
    L->has_cached = 1;
    return int_value(c, &L->cached);
}

static int out_details_member(cur_t *c, line_t *L, int k) { /* reasoning_tokens: a count, or null */
    if (is_null(c)) {
        c->p += 4;
        return P_OK;
    }
    L->has_reasoning = 1;
    return int_value(c, &L->reasoning_tokens);
}

static int usage_member(cur_t *c, line_t *L, int k) {
    switch (k) {
    case 0: L->has_prompt = 1; return int_value(c, &L->prompt);
    case 1: L->has_completion = 1; return int_value(c, &L->completion);
    case 2: return members(c, L, DETAILS, 1, NULL, details_member);
    default: return members(c, L, OUT_DETAILS, 1, NULL, out_details_member);
    }
}

static int delta_member(cur_t *c, line_t *L, int k) {
    int present;
    switch (k) {
    case 0: return str_or_null(c, &L->content, &present);
    case 1: return str_or_null(c, &L->reasoning_content, &present);
    case 2: return str_or_null(c, &L->reasoning, &present);
    default: { /* tool calls are assembled by Python: only an absent, null or empty list stays here */
        if (is_null(c)) {
            c->p += 4;
            return P_OK;
        }
        if (c->p >= c->end || *c->p != '[')
            return P_NO;
        const unsigned char *q = c->p + 1;
        while (q < c->end && (*q == ' ' || *q == '\t'))
            q++;
        if (q >= c->end || *q != ']')
            return P_NO;
        c->p = q + 1;
        return P_OK;
    }
    }
}

static int choice_member(cur_t *c, line_t *L, int k) {
    int present;
    switch (k) {
    case 0: return members(c, L, DELTA, 1, &L->delta_truthy, delta_member);
    case 1: return str_or_null(c, &L->text, &present);
    default: return str_or_null(c, &L->finish, &present);
    }
}

static int choices(cur_t *c, line_t *L) {
    if (is_null(c)) {
        c->p += 4;
        return P_OK;
    }
    int more, rc = js_open_bracket(c, '[', &more);
    if (rc || !more)
        return rc;
    rc = members(c, L, CHOICE, 0, NULL, choice_member);
    if (rc)
        return rc;
    L->nchoices = 1;
    js_ws(c);
    if (c->p >= c->end || *c->p != ']')
        return P_NO; /* several choices (n > 1): Python's */
    c->p++;
    c->depth--;
    return P_OK;
}

static int top_member(cur_t *c, line_t *L, int k) {
    switch (k) {
    case 0: return str_or_null(c, &L->id, &L->id_str);
    case 1: /* an error event: Python raises it as the failure reason */
    case 4: /* vLLM's per-request metrics (--enable-per-request-metrics): Python reads them */
        if (!is_null(c))
            return P_NO;
        c->p += 4;
        return P_OK;
    case 2: return members(c, L, USAGE, 1, &L->usage_truthy, usage_member);
    default: return choices(c, L);
    }
}

static int top(cur_t *c, line_t *L) {
    int rc = members(c, L, TOP, 0, NULL, top_member);
    if (rc)
        return rc;
    js_ws(c);
    return c->p == c->end ? P_OK : P_NO;
}

/* ---- one line, as StreamState.feed takes it ---- */

static int py_space(unsigned char ch) { /* bytes.strip()'s whitespace */
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\x0b' || ch == '\x0c';
}

static void strip(const unsigned char **p, const unsigned char **end) {
    while (*p < *end && py_space(**p))
        (*p)++;
    while (*end > *p && py_space((*end)[-1]))
        (*end)--;
}

static int starts(const unsigned char *p, const unsigned char *end, const char *word) {
    size_t n = strlen(word);
    return (size_t)(end - p) >= n && memcmp(p, word, n) == 0;
}

static void line_free(line_t *L) {
    free(L->id.p);
    free(L->content.p);
    free(L->reasoning_content.p);
    free(L->reasoning.p);
    free(L->text.p);
    free(L->finish.p);
}

static int add_chunk(sse_state *st, double offset, long long tokens) {
    if (st->n == st->cap) {
        size_t cap = st->cap ? st->cap * 2 : 64;
        double *o = realloc(st->offsets, cap * sizeof(double));
        if (!o)
            return P_MEM;
        st->offsets = o;
        long long *t = realloc(st->tokens, cap * sizeof(long long));
        if (!t)
            return P_MEM;
        st->tokens = t;
        st->cap = cap;
    }
    if (st->late && st->n && st->offsets[st->n - 1] == offset)
        st->late_merged++;
    st->offsets[st->n] = offset;
    st->tokens[st->n] = tokens;
    st->n++;
    st->streamed += tokens;
    return P_OK;
}

static double offset_of(const sse_state *st, int64_t ns) {
    return stamp_seconds(ns) - st->start_perf; /* as Python computes it from the stamp it would get */
}

/* commit a parsed line: StreamState.feed's updates, in its order */
static int commit(sse_state *st, line_t *L, int64_t stamp_ns) {
    int rc;
    if (!st->has_id && L->id_str) {
        if ((rc = sse_buf_add(&st->id, L->id.p ? L->id.p : "", L->id.len)))
            return rc;
        st->has_id = 1;
    }
    int have_new = 0;
    long long new_tokens = 0;
    if (L->usage_truthy) {
        long long before = st->completion < 0 ? 0 : st->completion;
        if (L->has_prompt)
            st->prompt = L->prompt;
        if (L->has_completion)
            st->completion = L->completion;
        if (L->has_cached)
            st->cached = L->cached;
        if (L->has_reasoning)
            st->reasoning_reported = L->reasoning_tokens;
        if (L->nchoices && (st->continuous || st->streamed == 0)) {
            st->continuous = 1;
            new_tokens = (st->completion < 0 ? 0 : st->completion) - before;
            have_new = 1;
        } /* else: a server's one usage, in its last choice's chunk: the final count, not this chunk's tokens */
    }
    if (L->nchoices) {
        sse_buf *text;
        int answer;
        if (L->delta_truthy) {
            /* content or "", then reasoning_content or reasoning or "" */
            sse_buf *reasoning = L->reasoning_content.len ? &L->reasoning_content : &L->reasoning;
            if (L->content.len && (rc = sse_buf_add(&st->content, L->content.p, L->content.len)))
                return rc;
            if (reasoning->len && (rc = sse_buf_add(&st->reasoning, reasoning->p, reasoning->len)))
                return rc;
            text = L->content.len ? &L->content : reasoning;
            answer = L->content.len > 0; /* tool calls, an answer too, are Python's */
        } else {
            text = &L->text;
            if (text->len && (rc = sse_buf_add(&st->content, text->p, text->len)))
                return rc;
            answer = text->len > 0;
        }
        if (answer && !st->has_answer) {
            st->has_answer = 1;
            st->answer_at = offset_of(st, stamp_ns);
        }
        if (text->len && (rc = sse_buf_add(&st->text, text->p, text->len)))
            return rc;
        if (L->finish.len) {
            st->finish.len = 0;
            if ((rc = sse_buf_add(&st->finish, L->finish.p, L->finish.len)))
                return rc;
        }
        if (!have_new)
            new_tokens = text->len ? 1 : 0;
    }
    if (new_tokens && (rc = add_chunk(st, offset_of(st, stamp_ns), new_tokens)))
        return rc;
    if (new_tokens && !st->has_answer) /* the thinking phase: every token until the answer's first */
        st->reasoning_streamed += new_tokens;
    return P_OK;
}

int sse_line(sse_state *st, const char *line, size_t len, int64_t stamp_ns) {
    if (st->limit > 0 && st->streamed > st->limit)
        return SSE_PYTHON; /* past its limit: Python cuts the stream */
    const unsigned char *p = (const unsigned char *)line, *end = p + len;
    strip(&p, &end);
    if (p == end || *p == ':')
        return SSE_OK; /* an event separator, or a comment (keep-alive) */
    if (!starts(p, end, "data:")) {
        if (starts(p, end, "event:") || starts(p, end, "id:") || starts(p, end, "retry:"))
            return SSE_OK;
        return SSE_PYTHON; /* malformed SSE: Python's StreamError */
    }
    p += 5;
    strip(&p, &end);
    if ((size_t)(end - p) == 6 && memcmp(p, "[DONE]", 6) == 0) {
        if (!st->done) {
            st->done = 1;
            st->done_at = offset_of(st, stamp_ns);
        }
        return SSE_OK;
    }
    if (st->done)
        return SSE_PYTHON; /* data after [DONE] */
    line_t L;
    memset(&L, 0, sizeof L);
    cur_t c = {p, end, 0};
    int rc = top(&c, &L);
    if (rc == P_OK)
        rc = commit(st, &L, stamp_ns);
    line_free(&L);
    if (rc == P_MEM)
        return SSE_NOMEM;
    if (rc == P_NO)
        return SSE_PYTHON;
    return SSE_OK;
}

static PyObject *text_of(const sse_buf *b) {
    return PyUnicode_DecodeUTF8(b->p ? b->p : "", (Py_ssize_t)b->len, "strict");
}

static PyObject *count_of(long long v) {
    if (v < 0)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(v);
}

static PyStructSequence_Field parsed_fields[] = {
    {"offsets", "each token-bearing chunk's receive time, seconds after the request's start"},
    {"tokens", "the tokens each of those chunks carried"},
    {"response_id", "the stream's id (None: none seen)"},
    {"content", "the answer's text"},
    {"reasoning", "the reasoning's text"},
    {"text", "a completion's text"},
    {"finish_reason", "the last finish_reason seen (None: none)"},
    {"prompt_tokens", "the server's usage: prompt tokens (None: no usage)"},
    {"completion_tokens", "its completion tokens"},
    {"cached_tokens", "its prompt tokens served from the prefix cache"},
    {"continuous", "usage came with every chunk (continuous_usage_stats)"},
    {"done", "the [DONE] line was seen"},
    {"done_at", "its offset (None: not seen)"},
    {"answer_at", "the answer's first chunk's offset (None: no answer)"},
    {"reasoning_streamed", "reasoning chunks' tokens"},
    {"reasoning_reported", "the usage's reasoning_tokens (None: not given)"},
    {"late_merged", "chunk gaps of 0 made by a late read"},
    {NULL, NULL}};
PyStructSequence_Desc sse_parsed_desc = {"_rxnative.Parsed",
                                         "What the SSE parser made of a body's lines (StreamState.absorb takes it).",
                                         parsed_fields, 17};
PyTypeObject *SseParsedType;

PyObject *named_result(PyTypeObject *type, int n, PyObject **items) {
    PyObject *out = NULL;
    int ok = 1;
    for (int i = 0; i < n; i++)
        ok = ok && items[i];
    if (ok)
        out = PyStructSequence_New(type);
    if (!out) {
        for (int i = 0; i < n; i++)
            Py_XDECREF(items[i]);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        PyStructSequence_SET_ITEM(out, i, items[i]);
    return out;
}

PyObject *sse_result(const sse_state *st) {
    PyObject *offsets = PyList_New((Py_ssize_t)st->n), *tokens = PyList_New((Py_ssize_t)st->n);
    if (!offsets || !tokens)
        goto fail;
    for (size_t i = 0; i < st->n; i++) {
        PyObject *o = PyFloat_FromDouble(st->offsets[i]), *t = PyLong_FromLongLong(st->tokens[i]);
        if (!o || !t) {
            Py_XDECREF(o);
            Py_XDECREF(t);
            goto fail;
        }
        PyList_SET_ITEM(offsets, (Py_ssize_t)i, o);
        PyList_SET_ITEM(tokens, (Py_ssize_t)i, t);
    }
    PyObject *items[] = {
        offsets,
        tokens,
        st->has_id ? text_of(&st->id) : Py_NewRef(Py_None),
        text_of(&st->content),
        text_of(&st->reasoning),
        text_of(&st->text),
        st->finish.len ? text_of(&st->finish) : Py_NewRef(Py_None),
        count_of(st->prompt),
        count_of(st->completion),
        count_of(st->cached),
        PyBool_FromLong(st->continuous),
        PyBool_FromLong(st->done),
        st->done ? PyFloat_FromDouble(st->done_at) : Py_NewRef(Py_None),
        st->has_answer ? PyFloat_FromDouble(st->answer_at) : Py_NewRef(Py_None),
        PyLong_FromLongLong(st->reasoning_streamed),
        count_of(st->reasoning_reported),
        PyLong_FromLongLong(st->late_merged),
    };
    enum { N = sizeof items / sizeof items[0] };
    _Static_assert(N == 17, "Parsed has 17 fields");
    return named_result(SseParsedType, N, items);
fail:
    Py_XDECREF(offsets);
    Py_XDECREF(tokens);
    return NULL;
}
