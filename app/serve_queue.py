"""`leapvox serve`'s synthesis queue (encoders: audio.py). One worker thread runs one synthesis at a time (the model
is loaded once and torch already uses every core for one), taking jobs from a bounded queue; a full queue refuses
at once (`QueueFull`, the server's 429). Each job's bytes are handed to its request as they are produced, through
`deliver`, and a job whose client went away is skipped, or stopped between two frames (`Synthesizer.stream`'s
`cancelled`)."""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .audio import Encoder


class QueueFull(Exception):
    """The queue holds its limit of waiting requests; `retry_after` is a guess in whole seconds."""

    def __init__(self, retry_after: int):
        super().__init__(f"the server is busy: the queue is full; retry in about {retry_after} s")
        self.retry_after = retry_after


class ShuttingDown(Exception):
    """The server is stopping: a waiting job will not be synthesised."""

    def __init__(self):
        super().__init__("the server is shutting down")


@dataclass
class Job:
    """One request's synthesis. `deliver` is called from the worker thread with ("data", bytes), then ("end",
    StreamStats or None) or ("error", exception); it must be thread-safe and must not block. A speech stream's turn
    (`events`) has pieces of text for `text` (Synthesizer.stream_text), gets ("chunk", (SpeechChunk, bytes)) in
    place of ("data", bytes), and an "end" however it ends (cancelled, or skipped, too)."""

    text: str | Iterable  # the text, or a speech stream's pieces
    opts: object  # SynthesisOptions
    encoder: Encoder
    deliver: Callable[[tuple], None]
    summary: str = ""  # for the log: voice, format, length (the text itself only with --log-text)
    voice: object = None  # a Base model's cloned voice (engine ClonedVoice), else None: a built-in speaker
    cancelled: threading.Event = field(default_factory=threading.Event)
    events: bool = False

    def cancel(self) -> None:
        self.cancelled.set()


@dataclass
class Counters:
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    rejected: int = 0


class SpeechQueue:
    """A bounded queue of Jobs and the one worker thread that synthesises them in order."""

    def __init__(self, synthesizer, max_waiting: int, log: logging.Logger):
        self.synth, self.log = synthesizer, log
        self.jobs: queue.Queue[Job | None] = queue.Queue(maxsize=max_waiting)
        self.max_waiting = max_waiting
        self.counters = Counters()
        self.current: Job | None = None
        self.last: dict | None = None  # the last finished job's numbers (no text)
        self.mean_job_s = 0.0  # running mean of job durations, for Retry-After
        self._closing = False
        self.thread = threading.Thread(target=self._run, name="leapvox-synthesis", daemon=True)
        self.thread.start()

    @property
    def waiting(self) -> int:
        return self.jobs.qsize()

    @property
    def busy(self) -> bool:
        """Work in hand: a job running, taken, or waiting (a job counts until its bookkeeping is done)."""
        return self.jobs.unfinished_tasks > 0

    @property
    def closing(self) -> bool:
        return self._closing

    def submit(self, job: Job) -> None:
        """Queue `job`, or raise QueueFull when `max_waiting` jobs are already waiting (or the server is closing)."""
        try:
            if self._closing:
                raise ShuttingDown()
            self.jobs.put_nowait(job)
        except queue.Full:
            self.counters.rejected += 1
            raise QueueFull(self.retry_after()) from None

    def retry_after(self) -> int:
        """Seconds until a place is likely free: the jobs ahead times the mean job time, 1 at least."""
        ahead = self.jobs.unfinished_tasks
        return max(1, min(600, math.ceil(self.mean_job_s * ahead)))

    def refuse_waiting(self) -> None:
        """Shutting down: refuse new jobs and turn away the waiting ones (the running one goes on)."""
        self._closing = True
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                return
            self.jobs.task_done()
            if job is not None:
                job.cancel()
                _safe(job.deliver, ("error", ShuttingDown()))

    def close(self, timeout: float = 10.0) -> None:
        """Refuse new and waiting jobs, cancel the running one, and wait for the worker to stop."""
        self.refuse_waiting()
        if self.current is not None:
            self.current.cancel()
        self.jobs.put(None)
        self.thread.join(timeout)

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            self.current = job
            try:
                if job.cancelled.is_set():
                    self.counters.cancelled += 1
                    if job.events:
                        _safe(job.deliver, ("end", None))
                else:
                    self._synthesize(job)
            finally:
                self.current = None
                self.jobs.task_done()

    def _synthesize(self, job: Job) -> None:
        t0, stats, outcome = time.perf_counter(), None, "completed"
        cloned = {} if job.voice is None else {"voice": job.voice}
        speak = self.synth.stream_text if job.events else self.synth.stream
        stream = speak(job.text, job.opts, cancelled=job.cancelled.is_set, **cloned)
        try:
            for chunk in stream:
                stats = chunk.stats
                if job.cancelled.is_set():
                    break
                data = job.encoder.audio(chunk.audio)
                if job.events:
                    job.deliver(("chunk", (chunk, data)))
                elif data:
                    job.deliver(("data", data))
            if job.cancelled.is_set():
                outcome = "cancelled"
                if job.events:
                    _safe(job.deliver, ("end", stats))
            else:
                tail = job.encoder.end()
                if tail:
                    job.deliver(("data", tail))
                job.deliver(("end", stats))
        except Exception as e:  # reported to the request (a status, or a cut stream) and logged there
            outcome = "failed"
            _safe(job.deliver, ("error", e))
        finally:
            stream.close()
        elapsed = time.perf_counter() - t0
        setattr(self.counters, outcome, getattr(self.counters, outcome) + 1)
        done = self.counters.completed + self.counters.cancelled + self.counters.failed
        self.mean_job_s += (elapsed - self.mean_job_s) / done
        self.last = _numbers(outcome, elapsed, stats)
        self.log.info("speech %s: %s, %s", outcome, job.summary, _describe(self.last))
        for warning in stats.warnings if stats is not None else ():  # e.g. instructions on a model that ignores them
            self.log.warning("speech: %s", warning)


def _safe(fn, *a) -> None:
    with contextlib.suppress(Exception):  # the request is gone (its event loop closed): nothing to tell
        fn(*a)


def _numbers(outcome: str, elapsed: float, stats) -> dict:
    d = {"outcome": outcome, "elapsed_s": round(elapsed, 3), "frames": 0, "audio_s": 0.0, "first_audio_s": None,
         "stop_reason": outcome if outcome != "completed" else ""}
    if stats is not None:
        d.update(frames=stats.frames, audio_s=round(stats.audio_s, 3),
                 stop_reason=d["stop_reason"] or stats.stop_reason,
                 first_audio_s=None if stats.first_audio_s is None else round(stats.first_audio_s, 3))
    return d


def _describe(n: dict) -> str:
    first = "-" if n["first_audio_s"] is None else f"{n['first_audio_s']:.2f} s"
    xrt = n["audio_s"] / n["elapsed_s"] if n["elapsed_s"] > 0 else 0.0
    return (f"{n['frames']} frames, {n['audio_s']:.2f} s of audio in {n['elapsed_s']:.2f} s (xRT {xrt:.2f}), "
            f"first audio {first}, stop {n['stop_reason'] or '-'}")
