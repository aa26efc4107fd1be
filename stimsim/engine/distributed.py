"""Sweeps that outgrow one process: the engine's chunks as Dask tasks.

``simulate(..., scheduler=...)``, ``stimsim run --scheduler ...`` and ``stimsim plan --scheduler ...`` accept

``local``
    a ``distributed.LocalCluster`` on this machine: one single-threaded worker process per CPU core,
    listening on 127.0.0.1 only;
``processes=N``
    the same with N worker processes;
an address (``tcp://host:8786`` or ``host:8786``)
    a running Dask scheduler, e.g. one started by dask-jobqueue on a SLURM cluster (see docs/engine.md);
a ``distributed.Client``
    (Python API) used as it is and left open.

This process computes the unperturbed activity of every perturbed layer once (or reads it from the
activation cache), sends it to the workers with the model, decoder and conditions (one copy per
worker), and submits one task per chunk of conditions. Results come back here and are written to
the simulation store as they arrive, by this process only: each chunk is written once, a chunk that
a lost worker was computing is recomputed by Dask on another worker (the model sent again if the lost worker
held its last copy: :func:`finished_tasks`), and an interrupted run resumes
from the chunks already in the store. The result is the same dataset as a single-process run: bit for bit
on the engine's general path; on its exact fast path (a linear readout of the perturbed layer) the float32
product of a chunk depends on how many conditions the chunk holds, and this module cuts a sweep into
more chunks than one process does, so probabilities may differ in their last float32 bits (about 1e-8).

``stimsim plan --scheduler ...`` keeps one client for the whole plan (:func:`shared_scheduler`) and runs
each site's rehearsal sweep — small, one per site — as one task (:func:`run_tasks`), the model sent to
every worker once per phase.
"""
from __future__ import annotations

import argparse
import itertools
import logging
import os
import re
import signal
import threading
from contextlib import ExitStack, contextmanager

from stimsim.utilities.errors import ConfigError, StimsimError

#: Chunks submitted per worker thread, so that a slow or lost worker delays little of the sweep.
CHUNKS_PER_THREAD = 4

#: The most worker processes (``--scheduler processes=N``) or torch threads (``--threads``) per CPU of the machine:
#: each worker holds a copy of the model, so many more only exhaust the memory.
MAX_PER_CPU = 4

_PROCESSES = re.compile(r"processes=(\d+)")


