"""Batched IAC screening answers exactly what per-configuration screening answers."""

from __future__ import annotations

import numpy as np
from conftest import Constant, a100_nodes

from elastico_extender.core.interference.predictor import ContentionPredictor
from elastico_extender.core.model import GpuDevice, Job, Node, Snapshot
from elastico_extender.core.planner import plan
from elastico_extender.core.planner.devices import DeviceTable
from elastico_extender.core.planner.placement import Placer
from elastico_extender.core.planner.screening import OptionScreen


def _crowded_placer(families) -> tuple[Placer, list[str]]:
    table = DeviceTable(a100_nodes(2, 4), 512.0)
    placer = Placer(table, ContentionPredictor(), rows=16)
    names = sorted(families)
    rng = np.random.default_rng(3)
    for row in range(10):
        fam = families[names[row % len(names)]]
        config = int(np.argmin(fam.resources[:, 1]))  # leanest memory: many fit per GPU
        device = row % table.size
        placer.commit(
            row, config, [device], fam.resources[config], fam.features[config],
            float(rng.uniform(1.1, 1.6)),
        )  # fmt: skip
    return placer, names


def test_option_screen_matches_predict_against_for_every_configuration(families):
    placer, names = _crowded_placer(families)
    fam = families[names[0]]
    busy = np.flatnonzero(placer.table.count > 0)
    configs = list(range(fam.size))
    screen = OptionScreen(placer, busy, configs, fam.features)
    # Open loop, and the closed loop's admission bands of a one-GPU job and of a gang.
    for banded, gpus in ((False, 1), (True, 1), (True, 2)):
        placer.banded = banded
        margin = placer.margin_for(gpus)
        for config in configs:
            for tau in (1.05, 1.3, 2.0):
                want = placer.predict_against(busy, fam.features[config], tau, gpus)
                got = screen.verdict(config, busy, tau, margin)
                assert np.array_equal(got[0], want[0])
                assert np.allclose(got[1], want[1])
    # A subset of the devices (best-fit top-k) is answered for that subset only.
    some = busy[::2]
    want = placer.predict_against(some, fam.features[0], 1.2)
    got = screen.verdict(0, some, 1.2, placer.margin_for(1))
    assert np.array_equal(got[0], want[0]) and np.allclose(got[1], want[1])


def test_a_refused_first_choice_screens_the_rest_in_one_predictor_call(families):
    placer, names = _crowded_placer(families)
    calls: list[int] = []

    class Counting:
        name = "counting"

        def predict(self, x: np.ndarray) -> np.ndarray:
            calls.append(x.shape[0])
            return np.full(x.shape[0], 3.0)  # every pair refused

    placer.predictor = Counting()
    fam = families[names[1]]
    k = fam.size
    options = list(range(k))
    for d in range(placer.table.size):  # no idle GPU left
        if placer.table.count[d] == 0:
            placer.commit(20 + d, 0, [d], fam.resources[0] * 0, fam.features[0], 9.0)
    placed = placer.try_place(12, 1, options, fam.resources, fam.features, np.full(k, 1.5))
    assert placed is None
    # First choice alone, then every other one at once; one more call predicts, once per
    # device state, what the occupants of the two devices with two tenants already suffer.
    shared = sum(1 for m in placer.table.occupants.values() if len(m) >= 2)
    assert k > 2 and shared == 2 and len(calls) == 3
    assert sorted(calls).count(2 * shared) == 1  # 2 devices x 2 ordered pairs


def test_a_held_apart_row_is_refused_without_screening_once_its_question_failed(families):
    """Held-apart and run-alone rows only lose devices to their constraints: when the same
    question without them found nothing, they are refused at once, whatever their number."""
    placer, names = _crowded_placer(families)
    calls: list[int] = []

    class Refusing:
        name = "refusing"

        def predict(self, x: np.ndarray) -> np.ndarray:
            calls.append(x.shape[0])
            return np.full(x.shape[0], 3.0)

    placer.predictor = Refusing()
    fam = families[names[1]]
    k = fam.size
    for d in range(placer.table.size):  # no idle GPU left
        if placer.table.count[d] == 0:
            placer.commit(20 + d, 0, [d], fam.resources[0] * 0, fam.features[0], 9.0)
    placer.set_loop({(12, 0), (0, 12), (13, 1), (1, 13)}, set())
    tau = np.full(k, 1.5)

    def ask(row: int) -> object:
        options = list(range(k))
        shapes, features = fam.resources, fam.features
        return placer.try_place(row, 1, options, shapes, features, tau, shape="family")

    assert ask(12) is None
    asked = len(calls)
    assert asked > 0
    assert ask(13) is None
    assert len(calls) == asked  # the second held-apart row asked the predictor nothing


def _full_placer(families, predictor, nodes: int = 2) -> tuple[Placer, object]:
    """Every device occupied once by a tolerant tenant: a newcomer must share."""
    table = DeviceTable(a100_nodes(nodes, 4), 512.0)
    placer = Placer(table, predictor, rows=64)
    fam = families["dcgan"]  # 8 GiB at its leanest: two fit on a 40 GiB GPU
    config = int(np.argmin(fam.resources[:, 1]))
    for d in range(table.size):
        placer.commit(30 + d, config, [d], fam.resources[config], fam.features[config], 9.0)
    return placer, fam


