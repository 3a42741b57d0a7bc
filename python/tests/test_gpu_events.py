"""GPU timing without a GPU: CUDA events and synchronize stood in for by fakes (an event's device
time is a counter that moves 7 us a record), for the Profiler and zero-code mode alike. In
`Events` mode each step's device times come back as records of their own (`steps: 0`) once its
events are done, and the host record says its phases are not the host's (`prof: false`)."""

import threading

import pytest

from conftest import Captured, in_thread


class FakeEvent:
    clock = [0]

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        FakeEvent.clock[0] += 7
        self.t = FakeEvent.clock[0]

    def query(self):
        return True

    def elapsed_time(self, other):
        return (other.t - self.t) / 1000.0  # ms


class FakeCuda:
    Event = FakeEvent
    syncs = 0

    @staticmethod
    def synchronize():
        FakeCuda.syncs += 1

    @staticmethod
    def is_available():
        return True


class FakeTorch:
    cuda = FakeCuda


def device_steps(sent):
    return [
        (m["ph"], m["wall"]) for m in sent if m["t"] == "step" and m.get("steps") == 0
    ]


def host_steps(sent):
    return [m for m in sent if m["t"] == "step" and m.get("steps") is None]


def test_a_profilers_cuda_thread_gets_device_times_per_phase_in_events_mode(captured):
    p, c = captured([("w", ["a", "b"])])
    p._cuda._torch = FakeTorch
    p.gpu_timing = "Events"

    def work():
        p.thread("w", device="cuda:0")
        for _ in range(4):
            p.mark("a")
            p.mark("b")
            with p.phase("a"):
                pass
            p.end_step(tokens=3)

    in_thread(work, name="w")
    # a and b: two spans of 7 us a step each; from the second step on, `other` (the 7 us from
    # the step's start to its first mark) is in the wall and left out of the phases.
    assert device_steps(c.sent) == [([[0, 14000], [1, 14000]], 28000)] + [
        ([[0, 14000], [1, 14000]], 35000)
    ] * 3
    hosts = host_steps(c.sent)
    assert len(hosts) == 4
    assert all(m["prof"] is False and m["timing"] == "GpuEvents" for m in hosts)


def test_a_profilers_cuda_thread_synchronizes_at_each_mark_in_sync_mode(captured):
    p, c = captured([("w", ["a"])])
    p._cuda._torch = FakeTorch
    p.gpu_timing = "Sync"
    before = FakeCuda.syncs

    def work():
        p.thread("w", device="cuda:0")
        p.mark("a")
        with p.phase("a"):
            pass
        p.end_step()

    in_thread(work, name="w")
    assert FakeCuda.syncs - before == 3
    (step,) = host_steps(c.sent)
    assert step["prof"] is True and step["timing"] == "GpuSync"


@pytest.fixture
def fake_cuda_auto(monkeypatch):
    """An Auto in Events mode on a CPU torch whose CUDA looks initialised on device 0, with
    fake events and synchronize; its sends captured."""
    torch = pytest.importorskip("torch")
    from dflash_top.auto import Auto

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "synchronize", FakeCuda.synchronize)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda d: {})
    a = Auto(serve=False, gpu_timing="Events")
    c = Captured()
    a._server = c
    a.install()
    yield torch, a, c
    a._server = None
    a.close()


def train(torch, steps):
    def trainer():
        m = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(steps):
            loss = m(torch.ones(2, 4)).sum()
            loss.backward()
            opt.step()

    t = threading.Thread(target=trainer, name="trainer-0")
    t.start()
    t.join()


def test_zero_code_cuda_threads_get_device_times_per_phase_in_events_mode(fake_cuda_auto):
    torch, a, c = fake_cuda_auto
    train(torch, 5)
    idx = {p: k for k, p in enumerate(a.stages[0]["phases"])}
    fwd, bwd, opt = idx["Linear"], idx["backward"], idx["optim"]
    assert (bwd, opt, fwd) == (2, 4, 7)
    # The first step ends at the forward's end (no optimizer seen yet), the second at the
    # optimizer's step, and so on; each step's device times come back at its own end (the fake
    # events are done at once), `other` in the wall and left out of the phases.
    assert device_steps(c.sent) == [
        ([[fwd, 7000]], 14000),
        ([[bwd, 7000], [opt, 7000]], 35000),
    ] + [([[bwd, 7000], [opt, 7000], [fwd, 7000]], 49000)] * 4
    hosts = host_steps(c.sent)
    assert len(hosts) == 6
    assert all(m["prof"] is False and m["timing"] == "GpuEvents" for m in hosts)


def test_zero_code_sync_mode_calls_torchs_own_synchronize_not_the_scripts(fake_cuda_auto):
    torch, a, c = fake_cuda_auto
    a.gpu_timing = "Sync"
    before = FakeCuda.syncs
    train(torch, 2)
    assert FakeCuda.syncs > before
    hosts = host_steps(c.sent)
    assert len(hosts) == 3 and all(m["timing"] == "GpuSync" for m in hosts)
    # The marks' synchronize is not the script's: no `sync` counted.
    assert all("n" not in m for m in hosts), hosts
