"""Where `leapvox batch` speaks its items: in this process, in N local processes (multiprocessing, spawn), or in Ray
actors. Each worker holds one loaded model (`Slot`) and turns an item into a finished file's bytes; the caller
(app/batch.py) writes files and the manifest, so every route gives the same layout and the same samples (fp32, same
--threads). Results come back as they finish, in any order.

Ray is imported here only, and only with --ray: `pip install "leapvox[ray]"`. Each actor asks Ray for --threads CPUs,
so Ray places as many per node as its cores hold."""

from __future__ import annotations

import multiprocessing as mp
import signal
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from leapvox.engine.errors import LeapvoxError
from leapvox.engine.options import AUTO

RAY_HINT = 'pip install "leapvox[ray]"'
IN_FLIGHT = 2  # items queued per Ray actor: the next one is there when the last finishes


@dataclass(frozen=True)
class Job:
    """What every worker of one batch shares (picklable: it travels to processes and Ray actors)."""

    model: str  # --model as given: each machine of a Ray cluster resolves it itself
    weights: str  # a weight format, `auto` resolved once by the driver (models.auto): every worker loads the same
    threads: int  # torch threads per worker: fp32 samples are bit-exact at one thread count
    fmt: str  # wav or flac
    flags: dict  # the batch's option flags (engine.options OPTION_KEYS); an item's own fields override them
    auto_mode: str = "ar"  # what mode `auto` (an item's, the flag's, or neither given) runs: chosen once by the driver


def run_mode(given: dict, auto_mode: str) -> str:
    """The mode an item runs: its own, else the batch's --mode, else auto; auto is `auto_mode` (models.auto)."""
    mode = given.get("mode") or AUTO
    return auto_mode if mode == AUTO else mode


def message(e: BaseException) -> str:
    """An exception as one line for the manifest."""
    return str(e) + (f" (hint: {e.hint})" if getattr(e, "hint", None) else "") if isinstance(e, LeapvoxError) \
        else f"{type(e).__name__}: {e}"


def encode(audio, sample_rate: int, fmt: str) -> bytes:
    """A whole audio file in memory: 16-bit WAV, or FLAC holding the same 16-bit samples."""
    from leapvox.app.audio import Encoder, wav_bytes

    if fmt == "wav":
        return wav_bytes(audio, sample_rate)
    enc = Encoder(fmt, sample_rate)
    return enc.audio(audio) + enc.end()


class Worker:
    """One loaded model speaking items: item (id, text, options) -> result (the file's bytes, or an error)."""

    def __init__(self, job: Job):
        import torch

        from leapvox.models.load import load_model, open_model

        torch.set_num_threads(job.threads)
        self.job, self.folder = job, open_model(job.model, pull=True)
        self.model = load_model(self.folder, job.weights)
        self.synth, self.voices = self.model.synthesizer(), {}
        # as `speak -o FILE`: the steady chunk from the start where the codec's samples do not depend on chunking
        from leapvox.engine.streaming import MAX_CHUNK_FRAMES

        self.chunking = {"first_chunk": MAX_CHUNK_FRAMES} if self.model.codec.streams_exactly else {}

    def _voice(self, name: str | None):
        """A Base model's saved voice, loaded once per worker."""
        if name is None:
            return None
        if name not in self.voices:
            from leapvox.models.voices import load_voice, model_key

            self.voices[name] = load_voice(model_key(self.folder.path), name, self.folder.config.talker.hidden_size)
        return self.voices[name]

    def speak(self, item: dict) -> dict:
        from leapvox.engine.options import build_options, validate

        t0 = time.perf_counter()
        try:
            given = {**self.job.flags, **item["options"]}
            given["mode"] = run_mode(given, self.job.auto_mode)
            voice = self._voice(given.pop("voice", None))
            opts = validate(build_options(given, self.model.defaults), self.model.config, voice)
            s = self.synth.synthesize(item["text"], opts, voice=voice, **self.chunking)
            data = encode(s.audio, s.sample_rate, self.job.fmt)
            return {"id": item["id"], "data": data, "samples": len(s.audio), "sample_rate": s.sample_rate,
                    "stop_reason": s.stats.stop_reason, "warnings": list(s.warnings),
                    "synth_s": time.perf_counter() - t0}
        except Exception as e:  # recorded as the item's error; the batch goes on
            return {"id": item["id"], "error": message(e), "synth_s": time.perf_counter() - t0}


