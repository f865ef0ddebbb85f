"""What generates load, in a local runner or a worker: prompt pools, requests in flight and their drain, this
process's stats and request log, the open-loop schedule, the client's own health monitor. A master has none."""

from __future__ import annotations

import dataclasses
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import gevent.event

from vllm_load.client.direct import Connections
from vllm_load.errors import EXIT_BAD_INPUT, EXIT_OUTPUT, OutputError
from vllm_load.client.record import RequestRecord
from vllm_load.client.pooling import POOLING, embeddings_request, rerank_request
from vllm_load.client.responses import responses_request
from vllm_load.client.stream import BodyDefaults, ReadyRequest, ready_request
from vllm_load.metrics.client_health import ClientMonitor
from vllm_load.metrics.slo import goodput_thresholds, parse_slo_option
from vllm_load.metrics.stats import LLMStats
from vllm_load.plugin import gc_control
from vllm_load.plugin.plan import RunPlan
from vllm_load.plugin.target import DEFAULT_OUTPUT_TOKENS, body_defaults, request_headers
from vllm_load.plugin.warmup import warm_up
from vllm_load.rundir.reqlog import RequestLog
from vllm_load.workload.arrivals import ArrivalProcess
from vllm_load.workload.datasets import DatasetSource, answer_tokens_per_record, read_records
from vllm_load.workload.lengths import LengthSpec, parse_length
from vllm_load.workload.media import ImageSize, MediaMaker, parse_image_size
from vllm_load.workload.prompt_pool import PromptPool, token_thread
from vllm_load.workload.prompts import Prompt, PromptFactory, prompt_api
from vllm_load.workload.tokenizer import Tokenizer, encode_in_calling_thread, load_tokenizer

#: GIL switch interval in load-generating processes (seconds)
SWITCH_INTERVAL = 0.0005


