"""What a load-generating process sends: the run's workload built ahead in the prompt thread (exact-length
unique prompts, datasets, trace rows, pooling inputs, images and audio), model rotation, and the helper
thread's work for users' own requests (texts, token counts, media). One per process, built at the run's
start from its plan (``Generator.create``); the generator records what comes back."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any, Callable

import gevent

from vllm_load.client.apis.pooling import POOLING, embeddings_request, rerank_request
from vllm_load.client.apis.audio import TASKS
from vllm_load.client.apis.messages import messages_request
from vllm_load.client.apis.responses import responses_request
from vllm_load.client.stream import BodyDefaults, ReadyRequest, build_request, ready_request
from vllm_load.plugin.requests.llm_speech import workload_request as speech_request
from vllm_load.plugin.prepare.plan import RunPlan
from vllm_load.options import DEFAULT_OUTPUT_TOKENS
from vllm_load.plugin.prepare.target import body_defaults
from vllm_load.workload.inputs.datasets import DatasetSource, answer_tokens_per_record, read_records
from vllm_load.workload.history import HistoryCounter
from vllm_load.workload.lengths import parse_length
from vllm_load.workload.media import MediaMaker, WorkloadMedia
from vllm_load.workload.cancel import parse_cancel
from vllm_load.workload.graded import GradedMix, Item, parse_accuracy
from vllm_load.workload.model_mix import ModelMix
from vllm_load.workload.structured import parse_response_format
from vllm_load.workload.prompt_pool import PromptPool, token_thread
from vllm_load.workload.prompts import Prompt, PromptFactory, prompt_api
from vllm_load.workload.tokenizer import load_tokenizer


class RequestSource:
    """The requests of one load-generating process."""

    #: longest wait for the first prompts of the run (a 32k-token prompt takes ~0.2 s to build)
    FIRST_PROMPT_TIMEOUT = 120.0

    def __init__(self, opts: Any, plan: RunPlan, worker_index: int, on_fatal: Callable[[str], None],
                 on_trace_done: Callable[[], None], idle: Any) -> None:
        o = self.opts = opts
        self.plan = plan
        #: this process's place in the swarm: what its prompts' content and its random draws derive from, the
        #: same run after run (a worker's id is new every time)
        self.source = f"w{worker_index}"
        self.on_fatal, self.on_trace_done, self.idle = on_fatal, on_trace_done, idle
        self.input_spec = parse_length(o.input_tokens, "--input-tokens")
        self.output_spec = parse_length(o.output_tokens or DEFAULT_OUTPUT_TOKENS, "--output-tokens")
        # Off the event loop: loading a tokenizer is ~1 s of CPU (transformers' import, a SentencePiece
        # conversion) and a dataset may be large. On a loop it blocked Locust's heartbeats: with 10 CPU hogs on
        # 2 cores both workers of `--processes 2` went quiet for over 3 s at spawn and Locust stopped the test
        # (2 of 2 runs); see tests/test_busy_host.py.
        self.tokenizer = off_loop(load_tokenizer, plan.tokenizer)
        #: users' own chat counts (``self.llm.chat``), in the helper thread: a turn counted from its history
        self.history = HistoryCounter(self.tokenizer)
        self.rng = random.Random(f"{plan.draws}/{self.source}/lengths")
        self.defaults: BodyDefaults = body_defaults(o, plan.server_kind)  # what every body carries
        self.factories: dict[str, PromptFactory] = {}
        self.pools: dict[str, PromptPool] = {}
        self.dataset: DatasetSource | None = None
        self.answer_tokens_per_record = 0  # --dataset-batch: output budget per batched record
        self.trace: list = []  # this process's share of --trace's rows, in time order
        self.trace_next = self.trace_sent = 0
        self._read_files(worker_index)
        #: one native thread for the users' own token work (self.llm.text, counting a history): off the event
        #: loop like the prompt pool's, and one thread so that the text factory's sequence stays ordered
        self.helper: Any = None
        self.text_factory: PromptFactory | None = None
        self._mixes(opts, plan)
        #: images and audio: the prompt thread's maker (the workload's) and the helper thread's (self.llm.image)
        self.workload_media: WorkloadMedia | None = None  # the prompt thread's: chat.py's media, speech's clips
        self.helper_media: MediaMaker | None = None

    def _mixes(self, opts: Any, plan: RunPlan) -> None:
        """What each request may become: its model (--model a,b or a:0.6,b:0.4), cut mid-answer (--cancel, with
        this process's count), a graded set's item (--accuracy), its answer checked as JSON (--response-format)."""
        self.models = ModelMix(plan.models or (plan.model,), plan.model_weights)
        self.cancel, self.sent = parse_cancel(getattr(opts, "cancel", "")), 0
        sets = parse_accuracy(getattr(opts, "accuracy", None))
        self.graded = off_loop(GradedMix, sets, f"{plan.draws}/{self.source}/graded") if sets else None
        self.response_format = parse_response_format(getattr(opts, "response_format", ""))

    def _read_files(self, worker_index: int) -> None:
        """--dataset's records and this process's share of --trace's rows, read off the loop."""
        o, plan = self.opts, self.plan
        if o.dataset:
            records = off_loop(read_records, o.dataset, o.dataset_format, o.dataset_field)
            self.dataset = DatasetSource(records, f"{plan.draws}/{self.source}", o.dataset_batch)
            if o.dataset_batch:
                self.answer_tokens_per_record = o.dataset_answer_tokens or answer_tokens_per_record(
                    self.tokenizer, o.dataset_batch)
        if o.trace:
            from vllm_load.workload.inputs.trace import read_trace, share

            self.trace = share(off_loop(read_trace, o.trace, o.trace_format), worker_index, plan.processes)
            if not self.trace:  # more processes than rows: nothing to send here
                gevent.spawn(self.on_trace_done)

    def fill_pools(self, apis: frozenset[str]) -> None:
        """Start each API's pool and wait for its first prompts: the first one of a process pays for the
        tokenizer's word list and the template probes (0.3-0.5 s), which once made the first open-loop
        requests of a run leave 300 ms late and the run look untrustworthy."""
        for api in sorted(apis):
            self.pool(api)
        for api in sorted(apis):
            self.pools[api].ready.wait(self.FIRST_PROMPT_TIMEOUT)

    def pool(self, api: str) -> PromptPool:
        pool = self.pools.get(api)
        if pool is None:
            pool = self.pools[api] = PromptPool(lambda: self.build_request(api), int(self.opts.prompt_pool),
                                                on_error=lambda exc: self.on_fatal(str(exc)))
        return pool

    def factory(self, api: str) -> PromptFactory:
        f = self.factories.get(api)
        if f is None:
            assert self.tokenizer is not None
            f = self.factories[api] = PromptFactory(
                self.tokenizer, prompt_api(api), self.plan.salt, self.source, self.opts.shared_prefix_tokens
            )
        return f

    def offload(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` in the helper thread; this greenlet waits, the other streams go on being read."""
        if self.helper is None:
            self.helper = token_thread()
        result = self.helper.spawn(_capture, fn, args).get()
        if isinstance(result, _Raised):
            raise result.exc
        return result

    def text(self, tokens: int) -> str:
        """Unique text of exactly ``tokens`` tokens as one chat message's content (as a completion prompt's
        body when the tokenizer has no chat template); built in the helper thread."""
        return self.offload(self._make_text, tokens)

    def _helper_factory(self) -> PromptFactory:
        """The prompt factory of the helper thread (users' own texts), apart from the prompt pools' factories:
        each factory's sequence is used by one thread only, so no two texts get the same digest words."""
        assert self.tokenizer is not None
        if self.text_factory is None:
            api = "chat" if self.tokenizer.has_chat_template else "completions"
            self.text_factory = PromptFactory(self.tokenizer, api, self.plan.salt, f"{self.source}/text")  # type: ignore[arg-type]
        return self.text_factory

    def _content(self, prompt: Prompt) -> str:
        """A helper-factory prompt's text as one message's content (or as a completion prompt)."""
        return prompt.messages[-1]["content"] if self._helper_factory().api == "chat" else prompt.text

    def _make_text(self, tokens: int) -> str:
        f = self._helper_factory()
        return self._content(f.make(tokens + f.overhead))

    def _unique_first_turn(self, content: str) -> str:
        return self._content(self._helper_factory().wrap(content))

    def conversation(self) -> list[str]:
        """The next --dataset conversation's user turns; the first behind this run's unique digest words, so
        that no two conversations share a prefix (their later turns follow a unique history already)."""
        if self.dataset is None:
            raise ValueError("no --dataset: self.llm.conversation() replays a dataset's conversations")
        turns = self.dataset.next_conversation()
        turns[0] = self.offload(self._unique_first_turn, turns[0])
        return turns

    def count_output(self, text: str) -> int:
        """Output tokens counted here when the server sent no usage."""
        assert self.tokenizer is not None
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def next_request(self, api: str) -> ReadyRequest:
        """The next ready request, from the pool that a native thread keeps filled."""
        return self.pool(api).get()

    def build_request(self, api: str) -> ReadyRequest:
        """A new request, in the prompt thread: its prompt (exact length, unique), its body's bytes. With a
        trace, the next row of this process's share (StopIteration after its last)."""
        if self.opts.trace:
            return self._trace_request(api)
        if api in POOLING:
            return self._pooling_request(api)
        if api == "chat" and self.graded is not None and (item := self.graded.next()) is not None:
            return self._graded_request(item)
        if api == "responses":
            return self._responses_request()
        if api in TASKS:  # speech to text: a clip, not a prompt
            return speech_request(self, api)
        if api == "messages":
            prompt, max_tokens = self.new_prompt("chat")
            model, group = self.next_model()
            return messages_request(model, prompt.messages, prompt.tokens, max_tokens, defaults=self.defaults,
                                    group=group)
        prompt, max_tokens = self.new_prompt(api)
        model, group = self.next_model()
        return ready_request(api, model, prompt, max_tokens, self.defaults, group,
                             self._media_parts() if api == "chat" else None)

    def _media_parts(self) -> list[dict[str, Any]] | None:
        """Images, a clip and videos after chat.py's prompts (``WorkloadMedia``), made in the prompt thread."""
        return self.media().parts(self.rng) if WorkloadMedia.wanted(self.opts) else None

    def media(self) -> WorkloadMedia:
        """The prompt thread's one maker of the run's media (chat.py's, speech to text's clips): one sequence, so no
        two of its clips or images are the same bytes."""
        if self.workload_media is None:
            self.workload_media = WorkloadMedia(self.opts, self.plan.salt, self.source, self.plan.draws)
        return self.workload_media

    def media_part(self, kind: str, *args: Any) -> dict[str, Any]:
        """A user's own image, clip or video (``self.llm.image``/``audio``/``video``; ``clip``: a WAV's bytes), made
        in the helper thread."""
        if self.helper_media is None:
            self.helper_media = MediaMaker(self.plan.salt, f"{self.source}/helper")
        m = self.helper_media
        return self.offload({"image": m.image_part, "audio": m.audio_part, "clip": m.audio_bytes,
                             "video": m.video_part}[kind], *args)

    def _responses_request(self) -> ReadyRequest:
        """A Responses API request of the run's workload: a chat prompt as its input items, built
        ``special_tokens_added`` short of the asked length, as vLLM adds them to a Responses input."""
        assert self.input_spec is not None and self.output_spec is not None and self.tokenizer is not None
        extra = self.tokenizer.special_tokens_added
        prompt = self.factory("responses").make(self.input_spec.sample(self.rng) - extra)
        model, group = self.next_model()
        return responses_request(model, prompt.messages, prompt.tokens + extra, self.output_spec.sample(self.rng),
                                 defaults=self.defaults, group=group)

    def _graded_request(self, item: Item) -> ReadyRequest:
        """A graded set's next item as a chat request named by its kind, its length the model's (capped)."""
        assert self.tokenizer is not None and self.output_spec is not None
        messages = [{"role": "user", "content": item.prompt}]
        model, _ = self.next_model()
        ready = build_request("chat", model, messages, self.tokenizer.count_chat(messages),
                              self.output_spec.sample(self.rng), group=item.kind,
                              defaults=dataclasses.replace(self.defaults, ignore_eos=False))
        return dataclasses.replace(ready, graded=item.kind, expected=item.expected)

    def _pooling_request(self, api: str) -> ReadyRequest:
        """--batch-size unique texts of --input-tokens each (embeddings), or a query and --batch-size documents
        (rerank: a bi-encoder's count, the query once)."""
        assert self.input_spec is not None
        f, n = self.factory(api), max(1, int(self.opts.batch_size))
        texts = [f.make(self.input_spec.sample(self.rng)) for _ in range(n + (api == "rerank"))]
        model, group = self.next_model()
        tokens = sum(p.tokens for p in texts)
        if api == "rerank":
            return rerank_request(model, texts[0].text, [p.text for p in texts[1:]], tokens, defaults=self.defaults,
                                  group=group, query_tokens=texts[0].tokens)
        return embeddings_request(model, [p.text for p in texts], tokens, defaults=self.defaults, group=group)

    def _trace_request(self, api: str) -> ReadyRequest:
        if self.trace_next >= len(self.trace):
            raise StopIteration
        row = self.trace[self.trace_next]
        self.trace_next += 1
        f = self.factory(api)
        prompt = (f.from_blocks(row.hash_ids, int(self.opts.trace_block_size), row.input_tokens) if row.hash_ids
                  else f.make(row.input_tokens))
        model, group = self.next_model()
        ready = ready_request(api, model, prompt, row.output_tokens, self.defaults, group)
        return dataclasses.replace(ready, due=row.at / float(self.opts.trace_speed), row=row.index)

    def trace_row_sent(self) -> None:
        """One more row of the share is on its way; after the last, wait for them all to come back, then say so."""
        self.trace_sent += 1
        if self.trace_sent == len(self.trace):
            gevent.spawn(self._trace_finished)

    def _trace_finished(self) -> None:
        self.idle.wait()
        self.on_trace_done()

    def cancel_after(self) -> int | None:
        """--cancel: the tokens after which this process's next streamed request is given up (None: not this one)."""
        index, self.sent = self.sent, self.sent + 1
        return self.cancel.after_tokens if self.cancel is not None and self.cancel.cuts(index) else None

    def next_model(self) -> tuple[str, str | None]:
        """The next request's model (--model a,b in turns, a:0.6,b:0.4 in shares) and its metrics group (None with
        one model)."""
        model = self.models.next()
        return model, (model if len(self.models.models) > 1 else None)

    def new_prompt(self, api: str) -> tuple[Prompt, int]:
        """A new prompt (exact length, unique) and the output length to ask for."""
        assert self.input_spec and self.output_spec
        if self.dataset is None:
            prompt = self.factory(api).make(self.input_spec.sample(self.rng))
            return prompt, self.output_spec.sample(self.rng)
        content, answer = self.dataset.next_content()
        prompt = self.factory(api).wrap(content)
        if self.opts.output_tokens:
            return prompt, self.output_spec.sample(self.rng)
        if self.opts.dataset_batch:  # every answer line the instruction asks for, whatever K
            return prompt, self.answer_tokens_per_record * self.opts.dataset_batch
        if answer and self.tokenizer is not None:
            return prompt, max(1, len(self.tokenizer.encode(answer, add_special_tokens=False)))
        return prompt, self.output_spec.sample(self.rng)

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        if self.helper is not None:
            self.helper.kill()


def off_loop(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` in a native thread of gevent's hub while this greenlet waits: the loop (Locust's heartbeats,
    its messages) keeps running. Start-up work only, at the loop's priority; a run's own work goes to the helper
    thread."""
    result = gevent.get_hub().threadpool.spawn(_capture, fn, args).get()
    if isinstance(result, _Raised):
        raise result.exc
    return result


@dataclass
class _Raised:
    exc: BaseException


def _capture(fn: Any, args: tuple) -> Any:
    """Return the exception instead of raising it in the thread: gevent's threadpool would print it."""
    try:
        return fn(*args)
    except Exception as exc:
        return _Raised(exc)
