"""What a run reads from outside to send: datasets and their files, public sets from the Hugging Face cache, traces, recorded and synthetic agent sessions."""
