/* The receive thread's SSE parser (_sse.c): what StreamState.feed (client/sse.py) makes of a streamed
 * OpenAI/vLLM body, computed in C as each line is cut, so the event loop touches a body once, at its end. */
#ifndef VLLM_LOAD_SSE_H
#define VLLM_LOAD_SSE_H

#include <Python.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *p;
    size_t len, cap;
} sse_buf;

typedef struct {
    double start_perf;  /* the request's start (the stamps' perf_counter clock): offsets count from it */
    double *offsets;    /* token-bearing chunks: their stamps minus start_perf */
    long long *tokens;  /* and how many tokens each carried */
    size_t n, cap;
    sse_buf id, content, reasoning, text, finish;
    int has_id;
    long long prompt, completion, cached; /* -1: not reported */
    int continuous, done;
    double done_at; /* the [DONE] line's offset */
    /* limit: once more tokens than this were streamed, every later line goes to Python, whose StreamState (with
     * the same limit) ends the stream as a protocol failure (a server running past max_tokens); 0: none */
    long long limit, streamed;
    /* a reasoning model's phases (StreamState.answer_at, reasoning_streamed, reasoning_reported) */
    int has_answer;
    double answer_at;            /* the first answer chunk's offset (content or text, not reasoning) */
    long long reasoning_streamed; /* tokens of the chunks before the answer's first */
    long long reasoning_reported; /* usage.completion_tokens_details.reasoning_tokens; -1: not reported */
    /* late: the segment being parsed was read over 1 ms after it landed (set by the reader per read);
     * late_merged: chunk gaps of 0 such a read made (a chunk under the stamp of the one before it): the only
     * way a late read moves a measured time. Gaps of 0 from on-time reads are the server's (or a proxy's):
     * it wrote the chunks together. */
    int late;
    long long late_merged;
} sse_state;

enum { SSE_OK = 0, SSE_PYTHON = 1, SSE_NOMEM = -1 };

/* a stamp (on CLOCK_MONOTONIC: perf_counter) as the float the thread hands Python (lines' stamps, send stamps), and from which
 * the parser's offsets are computed: one conversion, so an offset is bit for bit what Python would compute */
static inline double stamp_seconds(int64_t ns) {
    return (double)(ns / 1000000000LL) + (double)(ns % 1000000000LL) * 1e-9;
}

sse_state *sse_new(double start_perf);
void sse_free(sse_state *st);
/* One line (its newline included), stamped stamp_ns. SSE_OK: taken; SSE_PYTHON: a line this parser leaves
 * to StreamState.feed (an error event, tool calls, several choices, anything malformed or unusual), with
 * nothing of it taken: that line and every later one go to Python; SSE_NOMEM. */
int sse_line(sse_state *st, const char *line, size_t len, int64_t stamp_ns);
/* What StreamState.absorb takes: a Parsed (a struct sequence, its fields named in _sse.c's parsed_fields). */
PyObject *sse_result(const sse_state *st);
/* a struct sequence of ``type`` from ``n`` new references (NULL, with every one released, if any is NULL): the
 * module's named results, Parsed among them */
PyObject *named_result(PyTypeObject *type, int n, PyObject **items);
/* Parsed's description, and its type once the module made it (_rxnative.c's init) */
extern PyStructSequence_Desc sse_parsed_desc;
extern PyTypeObject *SseParsedType;

#endif