@dataclass
class Generator:
    role: str  # "local" or "worker"
    opts: Any  # Locust's parsed options, read only
    plan: RunPlan
    worker_id: str
    #: this process's place in the swarm (Locust's worker index; 0 for a local run): what its prompts' content
    #: and its random draws derive from, the same run after run (the worker id is new every time)
    worker_index: int = 0
    stats: LLMStats = field(default_factory=LLMStats)
    reqlog: RequestLog | None = None
    tokenizer: Tokenizer | None = None
    factories: dict[str, PromptFactory] = field(default_factory=dict)
    pools: dict[str, PromptPool] = field(default_factory=dict)
    rng: random.Random = field(default_factory=random.Random)
    input_spec: LengthSpec | None = None
    output_spec: LengthSpec | None = None
    headers: dict[str, str] = field(default_factory=dict)
    start_wall: float = field(default_factory=time.time)
    start_perf: float = field(default_factory=time.perf_counter)  # start_wall on the perf_counter clock
    dataset: DatasetSource | None = None
    goodput_limits: dict = field(default_factory=dict)
    arrival_seq: int = 0
    step: int | None = None  # current sweep step
    step_rate: float = 0.0  # open-loop rate of the current sweep step
    rate_changed: Any = None  # gevent Event, set (and replaced) when a sweep step changes the open-loop rate
    step_stats: dict = field(default_factory=dict)  # step -> LLMStats of this process's requests
    monitor: ClientMonitor | None = None  # this process's CPU, loop lag and CPU wait
    draining: bool = False  # set at the end of a run: users start no new request
    fold_slice: int = 256  # chunks per fold slice, by the reader the run's target gets (FOLD_SLICE_*)
    in_flight: int = 0
    idle: Any = None  # gevent Event, set while no request is in flight
    folder: Any = None  # greenlet folding finished requests into the stats while the loop is idle
    answer_tokens_per_record: int = 0  # --dataset-batch: output budget per batched record
    #: a failure every request would repeat (prompts cannot be built): the plugin stops the run with it
    on_fatal: Any = field(default=lambda message, code=EXIT_BAD_INPUT: None)
    #: one native thread for the users' own token work (self.llm.text, counting a history): off the event
    #: loop like the prompt pool's, and one thread so that the text factory's sequence stays ordered
    helper: Any = None
    text_factory: PromptFactory | None = None
    defaults: BodyDefaults = field(default_factory=BodyDefaults)  # what every body carries (--temperature, …)
    trace: list = field(default_factory=list)  # this process's share of --trace's rows, in time order
    trace_next: int = 0
    trace_sent: int = 0  # rows of this process's share sent so far
    on_trace_done: Any = field(default=lambda: None)  # told once every row of the share is sent and back
    step_started: float = 0.0  # wall time the current sweep step began (its warm-up counts from there)
    model_turn: int = 0  # --model a,b: the next request's model is models[model_turn % len]
    #: --num-requests: this process's share, the tickets held by requests started (a warm-up request gives its
    #: ticket back when it finishes), the counted requests finished, and an event set when a ticket comes back
    quota: int = 0
    tickets: int = 0
    counted: int = 0
    ticket_back: Any = None
    #: images and audio: the prompt thread's maker (the workload's) and the helper thread's (self.llm.image)
    pool_media: MediaMaker | None = None
    helper_media: MediaMaker | None = None
    image_size: ImageSize | None = None

    @property
    def source(self) -> str:
        return f"w{self.worker_index}"

    @classmethod
    def create(cls, role: str, opts: Any, plan: RunPlan, worker_id: str, apis: frozenset[str] = frozenset(),
               on_fatal: Any = None, health_sink: Any = None, worker_index: int = 0,
               on_trace_done: Any = None) -> Generator:
        """A load-generating process fills the prompt pools of ``apis`` (the users' APIs) before it returns, so
        that its users, spawned next, never wait for a first prompt (an open-loop schedule would count it)."""
        rt = cls(role=role, opts=opts, plan=plan, worker_id=worker_id, worker_index=worker_index)
        rt.fold_slice = cls.FOLD_SLICE_NATIVE if Connections.reads_natively(plan.host) else cls.FOLD_SLICE_PYTHON
        if on_fatal is not None:  # before the pools start: their first prompts may already fail
            rt.on_fatal = on_fatal
        if on_trace_done is not None:
            rt.on_trace_done = on_trace_done
        rt.quota = plan.share(worker_index) if plan.num_requests else 0
        rt.ticket_back = gevent.event.Event()
        plan.files.path.mkdir(parents=True, exist_ok=True)
        rt.idle = gevent.event.Event()
        rt.idle.set()
        rt.rate_changed = gevent.event.Event()
        # The prompt thread holds the GIL in turns of the switch interval (5 ms by default), and
        # every stream read waiting behind it is late by as much: keep the turns short.
        sys.setswitchinterval(SWITCH_INTERVAL)
        rt._prepare_generation()
        rt._fill_pools(apis)
        encode_in_calling_thread()  # the prompt thread's encodes at its own (low) priority from here on
        rt.start_wall = time.time()  # this process's load starts now, not before its pools were ready
        rt.start_perf = time.perf_counter()  # the same instant on the clock the schedules use
        warm_up()  # before the heap is frozen: what it loads is start-up heap too
        # before the loop-lag monitor starts: the one full collection here takes ~0.1 s
        gc_control.freeze_startup_heap()  # collections run from _fold_when_idle instead
        rt.monitor = ClientMonitor(lambda: rt.in_flight, health_sink)  # local: reports go straight to the collector
        rt.monitor.start()
        rt.folder = gevent.spawn(rt._fold_when_idle)
        return rt

    def _prepare_generation(self) -> None:
        o = self.opts
        self.input_spec = parse_length(o.input_tokens, "--input-tokens")
        self.output_spec = parse_length(o.output_tokens or DEFAULT_OUTPUT_TOKENS, "--output-tokens")
        self.tokenizer = load_tokenizer(self.plan.tokenizer)
        self.rng = random.Random(f"{self.plan.draws}/{self.source}/lengths")
        self.headers = request_headers(o)
        self.defaults = body_defaults(o, self.plan.server_kind)
        self.goodput_limits = goodput_thresholds(parse_slo_option(list(self.plan.slos)))
        if o.dataset:
            records = read_records(o.dataset, o.dataset_format, o.dataset_field)
            self.dataset = DatasetSource(records, f"{self.plan.draws}/{self.source}", o.dataset_batch)
            if o.dataset_batch:
                self.answer_tokens_per_record = o.dataset_answer_tokens or answer_tokens_per_record(
                    self.tokenizer, o.dataset_batch)
        if o.trace:
            from vllm_load.workload.trace import read_trace, share

            self.trace = share(read_trace(o.trace, o.trace_format), self.worker_index, self.plan.processes)
            if not self.trace:  # more processes than rows: nothing to send here
                gevent.spawn(self.on_trace_done)
        self.reqlog = RequestLog(self.plan.files.requests(None if self.role == "local" else self.worker_id))

    #: longest wait for the first prompts of the run (a 32k-token prompt takes ~0.2 s to build)
    FIRST_PROMPT_TIMEOUT = 120.0

    def _fill_pools(self, apis: frozenset[str]) -> None:
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
        if api == "responses":
            return self._responses_request()
        prompt, max_tokens = self.new_prompt(api)
        model, group = self.next_model()
        return ready_request(api, model, prompt, max_tokens, self.defaults, group,
                             self._media_parts() if api == "chat" else None)

    def _media_parts(self) -> list[dict[str, Any]] | None:
        """--images-per-request unique images of --image-size, and a --audio-seconds clip (chat.py), made in the
        prompt thread."""
        images = int(getattr(self.opts, "images_per_request", 0) or 0)
        seconds = float(getattr(self.opts, "audio_seconds", 0.0) or 0.0)
        if not images and seconds <= 0:
            return None
        if self.pool_media is None:
            self.pool_media = MediaMaker(self.plan.salt, f"{self.source}/pool")
            self.image_size = parse_image_size(self.opts.image_size)
        assert self.image_size is not None
        parts = [self.pool_media.image_part(*self.image_size.sample(self.rng)) for _ in range(images)]
        return parts + ([self.pool_media.audio_part(seconds)] if seconds > 0 else [])

    def media_part(self, kind: str, *args: Any) -> dict[str, Any]:
        """A user's own image or clip (``self.llm.image``/``audio``), made in the helper thread."""
        if self.helper_media is None:
            self.helper_media = MediaMaker(self.plan.salt, f"{self.source}/helper")
        make = self.helper_media.image_part if kind == "image" else self.helper_media.audio_part
        return self.offload(make, *args)

    def _responses_request(self) -> ReadyRequest:
        """A Responses API request of the run's workload: a chat prompt as its input items, built
        ``special_tokens_added`` short of the asked length, as vLLM adds them to a Responses input."""
        assert self.input_spec is not None and self.output_spec is not None and self.tokenizer is not None
        extra = self.tokenizer.special_tokens_added
        prompt = self.factory("responses").make(self.input_spec.sample(self.rng) - extra)
        model, group = self.next_model()
        return responses_request(model, prompt.messages, prompt.tokens + extra, self.output_spec.sample(self.rng),
                                 defaults=self.defaults, group=group)

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
                                  group=group)
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

    def next_model(self) -> tuple[str, str | None]:
        """The next request's model, rotating over --model a,b, and its metrics group (None with one model)."""
        models = self.plan.models or (self.plan.model,)
        model = models[self.model_turn % len(models)]
        self.model_turn += 1
        return model, (model if len(models) > 1 else None)

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

    def set_step(self, step: int, rate: float) -> None:
        """Enter a sweep step; open-loop users waiting on a gap drawn at the old rate wake and redraw."""
        changed = rate != self.step_rate
        self.step, self.step_rate = step, rate
        self.step_started = time.time()
        if changed:
            self.rate_changed, old = gevent.event.Event(), self.rate_changed
            old.set()

    def current_rate(self) -> float:
        """The open-loop rate now: the sweep step's in a rate sweep, else --request-rate (0: closed loop)."""
        if self.step is not None and self.opts.sweep_mode == "rate":
            return self.step_rate
        return float(self.opts.request_rate)

    def total_users(self) -> int:
        if self.step is not None and self.opts.sweep_mode == "rate":
            return max(1, int(self.opts.sweep_users))
        return self.plan.total_users

    def arrival_process(self) -> ArrivalProcess:
        """This user's share of the run's open-loop rate (the total is split over all users)."""
        self.arrival_seq += 1
        return ArrivalProcess(self.current_rate() / self.total_users(), self.opts.burstiness,
                              random.Random(f"{self.plan.draws}/{self.source}/arrivals/{self.arrival_seq}"),
                              float(self.opts.ramp_up))

    def begin_request(self) -> None:
        """A request is about to start. With --num-requests it first takes one of this process's tickets, and
        waits for one to come back (a warm-up request's) once they are all taken."""
        if self.plan.num_requests:
            if self.quota == 0:  # more processes than requests: this one sends none
                self.park()
            while self.tickets >= self.quota:
                self.ticket_back.wait()
                if self.draining:
                    self.park()
            self.tickets += 1
        self.in_flight += 1
        self.idle.clear()

    def _give_back(self) -> None:
        self.tickets -= 1
        self.ticket_back, back = gevent.event.Event(), self.ticket_back
        back.set()

    @staticmethod
    def park() -> None:
        """Block until Locust stops this user (a user that stopped itself would leave Locust a dead
        greenlet it logs as an error)."""
        gevent.event.Event().wait()

    def end_request(self, sent: bool = True) -> None:
        """A request counted by begin_request is over (recorded, or never sent: its ticket comes back): a drain
        may be waiting."""
        if not sent and self.plan.num_requests:
            self._give_back()
        self.in_flight -= 1
        if self.in_flight <= 0:
            self.in_flight = 0
            self.idle.set()

    def drain(self, timeout: float) -> bool:
        """Start no new request and wait (at most ``timeout`` s) for the ones in flight to finish."""
        self.draining = True
        drained = bool(self.idle.wait(timeout))
        self.flush_log()  # what the end of the run reads is all written
        return drained

    def flush_log(self, wait: bool = True) -> None:
        """Write the request log's kept records (its writer thread takes them in batches); ``wait``: until
        they are in the file."""
        if self.reqlog:
            try:
                self.reqlog.flush(wait)
            except OutputError as exc:  # said at once; the run stops and still gives its verdict
                self.on_fatal(str(exc), EXIT_OUTPUT)

    def in_warmup(self, rec: RequestRecord) -> bool:
        """Started within --warmup of the run's start, or of its sweep step's (a new level's first seconds)."""
        w = self.plan.warmup
        if w <= 0:
            return False
        return rec.start < self.start_wall + w or (rec.step is not None and rec.step == self.step
                                                   and rec.start < self.step_started + w)

    def on_record(self, rec: RequestRecord) -> None:
        self.end_request()
        if self.in_warmup(rec):
            if self.plan.num_requests:
                self._give_back()
            rec.warmup = True
            self.stats.warmup_excluded += 1
            if rec.step is not None:
                self.step_stats.setdefault(rec.step, LLMStats()).warmup_excluded += 1
            if self.reqlog:
                self.reqlog.write(rec)
            return
        if self.goodput_limits:
            rec.good = rec.ok and all(
                (value := getattr(rec, metric)) is not None and value <= limit
                for metric, limit in self.goodput_limits.items()
            )
        self.stats.add(rec)
        if rec.step is not None:
            self.step_stats.setdefault(rec.step, LLMStats()).add(rec)
        if self.reqlog:
            self.reqlog.write(rec)
        if self.plan.num_requests:
            self.counted += 1
            if self.counted == self.quota:  # this process's share finished: the run ends once every share has
                gevent.spawn(self.on_trace_done)

    #: chunks folded per slice: the longest a slice holds the loop. With the Python reader (no native
    #: build, or a TLS target) a slice delays the chunks that land meanwhile (256: ~0.5 ms); with the native
    #: reader their stamps are already taken, so slices can be 8x larger (~1 ms), which numpy folds for a
    #: quarter of the CPU per request
    FOLD_SLICE_PYTHON = 256
    FOLD_SLICE_NATIVE = 2048
    #: requests pending before a fold is worth its fixed cost (numpy's per-call overhead: folding 4
    #: requests at a time costs 66 us per request, 64 at a time 15 us; with the histograms' C recorder,
    #: _hdrnative.c, 15 and 1.9 us, 32 at a time 2.7 us), unless FOLD_EVERY_S passed
    FOLD_BATCH = 32
    FOLD_EVERY_S = 0.25

    def _fold_when_idle(self) -> None:
        """Fold finished requests into the stats in short slices, only when the event loop has nothing
        else to run: the reading greenlets (and their timestamps) always go first. Whatever is still
        pending when the stats are read (every report) is folded then."""
        last = time.monotonic()
        while True:
            gevent.idle()
            self.flush_log(wait=False)
            if gc_control.collect_if_due() >= 0:
                continue
            busy = [s for s in (self.stats, *self.step_stats.values()) if s.pending]
            if not busy or (sum(s.pending for s in busy) < self.FOLD_BATCH
                            and time.monotonic() - last < self.FOLD_EVERY_S):
                gevent.sleep(0.05)
                continue
            busy[0].fold(self.fold_slice)
            last = time.monotonic()

    def reset_metrics(self) -> None:
        """Locust's --reset-stats / the web UI's Reset: this process's LLM metrics start over, in place (the
        folder and the collector of a local run hold these objects), the instant Locust resets its table."""
        self.stats.__init__()  # type: ignore[misc]
        for s in self.step_stats.values():
            s.__init__()  # type: ignore[misc]
        if self.monitor is not None:
            self.monitor.take()

    def close(self) -> None:
        if self.folder is not None:
            self.folder.kill(block=False)
            gc_control.restore()
        if self.monitor is not None:
            self.monitor.stop()
        for pool in self.pools.values():
            pool.close()
        if self.helper is not None:
            self.helper.kill()
        if self.reqlog:
            self.reqlog.close()



@dataclass
class _Raised:
    exc: BaseException


def _capture(fn: Any, args: tuple) -> Any:
    """Return the exception instead of raising it in the thread: gevent's threadpool would print it."""
    try:
        return fn(*args)
    except Exception as exc:
        return _Raised(exc)
