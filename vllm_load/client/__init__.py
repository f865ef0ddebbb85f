"""One streaming request: OpenAI bodies, the SSE parser, kernel receive stamps, the request record."""
