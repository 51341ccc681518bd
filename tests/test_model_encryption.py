"""Model-based test of encrypted tasks and key rotation: hypothesis enqueues jobs of an
encrypted task, rotates keys (a new current key, the old ones kept), drops old keys,
reseals the queue, and copies one job's stored arguments onto another; after every step
each stored job is opened as a worker opens it and compared with a plain model.

The model's rules are DESIGN's (§6, security) and the issue's: what is stored is never the
clear text; a job sealed under a key still listed opens, to exactly its arguments; a job
sealed under a key no longer listed does not open (a worker dead-letters it); `reseal`
moves every stored job whose key is listed under the current key, and reports those whose
key is not; a ciphertext moved to another job never opens for that job, whatever is
resealed (copied back onto the job it was sealed for, it opens there again).
"""

from __future__ import annotations

import os
import uuid

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import conveyor
from conveyor.encryption import Unsealable, open_payload, unwrap
from conveyor.reseal import reseal
from helpers import ModuleServer

EXAMPLES = int(os.environ.get("CONVEYOR_MODEL_EXAMPLES", "60"))
SERVER = ModuleServer()
_server = SERVER.fixture()


class EncryptionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.app = conveyor.Conveyor(SERVER.url, namespace=f"e{uuid.uuid4().hex[:10]}")

        @self.app.task(name="charge", queue="q", encrypt=True)
        def charge(card: str) -> str:
            return card

        self.task = charge
        self.keys: dict[str, bytes] = {}
        self.serial = 0
        self._add_key()
        self.app.pause("q")  # jobs stay stored: the steps open them as a worker would
        # model: job id -> (the job its stored ciphertext was sealed for, the key)
        self.jobs: dict[str, tuple[str, str]] = {}
        self.cards: dict[str, str] = {}  # job id -> the arguments it was enqueued with

    def teardown(self) -> None:
        self.app.close()

    def _add_key(self) -> None:
        self.serial += 1
        self.current = f"k{self.serial}"
        self.keys[self.current] = os.urandom(32)
        self._configure()

    def _configure(self) -> None:
        self.app.encryption = conveyor.Encryption(keys=dict(self.keys), current=self.current)

    def _stored(self, job_id: str) -> bytes:
        short = job_id.split("~", 1)[1]
        raw = self.app.redis.hget(self.app.keys("q").job(short), "a")
        assert raw is not None
        return bytes(raw)

    @rule(card=st.text(min_size=1, max_size=20))
    def enqueue(self, card: str) -> None:
        job = self.task.enqueue(card)
        self.jobs[job.id] = (job.id, self.current)
        self.cards[job.id] = card

    @rule()
    def rotate(self) -> None:
        self._add_key()

    @precondition(lambda self: len(self.keys) > 1)
    @rule(data=st.data())
    def drop_a_key(self, data: st.DataObject) -> None:
        old = data.draw(st.sampled_from(sorted(k for k in self.keys if k != self.current)))
        del self.keys[old]
        self._configure()

    @rule()
    def reseal_queue(self) -> None:
        report = reseal(self.app, "q")
        unreadable = {f"q~{short}" for short in report.unreadable}
        expected = {job_id for job_id, (_, key) in self.jobs.items() if key not in self.keys}
        assert unreadable == expected, (unreadable, expected)
        assert not report.busy
        for job_id, (bound, key) in self.jobs.items():
            if key in self.keys:
                self.jobs[job_id] = (bound, self.current)

    @precondition(lambda self: len(self.jobs) >= 2)
    @rule(data=st.data())
    def move_a_ciphertext(self, data: st.DataObject) -> None:
        source, target = data.draw(st.permutations(sorted(self.jobs)))[:2]
        stolen = self._stored(source)
        short = target.split("~", 1)[1]
        self.app.redis.hset(self.app.keys("q").job(short), "a", stolen)
        self.jobs[target] = self.jobs[source]

    @invariant()
    def each_job_opens_exactly_when_the_model_says(self) -> None:
        for job_id, (bound, key) in self.jobs.items():
            raw = self._stored(job_id)
            card = self.cards[bound]
            assert card.encode() not in raw or len(card.encode()) < 6  # short ones may recur
            assert unwrap(raw).key_id == key
            opens = bound == job_id and key in self.keys
            try:
                opened = open_payload(self.app.encryption, raw, "charge", "args", job_id)
            except Unsealable:
                assert not opens, f"{job_id} should open"
                continue
            assert opens, f"{job_id} opened, but should not"
            args, _ = self.app.codec.decode_args(opened)
            assert args == [card]


EncryptionMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=20, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_encryption_matches_its_model = EncryptionMachine.TestCase