def test_a_screen_refusal_answers_later_jobs_of_its_shape_at_no_higher_tolerance(families):
    """Issue 14: a queue of hundreds of one-GPU jobs of a few shapes re-screened every
    configuration per job (296k failed searches in three days of Philly 6214e9)."""
    predictor = Constant(1.4)
    placer, fam = _full_placer(families, predictor)
    k = fam.size
    options = list(range(k))

    def ask(row: int, tau: float) -> object:
        tolerance = np.full(k, tau)
        return placer.try_place(
            row, 1, options, fam.resources, fam.features, tolerance, commit=False, shape="s"
        )

    assert ask(1, 1.3) is None and predictor.asked > 0  # 1.4 > 1.3: refused everywhere
    first, predictor.asked = predictor.asked, 0
    assert ask(2, 1.25) is None  # a lower tau than a refusal: refused without screening
    assert predictor.asked == 0
    assert ask(3, 1.5) is not None  # a higher one is screened again, and fits
    assert predictor.asked > 0
    predictor.asked = 0
    placer.commit(4, 0, [0], fam.resources[0], fam.features[0], 9.0)
    # A placement only takes room: the refusal stands once the device placed on is
    # screened again, and then answers without asking.
    assert ask(5, 1.2) is None and predictor.asked > 0
    predictor.asked = 0
    assert ask(6, 1.2) is None and predictor.asked == 0
    placer.release(4, fam.resources[0])  # room freed: every refusal is forgotten
    assert ask(7, 1.2) is None and predictor.asked >= first


def test_a_search_with_no_idle_gpu_stops_after_its_screened_options(families):
    """With every device busy, each option needs a screen and at most
    MAX_SCREENED_OPTIONS are screened: the search must stop there, not build a device
    mask for each of a family's remaining configurations (up to ~200, every job of a
    queue, every epoch: a 500-job epoch on 256 GPUs went from ~50 to ~500 ms)."""
    from elastico_extender.core.planner.placement import MAX_SCREENED_OPTIONS

    placer, fam = _full_placer(families, Constant(1.4))
    masks = []
    fits = placer.table.fits
    placer.table.fits = lambda demand: masks.append(1) or fits(demand)  # type: ignore[method-assign]
    options = list(range(fam.size))
    assert len(options) > 2 * MAX_SCREENED_OPTIONS
    tolerance = np.full(fam.size, 1.3)  # refused next to every tenant
    placed = placer.try_place(1, 1, options, fam.resources, fam.features, tolerance)
    assert placed is None
    assert len(masks) <= MAX_SCREENED_OPTIONS


def test_remembered_refusals_place_every_job_exactly_as_a_full_search_does(families):
    """The memory changes the cost of a search, never its answer: two placers fed the
    same random queue (jobs of three shapes, tolerances on a fine grid so that refusals
    sit next to acceptances, random option orders, commits and releases), one told the
    shapes and one not, agree on every answer."""
    rng = np.random.default_rng(11)
    names = ["dcgan", "ncf", "pointnet"]
    assert set(names) <= set(families)
    for trial in range(3):
        # 48 devices: more busy ones than a screen checks (MAX_CHECKED_DEVICES), so a
        # device placed on can enter the checked set and turn a refusal into a placement.
        placers = [_full_placer(families, ContentionPredictor(), 12)[0] for _ in range(2)]
        placed_rows: list[tuple[int, np.ndarray]] = []
        refused = 0
        for step in range(300):
            name = names[int(rng.integers(len(names)))]
            fam = families[name]
            k = fam.size
            options = [int(c) for c in rng.permutation(k)[: int(rng.integers(1, k + 1))]]
            tolerance = np.round(rng.uniform(1.0, 1.6, size=k), 2)
            row = 100 + step
            answers = [
                placer.try_place(
                    row, 1, options, fam.resources, fam.features, tolerance, shape=shape
                )
                for placer, shape in zip(placers, (name, None), strict=True)
            ]
            assert answers[0] == answers[1], (trial, step)
            refused += answers[0] is None
            if answers[0] is not None:
                placed_rows.append((row, fam.resources[answers[0].config]))
            if placed_rows and rng.random() < 0.2:
                gone, demand = placed_rows.pop(int(rng.integers(len(placed_rows))))
                for placer in placers:
                    placer.release(gone, demand)
        assert placed_rows and refused > 20, (len(placed_rows), refused)


