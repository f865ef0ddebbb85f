"""A test locustfile (not shipped): a user's own multimodal chat through the public API (an image, an audio
clip and a video beside the text)."""

from locust import task

from vllm_load import LLMUser


class Looker(LLMUser):
    @task
    def look(self) -> None:
        content = [{"type": "text", "text": self.llm.text(30)}, self.llm.image(width=280, height=140),
                   self.llm.audio(seconds=2.0), self.llm.video(frames=4, width=56, height=56)]
        self.llm.chat([{"role": "user", "content": content}], max_tokens=6, name="look")