def parse_scheduler(text: str) -> tuple[str, object]:
    """``("local", n_cores)``, ``("processes", N)`` or ``("address", address)`` for a ``--scheduler`` value."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"scheduler must be 'local', 'processes=N' or a scheduler address, got {text!r}")
    text = text.strip()
    if text == "local":
        return "local", os.cpu_count() or 1
    match = _PROCESSES.fullmatch(text)
    if match:
        n = int(match.group(1))
        most = MAX_PER_CPU * (os.cpu_count() or 1)
        if not 1 <= n <= most:
            raise ConfigError(f"scheduler {text!r}: the number of worker processes must lie in 1..{most} "
                              f"({MAX_PER_CPU} per CPU of this machine; each holds a copy of the model)")
        return "processes", n
    if text.startswith("processes"):
        raise ConfigError(f"scheduler {text!r}: write processes=N with N a positive integer, e.g. processes=4")
    if re.fullmatch(r"(tcp|tls|inproc|ucx|ws|wss)://\S+|[\w.\-\[\]:]+:\d+", text):
        return "address", text
    raise ConfigError(f"scheduler {text!r} is not 'local', 'processes=N' or a scheduler address "
                      "(tcp://host:port or host:port)")


def check_scheduler(scheduler) -> None:
    """Raise ConfigError now, before any work, when ``scheduler`` is not a valid ``scheduler=`` value or names a
    scheduler address that does not answer (within :data:`CONNECT_TIMEOUT_S`)."""
    if scheduler is None:
        return
    from distributed import Client

    if not isinstance(scheduler, Client):
        kind, value = parse_scheduler(scheduler)
        if kind == "address":
            _reach(value)


def _reach(address: str) -> None:
    """ConfigError unless the scheduler at ``address`` answers its handshake within :data:`CONNECT_TIMEOUT_S`."""
    try:
        _check_answers(address, CONNECT_TIMEOUT_S)
    except OSError as exc:
        raise ConfigError(f"cannot reach the Dask scheduler at {address!r}: {exc}") from None


def add_compute_arguments(parser: argparse.ArgumentParser) -> None:
    """``--device`` and ``--scheduler`` on a command that runs sweeps (``run``, ``plan``)."""
    from stimsim.engine.devices import add_device_argument

    add_device_argument(parser)
    add_scheduler_argument(parser)


def add_scheduler_argument(parser: argparse.ArgumentParser) -> None:
    """``--scheduler local|processes=N|ADDRESS`` on a command (default: this process only)."""
    parser.add_argument("--scheduler", metavar="SCHEDULER", default=None,
                        help="run the sweep's chunks as Dask tasks: 'local' (one worker process per core), "
                             "'processes=N', or the address of a running Dask scheduler (tcp://host:8786); "
                             "default: in this process")


@contextmanager
def shared_scheduler(scheduler):
    """One Dask client for a job that sends work to the workers many times (``stimsim plan``): yields what to
    pass on as ``scheduler=`` — None for this process, else a ``distributed.Client`` whose workers (and the
    local cluster started for them, if any) serve every call and are closed at the end."""
    if scheduler is None:
        yield None
        return
    pool = ChunkPool(scheduler)
    try:
        yield pool.client
    finally:
        pool.close()


def run_tasks(scheduler, function, shared, jobs, settings: dict):
    """``(key, function(shared, job, settings))`` for every ``(key, job)`` of ``jobs``, as the tasks finish, each
    computed by a worker of ``scheduler`` (as in :class:`ChunkPool`; a Client is left open). ``shared`` (e.g.
    the model) is sent to every worker once (again if the workers lose it: :func:`finished_tasks`); ``jobs`` is
    read lazily, keeping two tasks per worker thread in flight, so the inputs of a long list never all sit in memory
    at once. A task a lost worker was running is recomputed by Dask elsewhere."""
    pool = ChunkPool(scheduler)

    def submit(remote, keyed_job):
        return pool.client.submit(_run_task, function, remote, keyed_job[1], settings, pure=False)

    try:
        for (key, _), result in finished_tasks(pool.client, shared, submit, jobs, in_flight=2 * pool.threads):
            yield key, result
    finally:
        pool.close()


#: How many times :func:`finished_tasks` sends its shared value again after the workers lost every copy of it.
MAX_RESENDS = 3


def finished_tasks(client, shared, submit, items, in_flight: int | None = None):
    """``(item, result)`` for every item of ``items`` as its task finishes, the task being ``submit(remote, item)``
    (a future) with ``remote`` the copy of ``shared`` (e.g. the model) scattered to every worker. Dask keeps one
    copy of scattered data where it sees no task waiting for more (its active memory manager), and a task whose
    shared value lost every copy with its worker (killed, out of memory, pre-empted) is cancelled: ``shared`` is
    then scattered again and the cancelled tasks submitted again, up to :data:`MAX_RESENDS` times. ``in_flight``:
    at most this many tasks submitted at once (None: all at once); the tasks left are cancelled on leaving."""
    import warnings
    from concurrent.futures import CancelledError

    from distributed import as_completed

    remote = client.scatter(shared, broadcast=True, hash=False)
    items, pending, submitted, resends = iter(items), as_completed(), {}, 0

    def submit_next(item, with_remote) -> None:
        future = submit(with_remote, item)
        submitted[future.key] = (future, item, with_remote)
        pending.add(future)

    for item in itertools.islice(items, in_flight):
        submit_next(item, remote)
    try:
        for future in pending:
            _, item, used = submitted.pop(future.key)
            try:
                result = future.result()
            except CancelledError:
                if not _lost(client, used):  # cancelled for another reason than a lost shared value
                    raise
                if used is remote:
                    resends += 1
                    if resends > MAX_RESENDS:
                        raise StimsimError(f"the Dask workers lost every copy of the model {resends} times (workers "
                                           "killed or out of memory); check the workers' memory and logs") from None
                    warnings.warn(f"the Dask workers lost every copy of the model (a worker was lost); sending it "
                                  f"again ({resends} of at most {MAX_RESENDS} times)")
                    remote = client.scatter(shared, broadcast=True, hash=False)
                submit_next(item, remote)
                continue
            yield item, result
            for item in itertools.islice(items, 1):  # one more in flight (none are left when all went at once)
                submit_next(item, remote)
    finally:
        client.cancel([future for future, _, _ in submitted.values()])


def _lost(client, future) -> bool:
    """Whether the data of a scattered ``future`` is gone from every worker."""
    return future.status != "finished" or not client.who_has(future).get(future.key)


def _run_task(function, shared, job, settings):
    """Worker side of :func:`run_tasks`: torch uses as many threads as this worker has."""
    import torch
    from distributed import get_worker

    torch.set_num_threads(max(1, int(get_worker().state.nthreads)))
    return function(shared, job, settings)


@contextmanager
def _signals_held_back():
    """Ctrl-C, SIGTERM and SIGHUP held back while a local cluster starts, then delivered: Dask cannot close a
    cluster stopped half-way through its start (its exit handler fails with a traceback), so the command stops
    once the cluster is up, and closes it. Outside the main thread (no signal arrives there) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    held = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {signum: signal.signal(signum, lambda signum, frame: received.append(signum)) for signum in held}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if received:
            signal.raise_signal(received[0])


