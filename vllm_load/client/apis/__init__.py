"""Each API's request and answer: OpenAI's chat, completions and embeddings (openai_api), Anthropic's Messages, OpenAI's Responses, the pooling APIs and speech to text."""