class Slot:
    """A worker whose model loads on its first item; a model that cannot load is a `fatal` result (the batch
    stops) rather than an exception a pool would answer by starting the worker again. Also Ray's actor class."""

    def __init__(self, job: Job):
        self.job, self.worker = job, None

    def speak(self, item: dict) -> dict:
        if self.worker is None:
            try:
                self.worker = Worker(self.job)
            except Exception as e:
                return {"id": item["id"], "fatal": message(e)}
        return self.worker.speak(item)


def _checked(result: dict) -> dict:
    if "fatal" in result:
        raise LeapvoxError(f"a worker could not load the model: {result['fatal']}")
    return result


# ---- local: this process, or N spawned processes

_SLOT: Slot | None = None


def _init_process(job: Job) -> None:
    global _SLOT
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops the pool
    _SLOT = Slot(job)


def _speak(item: dict) -> dict:
    return _SLOT.speak(item)


def run_local(job: Job, items: Iterable[dict], workers: int) -> Iterator[dict]:
    """Results of `items` as they finish: one worker in this process, or `workers` spawned processes (each its own
    model and `job.threads` threads). Closing the iterator (Ctrl-C) stops the processes; items in flight are lost."""
    if workers == 1:
        slot = Slot(job)
        for item in items:
            yield _checked(slot.speak(item))
        return
    with mp.get_context("spawn").Pool(workers, _init_process, (job,)) as pool:  # leaving it terminates the pool
        for result in pool.imap_unordered(_speak, items):
            yield _checked(result)


# ---- Ray: one actor per worker, placed by Ray on the nodes' cores


def import_ray():
    try:
        import ray
    except ImportError:
        from leapvox.app.common import UsageError

        raise UsageError("--ray needs Ray, which is not installed", hint=RAY_HINT) from None
    return ray


def connect(address: str, say) -> tuple[object, bool]:
    """Ray connected to the cluster at `address` (`auto`: the one `ray start` runs here), or a new local one
    (`local`); and whether this call started it (so it also stops it)."""
    import logging

    ray = import_ray()
    if ray.is_initialized():
        return ray, False
    local = address == "local"
    try:
        ray.init(address=address, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False,
                 configure_logging=True)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise LeapvoxError(f"cannot reach a Ray cluster at {address}: {e}", hint="start one with ray start --head, "
                           "pass its address (--ray HOST:6379), or use --ray local") from None
    cpus = int(ray.cluster_resources().get("CPU", 0))
    say(f"ray: {'started a local cluster' if local else 'connected to ' + address}, {len(alive_nodes(ray))} "
        f"node(s), {cpus} CPUs")
    return ray, True


def alive_nodes(ray) -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


def actors_that_fit(ray, threads: int) -> int:
    """Actors of `threads` CPUs each that the cluster's nodes hold (each node by its own cores)."""
    return sum(int(n["Resources"].get("CPU", 0)) // threads for n in alive_nodes(ray))


def run_ray(job: Job, items: Iterable[dict], address: str, workers: int | None, say, most: int) -> Iterator[dict]:
    """Results of `items` as they finish, from Ray actors (`workers`, default as many as the cluster's nodes hold
    at `job.threads` CPUs each, `most` at most), IN_FLIGHT items queued per actor. An actor that dies fails its
    items (recorded) and the rest go on; closing the iterator (Ctrl-C) kills the actors, and a cluster started here
    stops."""
    ray, started = connect(address, say)
    actors = []
    try:
        fit = actors_that_fit(ray, job.threads)
        if fit < 1 or (workers or 0) > fit:
            raise LeapvoxError(f"the Ray cluster holds {fit} worker(s) of {job.threads} CPU(s)",
                               hint=f"lower --threads{' or --workers' if workers else ''}, or add nodes")
        actor = ray.remote(num_cpus=job.threads)(Slot)
        actors = [actor.remote(job) for _ in range(min(workers or fit, most))]
        say(f"ray: {len(actors)} worker(s) of {job.threads} thread(s)")
        todo, pending = iter(items), {}

        def feed(a) -> None:
            item = next(todo, None)
            if item is not None:
                pending[a.speak.remote(item)] = (a, item)

        for a in actors:
            for _ in range(IN_FLIGHT):
                feed(a)
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            a, item = pending.pop(ref)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayError as e:  # the actor or its node died: this item fails, the others go on
                yield {"id": item["id"], "error": f"Ray worker lost: {type(e).__name__}", "synth_s": 0.0}
                if a in actors:
                    actors.remove(a)
                if not actors:
                    raise LeapvoxError("every Ray worker was lost", hint="see ray status; rerun to go on") from None
                feed(next(iter(actors)))
                continue
            yield _checked(result)
            feed(a)
    finally:
        for a in actors:
            ray.kill(a)
        if started:
            ray.shutdown()