def test_a_refusal_is_rechecked_on_a_device_placed_on_since(families):
    """A screen checks only the MAX_CHECKED_DEVICES fullest busy devices.  A device
    outside them that something is placed on becomes fuller and enters them; if it is
    safe there, the job must be placed on it, not refused from memory."""
    from elastico_extender.core.planner.placement import MAX_CHECKED_DEVICES

    bert, dcgan, deepseek = families["bert"], families["dcgan"], families["deepseek-1.5b"]
    harmful = np.asarray(bert.features, dtype=np.float32)

    class HarmfulBert:
        """Any pair with a BERT job is slowed 2x, every other pair 1.1x."""

        name = "harmful-bert"

        def predict(self, x: np.ndarray) -> np.ndarray:
            with_bert = np.zeros(x.shape[0], dtype=bool)
            for block in (x[:, :14], x[:, 14:28]):
                with_bert |= (block[:, None, :] == harmful[None, :, :]).all(axis=2).any(axis=1)
            return np.where(with_bert, 2.0, 1.1)

    table = DeviceTable(a100_nodes(9, 4), 512.0)  # 36 devices
    assert table.size > MAX_CHECKED_DEVICES + 2
    placer = Placer(table, HarmfulBert(), rows=64)
    lean = {f: int(np.argmin(fam.resources[:, 1])) for f, fam in
            (("bert", bert), ("dcgan", dcgan), ("deepseek", deepseek))}  # fmt: skip
    x = table.size - 1  # the emptiest busy device: a dcgan, outside the checked set
    for d in range(x):
        c = lean["bert"]
        placer.commit(d, c, [d], bert.resources[c], bert.features[c], 9.0)
    c = lean["dcgan"]
    placer.commit(x, c, [x], dcgan.resources[c], dcgan.features[c], 9.0)
    k = dcgan.size
    options = [lean["dcgan"]]

    def ask(row: int) -> object:
        return placer.try_place(
            row, 1, options, dcgan.resources, dcgan.features, np.full(k, 1.5), shape="dcgan"
        )

    assert ask(40) is None  # the checked devices all hold a BERT job
    # A deepseek job on device x leaves it fuller than the BERT devices: it is now
    # checked first, and a dcgan there is slowed 1.1 + 0.1 = 1.2 <= 1.5.
    c = lean["deepseek"]
    placer.commit(41, c, [x], deepseek.resources[c], deepseek.features[c], 9.0)
    assert table.mem_free[x] < table.mem_free[:x].min()
    placed = ask(42)
    assert placed is not None and placed.devices == (x,)


def test_the_refusal_log_of_a_placer_that_only_places_stays_bounded(families, monkeypatch):
    from elastico_extender.core.planner import placement

    monkeypatch.setattr(placement, "REFUSAL_LOG_LIMIT", 8)
    predictor = Constant(1.4)
    placer, fam = _full_placer(families, predictor)
    k = fam.size
    tolerance = np.full(k, 1.3)
    options = list(range(k))
    refused = placer.try_place(1, 1, options, fam.resources, fam.features, tolerance, shape="s")
    assert refused is None and placer._refused
    for row in range(100, 120):  # tolerant tenants, one device after another
        d = row % placer.table.size
        placer.commit(row, 0, [d], fam.resources[0] * 0, fam.features[0], 9.0)
        assert len(placer._placed_on) <= 8
    assert not placer._refused  # forgotten with the log, not left pointing past it


def test_a_kept_placer_forgets_a_refusal_once_the_correction_learned_the_pair(families):
    """The service's PlacementView keeps one placer while observations teach the online
    correction: a refusal remembered before must not answer once the pair is known fine."""
    from elastico_extender.core.interference.features import pair_features
    from elastico_extender.core.interference.online import OnlineCorrection

    class Harsh(Constant):
        generation = 0  # fixed answers

    correction = OnlineCorrection(Harsh(1.4))
    placer, fam = _full_placer(families, correction)
    k = fam.size
    lean = int(np.argmin(fam.resources[:, 1]))  # what every occupant runs

    def ask(p: Placer) -> object:
        return p.try_place(
            1, 1, [lean], fam.resources, fam.features, np.full(k, 1.3), commit=False, shape="s"
        )

    assert ask(placer) is None  # 1.4 > 1.3 everywhere: remembered
    block = np.asarray(fam.features[lean], dtype=np.float32)[None]
    row = pair_features(block, block, float(placer.table.memory_total[0]) / 1024.0)
    for _ in range(30):  # observed: this pair runs unslowed
        correction.learn(row, np.ones(1))
    assert correction.predict(row)[0] < 1.1
    assert ask(_full_placer(families, correction)[0]) is not None  # a fresh placer places
    assert ask(placer) is not None  # and so does the one kept since


def test_a_job_too_big_for_the_idle_gpu_is_screened_next_to_others(families):
    """A one-GPU job whose configuration no idle GPU holds (only a 24 GB one is idle)
    but which fits next to a lean job on an 80 GB GPU is screened there and placed;
    the search reused its idle-device mask for the idle-GPU pick and raised TypeError,
    so the whole plan failed (every epoch, in the extender) in such a mixed cluster."""
    nodes = (
        Node("small", (GpuDevice(0, 24576.0, "gpu-24"),)),
        Node("big", (GpuDevice(0, 81920.0, "gpu-80"),)),
    )
    jobs = (Job("lean", "lstm", current_config=0, devices=(("big", 0),)), Job("bert", "bert"))
    result = plan(Snapshot(nodes, jobs, families), predictor=ContentionPredictor())
    assert set(result.assignments) == {"lean", "bert"}
