"""Streaming speech to text (/v1/audio/transcriptions, a Whisper-style model): `locust -f locustfiles/transcription.py
[--host URL] [--audio-seconds 5 | --audio-from DIR]`.

With no --host, the built-in vLLM emulator is started on 127.0.0.1 and used as the target.
"""

from vllm_load.plugin.load.users import TranscriptionUser  # noqa: F401  (Locust collects the User classes of this module)
