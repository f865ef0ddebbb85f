"""Streaming speech to text (/v1/audio/transcriptions, a Whisper-style model): `locust -f locustfiles/transcription.py
[--host URL] [--audio-seconds 5 | --audio-from DIR]`.

With no --host, the built-in vLLM emulator is started on 127.0.0.1 and used as the target.

The same file ships in the package (vllm_load/locustfiles/transcription.py): `locust -f "$(vllm-load locustfile transcription)"`.
"""

from vllm_load.locustfiles.transcription import *  # noqa: F401,F403  (Locust collects the classes of this module)
