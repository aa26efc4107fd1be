"""Sweeps as Dask tasks (stimsim.engine.distributed): same result as one process, lost workers, resuming."""
import functools
import os
import signal

import numpy as np
import pytest
import torch
import xarray as xr

from stimsim.behavior import LogisticDecoder
from stimsim.cortex.positions import retinotopic_positions
from stimsim.cortex.sheet import CorticalSheet
from stimsim.engine import simulation as engine
from stimsim.engine.distributed import parse_scheduler
from stimsim.models.architectures import build_network
from stimsim.models.preprocessing import Preprocessing
from stimsim.models.topographic import TopographicModel
from stimsim.stimulation import Condition, ElectricalStimulation
from stimsim.utilities.errors import ConfigError

distributed = pytest.importorskip("distributed")

#: 300 µA exceeds Shannon's limit on a Utah tip; these tests want strong in-silico effects, no protocol.
simulate = functools.partial(engine.simulate, safety_override="distributed tests: in-silico effects, no protocol")

N_IMAGES = 48


@pytest.fixture(scope="module")
def sweep():
    """A tiny topographic model, images, a decoder on IT and 40 V4 sites (the general path: V4 → IT per chunk)."""
    torch.manual_seed(0)
    kwargs = {"n_classes": 2, "it_units": 64}
    sheets = {"v4": CorticalSheet("v4", (128, 4, 4), retinotopic_positions((128, 4, 4), 20.0, seed=1)),
              "it": CorticalSheet("it", (64, 1, 1), retinotopic_positions((64, 1, 1), 10.0, seed=2))}
    model = TopographicModel(build_network("stimsim_topo", **kwargs), sheets,
                             Preprocessing(size_px=32, channels=1, mean=(0.5,), std=(0.25,)),
                             {"family": "stimsim_topo", "kwargs": kwargs}, name="tiny_topo")
    rng = np.random.default_rng(0)
    images = (rng.uniform(0, 0.5, (N_IMAGES, 32, 32)) + np.repeat([0.0, 0.5], N_IMAGES // 2)[:, None, None])
    images = images.astype(np.float32)
    labels = np.repeat(["dark", "bright"], N_IMAGES // 2)
    decoder = LogisticDecoder.fit(model.activations(images, "it"), labels, layer="it", C=1.0)
    sites = rng.uniform(1.0, 19.0, size=(40, 2))
    conditions = [Condition("control")] + [
        Condition(f"v4_{i:02d}", (ElectricalStimulation(((float(x), float(y)),), current_uA=300.0, frequency_Hz=200.0,
                                                        layer="v4"),)) for i, (x, y) in enumerate(sites)]
    return model, images, decoder, conditions


#: Seconds a killed worker process may take to be started again (it imports torch and stimsim: a minute or more on
#: a loaded machine).
WORKERS_BACK_S = 180


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                       dashboard_address=None)
    with distributed.Client(cluster) as connected:
        yield connected
    cluster.close()


def test_scheduler_values_are_checked():
    assert parse_scheduler("processes=3") == ("processes", 3)
    assert parse_scheduler("local")[0] == "local"
    assert parse_scheduler("tcp://10.0.0.5:8786") == ("address", "tcp://10.0.0.5:8786")
    for bad in ("processes=0", "processes=two", "nowhere", ""):
        with pytest.raises(ConfigError, match="scheduler"):
            parse_scheduler(bad)
    most = 4 * os.cpu_count()  # each worker holds the model: far more than the CPUs only exhausts the memory
    assert parse_scheduler(f"processes={most}") == ("processes", most)
    with pytest.raises(ConfigError, match=rf"processes={most + 1}'?: the number of worker processes must lie in "
                                          rf"1..{most} \(4 per CPU of this machine"):
        parse_scheduler(f"processes={most + 1}")


@pytest.mark.parametrize("victims", ["one", "every"])
def test_killed_worker_is_replaced_and_the_result_equals_one_process(victims, sweep, client, tmp_path, monkeypatch):
    """A worker killed in the middle of a sweep: its chunks are computed again elsewhere. Every worker killed at
    once takes every copy of the model with it (as one worker does once Dask has kept a single copy, which it does
    within seconds where no task waits on the other): the model is sent again, and the sweep still completes."""
    import warnings

    model, images, decoder, conditions = sweep
    single = simulate(model, images, conditions, decoder, progress=False)
    client.wait_for_workers(2, timeout=WORKERS_BACK_S)  # those an earlier test killed are back
    workers = client.run(os.getpid)
    assert len(workers) == 2 and all(address.startswith("tcp://127.0.0.1:") for address in workers)
    killed = sorted(workers.values())[:1 if victims == "one" else None]
    written, at_kill = [], []
    real_write = engine.write_chunk

    def write_and_kill_once(directory, indices, *rest):
        written.append(indices.tolist())
        real_write(directory, indices, *rest)
        if len(written) == 2:  # the control and one chunk are stored; kill in the middle of the sweep
            at_kill.append(len(written))
            for pid in killed:
                os.kill(pid, signal.SIGKILL)

    monkeypatch.setattr(engine, "write_chunk", write_and_kill_once)
    store = tmp_path / "store"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = simulate(model, images, conditions, decoder, progress=False, scheduler=client, store=store)
    resent = [str(w.message) for w in caught if "lost every copy of the model" in str(w.message)]
    if victims == "every":
        assert resent == ["the Dask workers lost every copy of the model (a worker was lost); sending it again (1 of "
                          "at most 3 times)"]
    n_chunks = len(written)
    assert at_kill == [2] and n_chunks > 4  # the kill came with most chunks still to compute
    xr.testing.assert_identical(result, single)
    every = sorted(i for chunk in written for i in chunk)
    assert every == list(range(len(conditions)))  # each condition written exactly once
    assert len(list(store.glob("chunk_*.nc"))) == n_chunks
    client.wait_for_workers(2, timeout=WORKERS_BACK_S)  # the tests after this one find both workers


def test_the_plan_s_tasks_complete_when_every_worker_is_lost(client):
    """The plan's rehearsal tasks (run lazily, a few in flight): every worker killed after the first result takes
    the model's copies with it; it is sent again once and every task's result is the one computed without a loss."""
    import time
    import warnings

    from stimsim.engine.distributed import run_tasks

    def offset(shared, job, settings):
        time.sleep(settings["sleep_s"])
        return shared + job

    client.wait_for_workers(2, timeout=WORKERS_BACK_S)  # those an earlier test killed are back
    results = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for key, value in run_tasks(client, offset, 100, ((f"site_{i}", i) for i in range(12)), {"sleep_s": 0.2}):
            results[key] = value
            if len(results) == 1:
                for pid in client.run(os.getpid).values():
                    os.kill(pid, signal.SIGKILL)
    assert results == {f"site_{i}": 100 + i for i in range(12)}
    assert sum("lost every copy of the model" in str(w.message) for w in caught) == 1
    client.wait_for_workers(2, timeout=WORKERS_BACK_S)  # the tests after this one find both workers


def test_interrupted_dask_run_resumes_without_writing_twice(sweep, client, tmp_path, monkeypatch):
    model, images, decoder, conditions = sweep
    single = simulate(model, images, conditions, decoder, progress=False)
    store = tmp_path / "store"
    written = []
    real_write = engine.write_chunk

    def write_then_stop(directory, indices, *rest):
        if len(written) == 3:
            raise KeyboardInterrupt
        written.append(indices.tolist())
        real_write(directory, indices, *rest)

    monkeypatch.setattr(engine, "write_chunk", write_then_stop)
    with pytest.raises(KeyboardInterrupt):
        simulate(model, images, conditions, decoder, progress=False, scheduler=client, store=store)
    first = {i for chunk in written for i in chunk}
    stamps = {path.name: path.stat().st_mtime_ns for path in store.glob("chunk_*.nc")}
    assert len(stamps) == 3
    monkeypatch.setattr(engine, "write_chunk", lambda d, i, *rest: (written.append(i.tolist()), real_write(d, i, *rest)))
    resumed = simulate(model, images, conditions, decoder, progress=False, scheduler=client, store=store)
    xr.testing.assert_identical(resumed, single)
    second = [i for chunk in written[3:] for i in chunk]
    assert sorted(second) == sorted(set(range(len(conditions))) - first)  # nothing computed or written twice
    assert all(store.joinpath(name).stat().st_mtime_ns == stamp for name, stamp in stamps.items())


def test_the_fast_path_under_dask_equals_one_process_up_to_float32_rounding(sweep, client):
    """A linear readout of the perturbed layer (the exact fast path): Dask cuts the sweep into more chunks,
    whose float32 products may differ in the last bits; labels are identical, probabilities within 1e-6."""
    model, images, decoder, _ = sweep
    sites = np.random.default_rng(1).uniform(1.0, 9.0, size=(24, 2))
    conditions = [Condition("control")] + [
        Condition(f"it_{i:02d}", (ElectricalStimulation(((float(x), float(y)),), current_uA=300.0, layer="it"),))
        for i, (x, y) in enumerate(sites)]
    single = simulate(model, images, conditions, decoder, progress=False)
    spread = simulate(model, images, conditions, decoder, progress=False, scheduler=client)
    xr.testing.assert_identical(spread.coords.to_dataset(), single.coords.to_dataset())
    np.testing.assert_allclose(spread.values, single.values, rtol=0, atol=1e-6)
    assert np.abs(single.values[1:] - single.values[0]).max() > 1e-3  # the stimulation does change choices


def test_two_local_clusters_at_once_start_without_a_port_warning():
    """Two sweeps on one machine each start a local cluster; neither asks for an HTTP port the other holds."""
    import warnings

    from stimsim.engine.distributed import ChunkPool

    with warnings.catch_warnings():
        # distributed warns "Port 8787 is already in use" when a fixed port is taken
        warnings.filterwarnings("error", message=".*already in use")
        first = ChunkPool("processes=1")
        try:
            second = ChunkPool("processes=1")
            second.close()
        finally:
            first.close()


def test_an_interrupt_while_a_local_cluster_starts_stops_without_a_traceback(default_ctrl_c):
    """Ctrl-C while the workers of a local cluster start: it takes effect once the cluster is up, which is then
    closed; Dask's exit handler used to fail on the half-started cluster with a traceback ('Exception ignored in
    atexit callback ... AssertionError: Status.init')."""
    import subprocess
    import sys

    script = """
import os, signal, threading
import distributed
from stimsim.engine.distributed import ChunkPool

started = distributed.LocalCluster

def interrupted_while_starting(*args, **kwargs):
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    return started(*args, **kwargs)

distributed.LocalCluster = interrupted_while_starting
try:
    ChunkPool("processes=1")
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"},
                          preexec_fn=default_ctrl_c)
    assert done.stdout == "interrupted\n"
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert done.returncode == 0


def test_ctrl_c_at_the_terminal_stops_the_command_without_the_workers_tracebacks(default_ctrl_c):
    """A Ctrl-C at the terminal reaches every process of the command's group, the workers of its local cluster
    too; they ignore it (each used to print a traceback, 60 lines and more in all), and the command stops and closes
    them."""
    import subprocess
    import sys
    import time

    script = """
import signal, time
from stimsim.engine.distributed import ChunkPool

pool = ChunkPool("processes=2")
print(sorted(map(str, pool.client.run(lambda: signal.getsignal(signal.SIGINT)).values())), flush=True)
try:
    while True:
        time.sleep(0.1)
except KeyboardInterrupt:
    pool.close()
    print("closed", flush=True)
"""
    command = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True,
                               preexec_fn=default_ctrl_c)
    try:
        ready = command.stdout.readline()
        assert ready == f"{[str(signal.SIG_IGN)] * 2}\n", command.stderr.read()
        time.sleep(0.5)
        os.killpg(command.pid, signal.SIGINT)  # as the terminal sends it: to the whole process group
        out, err = command.communicate(timeout=60)
    finally:
        command.kill()
    assert out == "closed\n" and command.returncode == 0
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_dask_log_lines_stay_off_stderr_while_a_local_cluster_runs():
    """Dask's own log lines below ERROR (``distributed.scheduler - INFO - Remove client``, a worker's warnings, the
    nanny's on closing) are held back in the command and in its workers while a local cluster runs; the command's
    logging is as before once the cluster is closed."""
    import subprocess
    import sys

    script = """
import logging
import distributed
from stimsim.engine.distributed import ChunkPool

scheduler_log = logging.getLogger("distributed.scheduler")
before = scheduler_log.getEffectiveLevel()
pool = ChunkPool("processes=2")
levels = pool.client.run(lambda: logging.getLogger("distributed.worker.state_machine").getEffectiveLevel())
pool.client.run(lambda: logging.getLogger("distributed.worker.state_machine").warning("from a worker"))
scheduler_log.warning("from the command")
pool.close()
print(sorted(levels.values()), before == scheduler_log.getEffectiveLevel() < logging.ERROR, flush=True)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.stdout == "[40, 40] True\n", done.stderr
    assert "distributed." not in done.stderr, done.stderr


def test_a_scheduler_address_that_accepts_but_never_answers_is_refused_within_the_timeout(client, monkeypatch):
    """A server that accepts the connection and stays silent used to hold `run` forever (only the connect had a
    timeout); the handshake is bounded too. A real scheduler's address still connects."""
    import socket
    import threading
    import time

    import stimsim.engine.distributed as dask_pool

    client.wait_for_workers(2, timeout=WORKERS_BACK_S)  # those an earlier test killed are back
    pool = dask_pool.ChunkPool(client.scheduler.address)
    threads = pool.threads
    pool.close()  # before asserting: a Client left open stays Dask's default scheduler for the tests after this one
    assert threads == 2
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    accepted = []
    threading.Thread(target=lambda: accepted.append(silent.accept()), daemon=True).start()
    monkeypatch.setattr(dask_pool, "CONNECT_TIMEOUT_S", 2)
    address = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
    start = time.monotonic()
    with pytest.raises(ConfigError, match=rf"cannot reach the Dask scheduler at '{address}': no answer to the "
                                          r"handshake within 2 s"):
        dask_pool.ChunkPool(address)
    assert time.monotonic() - start < 10 and accepted
    with pytest.raises(ConfigError, match=rf"cannot reach the Dask scheduler at '{address}'"):
        dask_pool.check_scheduler(address)  # what `run` and `plan` call before any work
    silent.close()
    # nothing listens there now: refused at once, not after the timeout (Dask's own connect retries it)
    monkeypatch.setattr(dask_pool, "CONNECT_TIMEOUT_S", 30)
    start = time.monotonic()
    with pytest.raises(ConfigError, match=rf"cannot reach the Dask scheduler at '{address}': .*[Cc]onnection refused"):
        dask_pool.check_scheduler(address)
    assert time.monotonic() - start < 5
