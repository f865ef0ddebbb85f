"""What is sent: the tokenizer, exact-length unique prompts, the prompt pool, datasets, lengths, arrivals."""
