#    Licensed under the Apache License, Version 2.0 (the "License"); you may
#    not use this file except in compliance with the License. You may obtain
#    a copy of the License at
#
#         http://www.apache.org/licenses/LICENSE-2.0
#
#    Unless required by applicable law or agreed to in writing, software
#    distributed under the License is distributed on an "AS IS" BASIS, WITHOUT
#    WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See the
#    License for the specific language governing permissions and limitations
#    under the License.

"""Review 29: a prepare and its abort served at once (231157f).

The testbed's stand-in for Cinder's volume RPC now serves each peer call
in its own thread, as a volume service's RPC executor does: the abort a
source sends once its prepare timed out reaches the destination while
that prepare may still run there.  Destination.prepare and .abort both
run under move.build_lock; the abort assumes it takes the lock *after*
its prepare ("makes the abort wait for the build, so it removes
everything the build made").  These tests stage the other order.  The
reviewer's two findings were expected failures; both are fixed
(Destination.refuse_if_aborted_here, the counted Destination.building).
"""

import contextlib
import threading

from cinder import exception

from cinder_dmclone import move
from tests.harness.fake_cluster import VOLUME_ID
from tests.unit import test_two_nodes


class AbortOvertakesItsPrepareTestCase(test_two_nodes.ClusterTestCase):
    """The abort of move 1 takes node-b's build lock before move 1's prepare.

    Both are served at once on node-b; the prepare, dispatched first,
    stalled before the build lock for longer than node-a's transfer
    timeout (e.g. node-b's database reads in the manager's flow and in
    Endpoint.check), so node-a timed out and sent the abort, which the
    lock's waiters then let in first.
    """

    def stage_prepare_after_abort(self):
        """node-b's prepare of the move runs only once its abort answered.

        node-a's prepare call fails (its timeout); its give-up sends the
        abort, which runs on node-b in full (nothing is built yet, the
        mark goes) and answers; then the stalled prepare gets the build
        lock, still before node-a dropped the export and cleared the
        record (node-a does both right after the abort's answer).
        """
        dest = self.b.destination
        prepare, abort = dest.prepare, dest.abort
        stalled, ran = [], []

        def stalling_prepare(volume, step):
            stalled.append((volume, dict(step)))
            raise exception.VolumeBackendAPIException(
                data='node-a gave up waiting (transfer timeout)')

        def abort_then_the_stalled_prepare(volume, step):
            abort(volume, step)
            while stalled:
                args = stalled.pop()
                try:
                    ran.append(prepare(*args))
                except Exception as exc:
                    ran.append(exc)
        self.mock_object(dest, 'prepare', side_effect=stalling_prepare)
        self.mock_object(dest, 'abort',
                         side_effect=abort_then_the_stalled_prepare)
        return ran

    # Control: the order the abort's docstring assumes (prepare first, abort
    # waiting for it) leaves nothing on node-b.
    def test_control_prepare_then_abort_leaves_nothing(self):
        self.c.withdraw_attach_during_build()
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.c.settle()
        self.c.assert_rolled_back(aborted_ok=True)

    # Finding 1 (LOW: a leaked clone, LVs holding the tenant's data).
    # 1. node-a records move 1 and calls node-b's prepare; node-b's
    #    worker dispatches it, but it stalls before the build lock longer
    #    than node-a's transfer timeout;
    # 2. node-a times out and gives move 1 up: its abort reaches node-b
    #    and takes the build lock first: nothing built, the mark goes
    #    (Destination.abort, destination.py:791-807); it answers;
    # 3. node-b's stalled prepare now takes the lock: the record still
    #    says move 1 ``preparing`` (node-a drops the export, then clears
    #    the record, only after the abort's answer), so it authenticates,
    #    marks node-b the destination again, logs in and builds, and
    #    _refuse_if_given_up still reads ``preparing``: the clone stays;
    # 4. node-a drops the export and clears the record.
    # node-b keeps the clone (data and metadata LVs, an iSCSI session to
    # a target that is gone) and a DESTINATION mark of a move no record
    # names: its monitor reports an orphan and a contradiction, nothing
    # removes it until a later move of the volume into node-b (tried: it
    # does), or, once the volume is deleted, node-b's next start (tried:
    # a delete alone leaves it).  An abort that ran should bar a later
    # prepare of the same move (e.g. its secret remembered under the
    # build lock, checked by prepare once the lock is its own).
    # Fixed: Destination.refuse_if_aborted_here.
    def test_a_prepare_after_its_abort_builds_nothing(self):
        ran = self.stage_prepare_after_abort()
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.assertEqual(1, len(ran))
        self.c.settle()
        self.c.assert_rolled_back(aborted_ok=True)


class TwoPreparesOfOneVolumeTestCase(test_two_nodes.ClusterTestCase):
    """Destination.building while two prepares of one volume overlap."""

    # Finding 2 (INFO: a latent invariant, no harmful sequence found).
    # ``building`` is a set: "volumes whose prepare runs here now"
    # (destination.py:143).  A prepare adds the volume before it waits
    # for the build lock, and discards it when it ends: the first of two
    # overlapping prepares of one volume (a stale move 1 stuck in its
    # login, move 2's prepare waiting for the lock) discards it for both.
    # drop_stale_prepare, _mark_here, _drop_stale_node_mark, _roll_forward
    # and restore_record then take move 2's prepare for absent.  Every
    # such path found also needs the volume's lock, which node-a holds
    # for move 2's whole call, so nothing was seen to break; a counter
    # (or a per-volume count of prepares) keeps the documented meaning.
    # Fixed: Destination.building counts (_Prepares).
    def test_a_waiting_prepare_still_counts_as_building(self):
        dest = self.b.destination
        real_lock = move.build_lock
        waiting, go = threading.Event(), threading.Event()
        main = threading.current_thread()

        @contextlib.contextmanager
        def build_lock(volume_id):
            # (The waiter's prepare waits here for the lock: held by a
            # stale prepare stuck in its login, say.)
            if threading.current_thread() is not main:
                waiting.set()
                go.wait(30)
            with real_lock(volume_id):
                yield
        self.mock_object(move, 'build_lock', side_effect=build_lock)
        t1 = self.saved()
        step = {'op': 'prepare', 'secret': t1.secret, 'hydrate': True,
                'size_gb': 1}
        volume = self.volume()
        outcome = []

        def waiting_prepare():
            try:
                outcome.append(dest.prepare(volume, dict(step)))
            except Exception as exc:
                outcome.append(exc)
        waiter = threading.Thread(target=waiting_prepare)
        waiter.start()
        try:
            self.assertTrue(waiting.wait(30))
            # Another prepare of the volume runs here and ends meanwhile
            # (refused, a forged secret: how it ends does not matter).
            try:
                dest.prepare(self.volume(), {'op': 'prepare',
                                             'secret': '0' * 32})
            except Exception:
                pass
            self.assertIn(VOLUME_ID, dest.building)
        finally:
            go.set()
            waiter.join(30)
