"""What one user sends: the LLM client a locustfile calls (self.llm) and its kinds of request, the request source that prepares prompts, the HTTP session."""
