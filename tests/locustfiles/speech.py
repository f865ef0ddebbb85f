"""A test locustfile (not shipped): a user's own speech-to-text calls through the public API: a generated clip
streamed, a WAV file by its path translated, and a clip's bytes answered whole."""

import os

from locust import task

from vllm_load import LLMUser


class Speech(LLMUser):
    @task
    def listen(self) -> None:
        self.llm.transcribe(seconds=1.5, max_tokens=6, name="generated")
        self.llm.transcribe(os.environ["SPEECH_TEST_WAV"], max_tokens=4, translate=True, name="file")
        with open(os.environ["SPEECH_TEST_WAV"], "rb") as f:
            self.llm.transcribe(f.read(), max_tokens=5, stream=False, prompt="a prior text", name="whole")