def dask_setup(worker) -> None:
    """Run by Dask in each worker process of a local cluster as it starts (the cluster's ``preload``): the worker
    ignores Ctrl-C and keeps Dask's log lines below ERROR to itself. A Ctrl-C at the terminal reaches every process
    of the command; the command stops and closes its workers, which would otherwise each print a traceback first."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    for logger in _dask_loggers():
        logger.setLevel(logging.ERROR)


def _dask_loggers() -> list:
    """The ``distributed`` logger and those of its descendants created so far (later ones inherit its level)."""
    names = [name for name in list(logging.root.manager.loggerDict) if name.startswith("distributed.")]
    return [logging.getLogger(name) for name in ("distributed", *names)]


@contextmanager
def quiet_dask_logs():
    """Dask's log lines below ERROR (a client removed, a worker killed on closing) kept off stderr in this process
    while a local cluster of stimsim's runs; its workers do the same (:func:`dask_setup`)."""
    previous = [(logger, logger.level) for logger in _dask_loggers()]
    for logger, _ in previous:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in previous:
            logger.setLevel(level)


#: The module whose :func:`dask_setup` each worker of a local cluster runs as it starts (the cluster's ``preload``).
WORKER_PRELOAD = (__name__,)

#: Seconds to connect to a scheduler address and to get its answer to the handshake.
CONNECT_TIMEOUT_S = 30


def _check_answers(address: str, timeout_s: float) -> None:
    """Connect to the scheduler at ``address`` and ask its identity; OSError (TimeoutError) when it is not
    reached (at once when the connection is refused), or does not answer, within ``timeout_s`` (a server that
    accepts the connection but never answers would otherwise hold the client's handshake forever). Runs in its own
    thread and event loop."""
    import asyncio
    import socket
    from concurrent.futures import ThreadPoolExecutor

    from distributed.comm import connect
    from distributed.comm.addressing import get_address_host_port, parse_address

    if parse_address(address)[0] in ("tcp", "tls"):  # a refused connection is said at once (Dask retries it)
        socket.create_connection(get_address_host_port(address), timeout=timeout_s).close()

    async def identity():
        comm = await connect(address, timeout=timeout_s)
        try:
            await comm.write({"op": "identity"})
            await comm.read()
        finally:
            comm.abort()

    async def bounded():
        try:
            await asyncio.wait_for(identity(), timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"no answer to the handshake within {timeout_s:g} s (is it a Dask scheduler?)") from None

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, bounded()).result()


def local_cluster(n_workers: int):
    """A Dask cluster of ``n_workers`` single-threaded worker processes on this machine, as every stimsim command
    starts one: on the loopback address, its status page on a free port (two sweeps at once would otherwise both ask
    for 8787), each worker ignoring Ctrl-C and keeping Dask's log lines below ERROR to itself (:func:`dask_setup`)."""
    from distributed import LocalCluster

    return LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                        dashboard_address=":0", preload=list(WORKER_PRELOAD), silence_logs=logging.ERROR)


class ChunkPool:
    """A Dask client (and the local cluster it started, if any) that runs the engine's chunks."""

    def __init__(self, scheduler):
        from distributed import Client

        self._cluster = None
        self._quiet = ExitStack()  # Dask's log lines held back while a local cluster of this pool's runs
        if isinstance(scheduler, Client):
            self.client, self._own_client = scheduler, False
        else:
            kind, value = parse_scheduler(scheduler)
            if kind == "address":
                _reach(value)
                try:
                    self.client = Client(value, timeout=f"{CONNECT_TIMEOUT_S}s")
                except OSError as exc:
                    raise ConfigError(f"cannot reach the Dask scheduler at {value!r}: {exc}") from None
            else:
                self._quiet.enter_context(quiet_dask_logs())
                try:
                    with _signals_held_back():
                        self._cluster = local_cluster(int(value))
                        self.client = Client(self._cluster)
                except BaseException:  # interrupted: the cluster (complete now) is closed before stopping
                    if getattr(self, "client", None) is not None:
                        self.client.close()
                    if self._cluster is not None:
                        self._cluster.close()
                    self._quiet.close()
                    raise
            self._own_client = True
        self.threads = sum(self.client.nthreads().values()) or 1
        self.min_chunks = CHUNKS_PER_THREAD * self.threads

    def run(self, runner, chunks):
        """(condition indices, probabilities) of every chunk, in the order they finish."""
        local = [chunk for chunk in chunks if chunk[0] is None]  # the control needs no worker
        remote = [chunk for chunk in chunks if chunk[0] is not None]
        for chunk in local:
            yield runner.run(chunk)
        if not remote:
            return

        def submit(shared, chunk):
            return self.client.submit(_run_chunk, shared, chunk, pure=False)

        for _, result in finished_tasks(self.client, runner.portable(remote), submit, remote):
            yield result

    def close(self) -> None:
        if self._own_client:
            self.client.close()
        if self._cluster is not None:
            self._cluster.close()
        self._quiet.close()


def _run_chunk(runner, chunk):
    """Worker side: one chunk, with torch using as many threads as this worker has."""
    import torch
    from distributed import get_worker

    torch.set_num_threads(max(1, int(get_worker().state.nthreads)))
    return runner.run(chunk)
