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

"""A move while the database or the message bus goes away and comes back.

Over the two-node model (tests.harness.fake_cluster): the database stops
answering at a chosen point of a move (every call raises oslo.db's
DBConnectionError, as while MariaDB restarts), then answers again.  No
move may stay stuck, and no byte may be lost.
"""

from oslo_db import exception as db_exc
import oslo_messaging
from tooz import coordination as tooz_coordination

from cinder import exception

from cinder_dmclone import move
from tests.harness.fake_cluster import FakeTargetIQN
from tests.harness.fake_cluster import HANDLE
from tests.harness.fake_cluster import META
from tests.harness.fake_cluster import VOLUME_ID
from tests.unit import test_two_nodes

DB_OPS = ('volume_admin_metadata_get', 'volume_admin_metadata_update',
          'volume_admin_metadata_delete', 'volume_update')
NODE_C = {'host': 'node-c', 'ip': '10.0.0.3',
          'initiator': 'iqn.1993-08.org.debian:01:node-c'}


def _acl(node):
    return set(node.target.exports.get(FakeTargetIQN, {}).get('acl', ()))


class DatabaseDownTestBase(test_two_nodes.ClusterTestCase):
    """Base: the database goes away during a move (no tests here)."""

    def db_down(self, ops=DB_OPS):
        for op in ops:
            self.c.db.fail_on[op] = db_exc.DBConnectionError(
                "(2003, \"Can't connect to MySQL server\")")

    def db_up(self):
        self.c.db.fail_on.clear()

    def db_down_once_built(self, ops=DB_OPS, fail=None):
        """The database goes away as node-b answers the prepare.

        With ``fail``, node-b's answer is that error instead.
        """
        prepare = self.b.destination.prepare

        def prepare_then_db_down(volume, step):
            self.b.destination.prepare = prepare     # (once)
            path = prepare(volume, step)
            self.db_down(ops)
            if fail is not None:
                raise fail
            return path
        self.b.destination.prepare = prepare_then_db_down

    def failed_attach_while_db_down(self):
        """An attach on node-b whose outcome node-a could not record."""
        self.db_down_once_built()
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.db_up()
        # (node-a could record nothing: the move is still 'preparing',
        # node-b's clone built and reading node-a.)
        self.assertEqual(move.PREPARING, self.c.transfer().state)
        self.assertIn(HANDLE, self.b.dm.devices)
        self.assertEqual(self.a.host, self.c.db.volumes[VOLUME_ID]['host'])

    def outlive_the_prepare(self):
        """Let more time pass than a prepare's source may still write."""
        self.c.now += self.a.source.stale_prepare_after() + 1


class DatabaseRestartTestCase(DatabaseDownTestBase):

    def test_retried_attach_moves_a_volume_left_preparing(self):
        # Before: every later attach (and a local one on node-a) was
        # refused as "moving" until node-a's service restarted.
        self.failed_attach_while_db_down()
        self.outlive_the_prepare()
        self.c.attach(self.b)
        self.c.settle()
        self.c.assert_completed()

    def test_retry_right_after_moves_the_volume(self):
        # node-a ran the attempt and saw it fail: its own record of that
        # is the proof no attempt will still write the outcome.  Before:
        # every attach was refused as "moving" for the transfer timeout
        # plus two minutes (six minutes in the testbed's stack).
        self.failed_attach_while_db_down()
        self.c.attach(self.b)
        self.c.settle()
        self.c.assert_completed()

    def local_attach_rolls_back(self):
        """A local attach on node-a works, and the move is gone after it."""
        att, info = self.c.attach(self.a)
        self.assertEqual('local', info['driver_volume_type'])
        self.c.attachments.remove(att)
        self.c.assert_rolled_back()

    def test_local_attach_right_after_ends_the_failed_move(self):
        self.failed_attach_while_db_down()
        self.local_attach_rolls_back()

    def test_source_ends_its_failed_move_once_the_database_is_back(self):
        # Nobody retries the attach: node-a's next monitor tick gives the
        # move up (node-b drops its clone) instead of leaving it for the
        # destination's timeout.
        self.failed_attach_while_db_down()
        self.c.tick(self.a)
        self.assertIsNone(self.c.transfer())
        self.assertEqual({}, self.b.dm.devices)
        self.c.assert_rolled_back()

    def test_the_export_stays_until_the_move_is_known_never_committed(
            self):
        # Review 5, finding 3: node-a could not read whether its commit
        # landed: its export stays (node-b's clone may be the volume)
        # until the database tells the move never committed.
        self.failed_attach_while_db_down()
        self.assertEqual({self.b.props['initiator']},
                         self.a.target.exports[FakeTargetIQN]['acl'])
        self.c.tick(self.a)
        self.assertNotIn(FakeTargetIQN, self.a.target.exports)
        self.c.assert_rolled_back()

    def test_an_attach_elsewhere_first_ends_a_failed_move_and_its_export(
            self):
        # The export node-a kept for its failed move must go with the
        # move, never under another node let in to it meanwhile: here
        # node-b aborted the move (node-a's database was away longer than
        # the prepare's budget) and node-c, without a service of this
        # backend, attaches over iSCSI before node-a's next tick.
        self.failed_attach_while_db_down()
        self.outlive_the_prepare()
        self.c.tick(self.b)
        self.assertEqual(move.ABORTED, self.c.transfer().state)
        props = dict(self.b.props, host='node-c',
                     initiator='iqn.1993-08.org.debian:01:node-c')
        info = self.a.attach(self.c.volume(), props)
        self.assertEqual('iscsi', info['driver_volume_type'])
        self.assertIsNone(self.c.transfer())
        self.c.tick(self.a)
        self.assertEqual({props['initiator']},
                         self.a.target.exports[FakeTargetIQN]['acl'])
        self.assertEqual({}, self.a.source.unrecorded)

    def test_the_tick_never_waits_for_a_busy_lock(self):
        # Review 5: retry_give_ups took the lock blocking, unlike every
        # other retry of the tick (a step holding it may wait on a peer
        # up to the transfer timeout).  It waits for the next tick.
        self.failed_attach_while_db_down()
        self.assertIn(VOLUME_ID, self.a.source.unrecorded)
        self.c.busy.add('dmclone-%s' % VOLUME_ID)
        self.c.tick(self.a)
        self.assertEqual([], self.c.violations)
        self.assertIn(VOLUME_ID, self.a.source.unrecorded)
        self.c.busy.discard('dmclone-%s' % VOLUME_ID)
        self.c.tick(self.a)
        self.assertIsNone(self.c.transfer())
        self.c.assert_rolled_back()

    def test_delete_drops_the_clone_of_the_failed_move(self):
        # Review 5: a delete before node-a's next tick gave up only an
        # 'aborted' move: node-b's hydrated clone (the tenant's data)
        # stayed for good, and the tick's retry failed on the deleted
        # volume at every tick.
        self.failed_attach_while_db_down()
        self.c.delete()
        self.c.db.volumes.pop(VOLUME_ID)        # Cinder: the row goes
        self.c.settle()
        self.assertEqual(({}, {}), (self.b.dm.devices, self.b.vg.lvs))
        self.assertEqual({}, self.a.source.unrecorded)

    def test_a_retried_give_up_of_a_deleted_volume_is_dropped(self):
        self.failed_attach_while_db_down()
        self.c.db.volumes.pop(VOLUME_ID)
        self.c.db.admin_metadata.pop(VOLUME_ID, None)
        self.c.tick(self.a)
        self.assertEqual({}, self.a.source.unrecorded)

    def test_source_retries_while_the_database_stays_away(self):
        self.db_down_once_built()
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.c.tick(self.a)             # still away: nothing recorded
        self.db_up()
        self.assertEqual(move.PREPARING, self.c.transfer().state)
        self.c.tick(self.a)
        self.assertIsNone(self.c.transfer())
        self.c.assert_rolled_back()

    def test_after_a_restart_a_young_prepare_is_refused_as_moving(self):
        # A restarted node-a no longer knows its attempt ended; the lock
        # alone does not prove it (per-node locks, a lost lease): a young
        # 'preparing' is left alone until it outlived any attempt.
        self.failed_attach_while_db_down()
        self.a.restart()
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.a)
        self.assertEqual(move.PREPARING, self.c.transfer().state)
        self.assertIn(HANDLE, self.b.dm.devices)
        self.outlive_the_prepare()
        self.c.attach(self.b)
        self.c.settle()
        self.c.assert_completed()

    def test_failed_move_memory_never_ends_a_later_move(self):
        # node-a knows the failed attempt by its secret: a later move of
        # the volume is never taken for it.
        self.failed_attach_while_db_down()
        ended = self.a.source.unrecorded[VOLUME_ID]
        self.c.attach(self.b)           # a new move, a new secret
        self.assertNotIn(VOLUME_ID, self.a.source.unrecorded)
        self.a.source.unrecorded[VOLUME_ID] = ended
        self.c.tick(self.a)
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        self.assertNotIn(VOLUME_ID, self.a.source.unrecorded)
        self.c.settle()
        self.c.assert_completed()

    def test_local_attach_ends_a_move_left_preparing(self):
        self.failed_attach_while_db_down()
        self.outlive_the_prepare()
        self.local_attach_rolls_back()

    def test_destination_drops_a_clone_nobody_waits_for(self):
        # Before: node-b kept the clone (hydrating from node-a, with an
        # iSCSI session) for good, and the record stayed 'preparing'.
        # (node-a, restarted, no longer knows it ended the attempt.)
        self.failed_attach_while_db_down()
        self.a.restart()
        self.c.settle()
        self.assertEqual(({}, {}, {}), (self.b.dm.devices, self.b.vg.lvs,
                                        self.b.connector.sessions))
        # (Kept 'aborted', inert, for node-a to end.)
        self.assertEqual(move.ABORTED, self.c.transfer().state)
        self.log.warning.assert_called()
        # node-a never saw the commit refused, so it kept the export made
        # for the move: its recovery ends the move, and the export.
        self.a.recover()
        self.c.assert_rolled_back()

    def test_a_half_built_clone_goes_while_the_database_is_away(self):
        # The build fails with the database away: its teardown removes
        # what it built at once (LVM tells it is the move's own), where
        # it used to read the loss record first and raise.
        build = self.b.dest.build_clone

        def build_then_fail(*args, **kwargs):
            build(*args, **kwargs)
            self.db_down()
            raise exception.VolumeBackendAPIException(data='build failed')
        self.mock_object(self.b.dest, 'build_clone',
                         side_effect=build_then_fail)
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual({}, self.b.dm.devices)
        self.assertEqual({}, self.b.connector.sessions)
        self.db_up()

    def test_young_prepare_is_not_dropped_on_a_free_lock(self):
        # Before: the first tick of node-b's monitor, the lock free,
        # aborted the move and tore the clone down at once.
        self.failed_attach_while_db_down()
        self.c.tick(self.b)
        self.assertEqual(move.PREPARING, self.c.transfer().state)
        self.assertIn(HANDLE, self.b.dm.devices)

    def test_per_node_locks_never_drop_a_clone_being_committed(self):
        # node-b's monitor does not see node-a's lock (per-node locks, or
        # a lost etcd lease) and ticks after node-a read 'preparing' and
        # before it records the commit.  Before: node-b aborted the move
        # and removed the clone, then node-a recorded it hydrating and
        # pointed the volume at node-b: the data was orphaned.
        self.tick_b_as_a_commits()
        self.c.attach(self.b)
        self.c.settle()
        self.c.assert_completed()

    def test_a_destination_clock_ahead_never_drops_a_live_prepare(self):
        # Review 4, finding 5: node-b's wall clock runs 300 s ahead of
        # node-a's (no NTP) and the lock does not exclude (a lost lease).
        # Before: node-b took node-a's start time for 300 s old, more
        # than its transfer timeout plus two minutes, and dropped the
        # clone node-a was committing: the data was orphaned.
        self.b.store._clock = lambda: self.c.now + 300
        self.tick_b_as_a_commits()
        self.c.attach(self.b)
        self.c.settle()
        self.c.assert_completed()

    def test_a_shorter_timeout_on_the_destination_never_drops_a_live_prepare(
            self):
        # Review 4, finding 5: node-a waits up to 600 s for the prepare
        # (dmclone_transfer_timeout), node-b's own timeout is 30 s; the
        # build takes 400 s (a slow login) and the lock does not exclude.
        # Before: node-b judged the prepare by its own timeout (30 + 120
        # s) and aborted it while node-a still waited: the attach failed.
        self.a.peer.timeout = 600
        self.b.peer.timeout = 30
        prepare = self.b.destination.prepare
        lock = 'dmclone-%s' % VOLUME_ID

        def slow_prepare(volume, step):
            path = prepare(volume, step)
            self.c.now += 400
            self.c.held.discard(lock)
            self.c.tick(self.b)
            self.c.held.add(lock)
            return path
        self.b.destination.prepare = slow_prepare
        self.c.attach(self.b)
        self.c.settle()
        self.c.assert_completed()

    def test_the_destination_counts_from_the_prepare_it_received(self):
        # node-b's clone of a prepare nobody waits for goes once node-a's
        # recorded budget has passed on node-b's own clock since the
        # prepare reached it, whatever the two wall clocks say.
        self.a.peer.timeout = 600
        self.b.peer.timeout = 30
        self.b.store._clock = lambda: self.c.now - 10000
        self.failed_attach_while_db_down()
        budget = 600 + move.STALE_PREPARE_MARGIN
        self.c.now += budget - 31
        self.c.tick(self.b)         # (30 s later: one short of it)
        self.assertEqual(move.PREPARING, self.c.transfer().state)
        self.assertIn(HANDLE, self.b.dm.devices)
        self.c.tick(self.b)
        self.assertEqual(move.ABORTED, self.c.transfer().state)
        self.assertEqual({}, self.b.dm.devices)

    def test_the_source_keeps_the_budget_it_recorded(self):
        # node-a's timeout changed (a restart with a new configuration)
        # after it recorded the move: the move keeps the figure it was
        # recorded with, on node-a too.
        self.a.peer.timeout = 600
        self.failed_attach_while_db_down()
        self.a.restart()
        self.a.peer.timeout = 10
        self.c.now += 200
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.a)
        self.assertEqual(move.PREPARING, self.c.transfer().state)
        self.c.now += 600
        self.c.attach(self.b)
        self.c.settle()
        self.c.assert_completed()

    def slow_prepare(self, seconds):
        """node-b's prepare succeeds, ``seconds`` after node-a called it.

        (A build slower than node-a's timeout: an RPC answer that comes
        late, a call retried.)
        """
        prepare = self.b.destination.prepare

        def slow(volume, step):
            path = prepare(volume, step)
            self.c.now += seconds
            return path
        self.b.destination.prepare = slow

    def test_a_commit_past_the_deadline_is_refused(self):
        # Review 5, finding 7: node-a never checked the deadline it had
        # recorded before committing: past it, either node takes the
        # move for dead and may be giving it up.  The attach now fails
        # and the move is given up whole.
        self.slow_prepare(self.a.source.stale_prepare_after())
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.attach, self.b)
        self.assertIn('deadline', str(exc))
        self.c.assert_rolled_back()

    def test_a_commit_before_the_deadline_goes_through(self):
        self.slow_prepare(self.a.source.stale_prepare_after() - 1)
        self.c.attach(self.b)
        self.c.settle()
        self.c.assert_completed()

    def test_a_clone_dropped_at_the_deadline_is_never_committed(self):
        # node-b's monitor takes the move for dead once the deadline has
        # passed, as node-a commits it (the lock does not exclude it),
        # and removes the clone.  Before: node-a's commit, read before
        # node-b's abort and written after it, named a clone that was
        # gone: the volume record pointed at node-b, which held nothing.
        self.slow_prepare(self.a.source.stale_prepare_after())
        self.tick_b_as_a_commits()
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.c.assert_rolled_back()

    def tick_b_as_a_commits(self):
        """node-b's monitor ticks as node-a records the commit.

        The lock does not exclude it (per-node locks, a lost lease).
        """
        load = self.a.store.load
        transition = self.a.store.transition
        lock = 'dmclone-%s' % VOLUME_ID
        inside = []

        def transition_watched(ctxt, t, expected, state):
            inside.append(state)
            try:
                return transition(ctxt, t, expected, state)
            finally:
                inside.pop()

        def load_then_tick(ctxt, volume_id):
            current = load(ctxt, volume_id)
            if inside and inside[-1] == move.HYDRATING:
                self.c.held.discard(lock)
                self.c.tick(self.b)
                self.c.held.add(lock)
            return current
        self.mock_object(self.a.store, 'transition',
                         side_effect=transition_watched)
        self.mock_object(self.a.store, 'load', side_effect=load_then_tick)

    def test_undated_prepare_is_left_alone_and_reported(self):
        # A 'preparing' written by an older release has no start time:
        # nothing tells how old it is, so nobody acts on it.
        self.failed_attach_while_db_down()
        self.c.db.volume_admin_metadata_delete(
            self.c.ctxt, VOLUME_ID, 'dmclone_prepared_at')
        self.a.restart()                # (the upgrade)
        self.outlive_the_prepare()
        self.c.settle()
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.a)
        self.assertEqual(move.PREPARING, self.c.transfer().state)
        self.assertIn(HANDLE, self.b.dm.devices)
        self.assertIn('no start time',
                      ' '.join(str(c) for c in self.log.warning.mock_calls))

    def test_a_move_aborted_by_its_destination_moves_again(self):
        self.failed_attach_while_db_down()
        self.c.settle()
        self.c.attach(self.b)
        self.c.settle()
        self.c.assert_completed()

    def test_source_restart_ends_a_move_its_destination_aborted(self):
        # node-a died before it could drop the export made for the move
        # (its ACL admits node-b): its restart still finds the move.
        self.c.crash_at(self.a.store, 'transition', 'before',
                        lambda ctxt, t, expected, state:
                        state == move.HYDRATING)
        self.c.restart_before_timeout = False
        self.assertRaises(oslo_messaging.MessagingTimeout,
                          self.c.attach, self.b)
        self.outlive_the_prepare()
        self.c.settle()
        self.assertEqual(move.ABORTED, self.c.transfer().state)
        self.assertEqual({}, self.b.dm.devices)
        self.c.restart(self.a)
        self.c.assert_rolled_back()

    def test_no_clone_dropped_while_its_source_waits(self):
        # The source holds the volume's lock while it waits for node-b's
        # answer: a tick meanwhile leaves the clone alone.
        ticks = []
        prepare = self.b.destination.prepare

        def prepare_then_tick(volume, step):
            path = prepare(volume, step)
            # (node-a's service holds the lock: busy for node-b's.)
            lock = 'dmclone-%s' % VOLUME_ID
            self.c.held.discard(lock)
            self.c.busy.add(lock)
            self.c.tick(self.b)
            self.c.busy.discard(lock)
            self.c.held.add(lock)
            ticks.append(self.c.transfer().state)
            return path
        self.b.destination.prepare = prepare_then_tick
        self.c.attach(self.b)
        self.assertEqual([move.PREPARING], ticks)
        self.c.settle()
        self.c.assert_completed()

    def test_no_clone_dropped_while_it_is_built(self):
        # A prepare still building here (its source gave up waiting) is
        # not a stale clone yet: its own check removes it when it ends.
        t = self.saved()
        self.b.destination.building.add(VOLUME_ID)
        self.b.dest.create_volumes(t, 1)
        self.assertFalse(self.b.destination.drop_stale_prepare(VOLUME_ID, t))
        self.assertIn(META, self.b.vg.lvs)
        self.assertEqual(move.PREPARING, self.c.transfer().state)

    def test_failed_prepare_is_given_up_although_its_export_stays_named(self):
        # node-b fails, and the database refuses to forget node-a's export
        # (volume_update): the destination is still asked to drop its
        # side and the move is cleared.  Before: the clean-up stopped at
        # the first database error and left the move 'preparing'.
        self.db_down_once_built(
            ops=('volume_update',),
            fail=exception.VolumeBackendAPIException(data='boom'))
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.db_up()
        self.c.assert_rolled_back()

    def commit_without_the_volume_record(self):
        """node-a records the commit, the database refuses the new host."""
        transition = self.a.store.transition

        def transition_then_db_down(ctxt, t, expected, state):
            transition(ctxt, t, expected, state)
            if state == move.HYDRATING:
                self.db_down(('volume_update',))
        self.mock_object(self.a.store, 'transition',
                         side_effect=transition_then_db_down)
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.db_up()
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        self.assertEqual(self.a.host, self.c.db.volumes[VOLUME_ID]['host'])

    def test_committed_move_whose_record_still_names_the_source(self):
        # node-a recorded the commit (hydrating) but not the volume's new
        # host.  Before: node-a refused every retire ("its record still
        # names this node"): the move never finished.
        self.commit_without_the_volume_record()
        self.c.settle()
        self.c.assert_completed()

    def test_source_restart_leaves_a_committed_move_to_its_destination(self):
        # Before: node-a's recovery saw a record naming it and abandoned
        # the move: node-b tore down the clone an instance writes to.
        self.commit_without_the_volume_record()
        self.c.restart(self.a)
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        self.assertIn(HANDLE, self.b.dm.devices)
        self.c.settle()
        self.c.assert_completed()

    def test_extend_on_the_source_of_a_committed_move_is_refused(self):
        # Cinder routes the extend to the host the record names: node-a,
        # whose LV is no longer the volume.  Before: node-a grew its old
        # copy, node-b's clone kept the old size.
        self.commit_without_the_volume_record()
        self.assertRaises(move.MoveInProgress, self.extend_on, self.a)
        # (On node-b, the volume's home once the record follows, it is
        # allowed.)
        self.assertTrue(self.extend_on(self.b))

    def test_finalize_leaves_a_record_naming_a_third_node(self):
        # Only a record still naming the move's source is repointed.
        self.commit_without_the_volume_record()
        self.c.db.volume_update(self.c.ctxt, VOLUME_ID,
                                {'host': 'node-c@dmclone#dmclone'})
        self.c.settle()
        self.assertEqual('node-c@dmclone#dmclone',
                         self.c.db.volumes[VOLUME_ID]['host'])
        self.assertIn('node-c',
                      ' '.join(str(c) for c in self.log.error.mock_calls))

    def test_destination_refuses_to_abort_a_committed_move(self):
        self.commit_without_the_volume_record()
        t = self.c.transfer()
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.b.destination.abort, self.volume(),
                          {'op': 'abort', 'secret': t.secret})
        self.assertIn(HANDLE, self.b.dm.devices)
        self.assertEqual(move.HYDRATING, self.c.transfer().state)


class Rev2AmbiguousCommitTestCase(test_two_nodes.ClusterTestCase):
    """Review 2: the commit's write lands, but its answer is lost."""

    def commit_lands_unseen(self):
        """node-a's commit lands; its answer and the re-read after it fail.

        The database flaps right at the commit: the transition to
        'hydrating' is written but raises, and the read of the record
        that would tell node-a so fails too.
        """
        transition = self.a.store.transition
        get = self.c.db.volume_admin_metadata_get
        flaps = []

        def get_flapping(ctxt, volume_id):
            if flaps:
                flaps.pop()
                raise db_exc.DBConnectionError('flap')
            return get(ctxt, volume_id)

        def transition_then_raise(ctxt, t, expected, state):
            transition(ctxt, t, expected, state)
            if state == move.HYDRATING:
                t.state = move.PREPARING    # (the caller never saw it)
                flaps.append('the re-read')
                raise db_exc.DBConnectionError('lost answer')
        self.mock_object(self.c.db, 'volume_admin_metadata_get',
                         side_effect=get_flapping)
        self.mock_object(self.a.store, 'transition',
                         side_effect=transition_then_raise)
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.mock_object(self.a.store, 'transition', side_effect=transition)
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        self.hydrate_from_the_export_only()

    def hydrate_from_the_export_only(self):
        """dm-clone copies a region only by reading node-a's export."""
        hydrate = self.b.dm.hydrate

        def hydrate_from_export(name, regions=None):
            if FakeTargetIQN not in self.a.target.exports:
                regions = 0
            return hydrate(name, regions)
        self.b.dm.hydrate = hydrate_from_export

    def test_committed_move_unseen_keeps_its_export(self):
        # Review 5, finding 3: node-a could not tell whether the commit
        # landed, and gave the move up anyway: it dropped the export,
        # node-b refused the abort (committed), the give-up failed, and
        # the monitor's retry then found 'hydrating' and forgot it.
        # node-b hydrated from an export that no longer existed, every
        # attach was refused as "moving", until node-a restarted.
        self.commit_lands_unseen()
        self.assertIn(FakeTargetIQN, self.a.target.exports)
        self.c.settle(ticks=8)
        self.c.assert_completed()
        self.assertEqual({}, self.a.source.unrecorded)

    def test_committed_move_unseen_finishes_after_restarts(self):
        self.commit_lands_unseen()
        self.c.restart(self.a)
        self.c.restart(self.b)
        self.c.settle(ticks=8)
        self.c.assert_completed()

    def test_commit_written_but_reported_failed_never_sticks(self):
        # node-a's transition to 'hydrating' reaches the database, but the
        # connection drops before the answer (oslo.db raises): move()'s
        # except branch drops and forgets the export, then give_up asks
        # node-b to abort -- refused now (committed) -- and the
        # transition to 'aborted' meets MoveStateConflict.  node-b's
        # clone hydrates from an export that no longer exists; node-a's
        # recovery leaves it to node-b (LEAVE_TO_DEST) and restores no
        # export (provider_location was forgotten).
        transition = self.a.store.transition

        def transition_then_raise(ctxt, t, expected, state):
            transition(ctxt, t, expected, state)
            if state == move.HYDRATING:
                t.state = move.PREPARING    # (the caller never saw it)
                raise db_exc.DBConnectionError('lost answer')
        self.mock_object(self.a.store, 'transition',
                         side_effect=transition_then_raise)
        # (the original error, not give_up's MoveStateConflict)
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.attach, self.b)
        self.assertIn('lost answer', str(exc))
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        self.assertIn(FakeTargetIQN, self.a.target.exports)
        self.mock_object(self.a.store, 'transition', side_effect=transition)
        self.hydrate_from_the_export_only()
        self.c.restart(self.a)
        self.c.restart(self.b)
        self.c.settle(ticks=8)
        t = self.c.transfer()
        self.assertIsNone(
            t, 'stuck: move %s, volume on %s, node-a exports %s, node-b '
               'devices %s' % (t and t.state,
                               self.c.db.volumes[VOLUME_ID]['host'],
                               self.a.target.exports,
                               list(self.b.dm.devices)))

    def test_a_failed_give_up_never_hides_the_error(self):
        # The commit's write does not land; giving the move up fails too
        # (here: its record changed meanwhile).  The attach reports the
        # first error, and the move is ended later as a dead 'preparing'.
        transition = self.a.store.transition

        def transition_fails(ctxt, t, expected, state):
            if state == move.HYDRATING:
                raise db_exc.DBConnectionError('lost')
            return transition(ctxt, t, expected, state)
        self.mock_object(self.a.store, 'transition',
                         side_effect=transition_fails)
        self.mock_object(self.a.source, 'give_up', side_effect=(
            move.MoveStateConflict(volume_id=VOLUME_ID, expected='x',
                                   found='y')))
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.attach, self.b)
        self.assertIn('lost', str(exc))
        self.assertNotIn('changed under this step', str(exc))
        self.assertEqual(move.PREPARING, self.c.transfer().state)


class LockServiceDownTestCase(test_two_nodes.ClusterTestCase):
    """The coordination backend (etcd) is down while a service starts."""

    def never_committed(self):
        """A move in ``cloned`` its source never finished recording.

        node-b built the clone; node-a recorded ``cloned`` and died before
        it pointed the volume record at node-b: its recovery abandons it,
        under the volume's lock.
        """
        t = self.saved()
        self.b.destination.prepare(self.volume(), {'op': 'prepare',
                                                   'secret': t.secret})
        self.c.set_state(t, move.CLONED)
        return t

    def lock_down(self):
        self.c.lock_error = tooz_coordination.ToozConnectionError(
            'etcd down')

    def test_an_abandon_the_start_could_not_lock_is_retried(self):
        # Review 4, finding 4: the source's start could not take the lock
        # to abandon the move; nothing tried again until its next start,
        # and the move refused every attach as "moving".
        self.never_committed()
        self.lock_down()
        self.a.restart()
        self.a.recover()
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.assertEqual([], self.ops())
        self.c.tick(self.a)         # still down: it waits
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.c.lock_error = None
        self.c.tick(self.a)
        self.assertEqual(['abort'], self.ops())
        self.assertEqual([], self.c.violations)
        self.c.assert_rolled_back()
        self.assertEqual({}, self.a.moves.recovery.pending_abandon)

    def test_a_retried_abandon_waits_for_a_busy_lock(self):
        self.never_committed()
        self.lock_down()
        self.a.restart()
        self.a.recover()
        self.c.lock_error = None
        self.c.busy.add('dmclone-%s' % VOLUME_ID)
        self.c.tick(self.a)
        self.assertEqual([], self.c.violations)
        self.assertEqual(move.CLONED, self.c.transfer().state)
        self.c.busy.clear()
        self.c.tick(self.a)
        self.c.assert_rolled_back()

    def test_a_retried_abandon_leaves_a_move_that_changed(self):
        # Meanwhile the move was ended (here: node-b rolled it back and
        # a later move of the volume is being recorded): the retry
        # re-reads the record under the lock and leaves it alone.
        t = self.never_committed()
        self.lock_down()
        self.a.restart()
        self.a.recover()
        self.c.lock_error = None
        later = self.c.transfer()
        later.secret = ''
        later.state = move.PREPARING
        self.a.store.save(self.c.ctxt, later)
        self.assertNotEqual(t.secret, later.secret)
        self.c.tick(self.a)
        self.assertEqual([], self.ops())
        self.assertEqual(later, self.c.transfer())
        self.assertEqual({}, self.a.moves.recovery.pending_abandon)


class LeftoverExportTestCase(DatabaseDownTestBase):
    """The ACL a failed move's export keeps once the move is over.

    Review 7 (R7-1): the source records it (``dmclone_move_export``)
    and drops it once no move is recorded.  Review 8: that ACL names
    node-b's initiator, which a later, legitimate iSCSI attach from
    node-b (a multiattach volume, retyped by its owner) uses too: the
    same string.
    """

    def failed_move_ended_by_node_b(self):
        """node-a's failed attempt, which node-b ends and clears.

        node-a could not reach the database: its export (node-b's ACL)
        is kept "until the move is known never committed" (review 5).
        node-b outlives the prepare, aborts it (drop_stale_prepare) and
        its next start clears the 'aborted' record (DROP_ABORTED): no
        record is left to tell node-a the move is over.
        """
        self.failed_attach_while_db_down()
        self.assertIn(self.b.props['initiator'], _acl(self.a))
        self.outlive_the_prepare()
        self.c.tick(self.b)
        self.assertEqual(move.ABORTED, self.c.transfer().state)
        self.b.restart()
        self.b.recover()
        self.assertIsNone(self.c.transfer())

    def test_export_admits_node_b_for_good_once_node_b_ended_the_move(
            self):
        # Before: node-a's retry found no record, forgot its failed move
        # and left the export: node-b's initiator (with the volume's
        # CHAP credentials) stayed admitted to a volume that never moved.
        self.failed_move_ended_by_node_b()
        self.c.tick(self.a)
        self.assertEqual({}, self.a.source.unrecorded)
        self.assertNotIn(self.b.props['initiator'], _acl(self.a))
        self.assertNotIn(move.EXPORT_KEY, self.c.transfer_keys())

    def test_export_admits_node_b_after_node_a_restarts_too(self):
        # node-a's service restarts before the database comes back for
        # it (its memory of the failed attempt is gone): its recovery
        # found no move, and Cinder's ensure_export at start restored the
        # target with node-b's ACL from LIO's saved configuration.
        self.failed_move_ended_by_node_b()
        self.c.restart(self.a)
        self.assertIsNone(self.c.transfer())
        self.assertNotIn(self.b.props['initiator'], _acl(self.a))

    def test_export_admits_node_b_after_node_a_reboots_too(self):
        # As above over a reboot: the ACL is in LIO's saved configuration
        # only, which Cinder's ensure_export would restore.
        self.failed_move_ended_by_node_b()
        self.c.reboot = True
        self.c.restart(self.a)
        self.assertNotIn(self.b.props['initiator'], _acl(self.a))
        self.assertNotIn(self.b.props['initiator'], self.a.target.saved.get(
            FakeTargetIQN, {}).get('acl', ()))

    def test_leftover_acl_goes_alone_when_another_node_uses_the_target(
            self):
        # node-c (no service of this backend) attached over iSCSI after
        # node-b cleared the record: only node-b's ACL goes.
        self.failed_move_ended_by_node_b()
        self.assertIsNone(self.c.transfer())
        info = self.a.attach(self.c.volume(), dict(NODE_C))
        self.assertEqual('iscsi', info['driver_volume_type'])
        self.c.tick(self.a)
        self.assertEqual({NODE_C['initiator']}, _acl(self.a))
        self.assertIsNotNone(
            self.c.db.volumes[VOLUME_ID]['provider_location'])

    def node_b_acl(self):
        return self.b.props['initiator'] in _acl(self.a)

    def test_tick_between_node_cs_export_and_its_acl_keeps_the_target(self):
        # Review 9: node-c's iSCSI attach (no service of this backend)
        # makes the export in create_export -- here it reuses the one
        # that still admits node-b -- and admits node-c only in
        # initialize_connection.  A tick of node-a in between removed
        # node-b's leftover ACL, found the target admitting nobody and
        # removed it: node-c's attach failed.
        self.failed_move_ended_by_node_b()
        create = self.a.create_export
        ticked = []

        def create_then_tick(ctxt, volume, connector):
            update = create(ctxt, volume, connector)
            self.c.tick(self.a)
            ticked.append(_acl(self.a))
            return update
        self.mock_object(self.a, 'create_export',
                         side_effect=create_then_tick)
        info = self.a.attach(self.c.volume(), dict(NODE_C))
        self.assertEqual('iscsi', info['driver_volume_type'])
        # (The tick did remove node-b's leftover ACL, and only that.)
        self.assertEqual([set()], ticked)
        self.assertEqual({NODE_C['initiator']}, _acl(self.a))
        self.assertNotIn(move.EXPORT_KEY, self.c.transfer_keys())
        self.assertIsNotNone(
            self.c.db.volumes[VOLUME_ID]['provider_location'])

    def test_an_export_whose_attach_never_went_on_goes_at_a_later_tick(
            self):
        # An attach whose initialize_connection never came (its manager
        # died in between) is not taken for one in flight for good: once
        # no attach can still be connecting, a tick that finds the ACL of
        # a move that is over (here: recorded again, as by a later move)
        # removes the export it leaves admitting nobody.
        self.failed_move_ended_by_node_b()
        self.a.create_export(self.c.ctxt, self.c.volume(), dict(NODE_C))
        self.c.tick(self.a)
        self.assertEqual(set(), _acl(self.a))
        self.assertIn(FakeTargetIQN, self.a.target.exports)
        later = self.a.source._clock() + \
            self.a.source.stale_prepare_after() + 1
        self.mock_object(self.a.source, '_clock', return_value=later)
        self.a.source.leftover_exports.add(VOLUME_ID)
        self.c.db.volume_admin_metadata_update(
            self.c.ctxt, VOLUME_ID,
            {move.EXPORT_KEY: 'node-a %s' % self.b.props['initiator']},
            False)
        self.c.tick(self.a)
        self.assertNotIn(FakeTargetIQN, self.a.target.exports)

    def test_tick_keeps_the_acl_of_node_bs_later_iscsi_attach(self):
        # The drop before node-b's iSCSI attach fails once (a transient
        # rtstool error): the attach goes on and makes node-b's ACL for
        # its instance; the next tick takes that live ACL for the
        # leftover and removes it (and, as it admits nobody else, the
        # whole target): node-b's instance loses its disk.
        self.failed_move_ended_by_node_b()
        self.c.multiattach = True           # the owner's retype
        terminate = self.a.target.terminate_connection
        calls = []

        def flaky(volume, connector, **kwargs):
            if not calls:
                calls.append(1)
                raise exception.ISCSITargetDetachFailed(volume_id=VOLUME_ID)
            return terminate(volume, connector, **kwargs)
        self.mock_object(self.a.target, 'terminate_connection',
                         side_effect=flaky)
        att, info = self.c.attach(self.b)
        self.assertEqual('iscsi', info['driver_volume_type'])
        self.assertTrue(self.node_b_acl())
        self.c.tick(self.a)
        self.assertTrue(self.node_b_acl(),
                        'tick removed the ACL node-b\'s live attachment uses')
        # (node-b's attach took the ACL over: nothing records it as a
        # leftover any more, and the drop was never tried.)
        self.assertNotIn(move.EXPORT_KEY, self.c.transfer_keys())
        self.assertEqual([], calls)
        self.c.restart(self.a)
        self.assertTrue(self.node_b_acl())

    def test_iscsi_attach_refused_while_the_leftover_acl_cannot_go(self):
        # node-c attaches over iSCSI while node-b's leftover ACL cannot
        # be removed (a transient rtstool error): the attach is refused
        # rather than let in next to an ACL nothing could tell apart
        # later; the tick removes the leftover, and node-c's retry works.
        self.failed_move_ended_by_node_b()
        # The failed attach left its attachment reserved (Cinder 29's
        # attachment_create with a connector); deleted here, else node-c's
        # attach (no attachment of its own) would count as its instance's.
        for att in list(self.c.attachments):
            self.c.detach(att)
        terminate = self.a.target.terminate_connection
        calls = []

        def flaky(volume, connector, **kwargs):
            if not calls:
                calls.append(1)
                raise exception.ISCSITargetDetachFailed(volume_id=VOLUME_ID)
            return terminate(volume, connector, **kwargs)
        self.mock_object(self.a.target, 'terminate_connection',
                         side_effect=flaky)
        self.assertRaises(exception.VolumeBackendAPIException, self.a.attach,
                          self.c.volume(), dict(NODE_C))
        self.assertNotIn(NODE_C['initiator'], _acl(self.a))
        self.assertIn(VOLUME_ID, self.a.source.leftover_exports)
        self.c.tick(self.a)
        self.assertFalse(self.node_b_acl())
        self.assertNotIn(move.EXPORT_KEY, self.c.transfer_keys())
        info = self.a.attach(self.c.volume(), dict(NODE_C))
        self.assertEqual('iscsi', info['driver_volume_type'])
        self.assertEqual({NODE_C['initiator']}, _acl(self.a))

    def test_acl_an_attachment_names_is_never_taken_for_the_leftover(self):
        # The record of the leftover is still there while an attachment
        # of node-b uses that very ACL (made by a release that did not
        # take it over): a restart keeps the ACL and forgets the record.
        self.failed_move_ended_by_node_b()
        self.c.multiattach = True
        self.mock_object(self.a.source, '_take_over_recorded_acl')
        self.c.attach(self.b)
        self.assertIn(move.EXPORT_KEY, self.c.transfer_keys())
        self.c.restart(self.a)
        self.assertTrue(self.node_b_acl())
        self.assertNotIn(move.EXPORT_KEY, self.c.transfer_keys())

    def test_ending_an_aborted_move_keeps_node_bs_later_iscsi_attach(
            self):
        # node-b is down: the attempt fails, its export goes, but the
        # database does not let the key be forgotten (tolerated: "does
        # not stop the give-up"); the move is recorded 'aborted'.  The
        # owner retypes the volume multiattach and attaches it on node-b
        # over iSCSI (node-b's Nova is up, only its volume service is
        # down): nothing drops the leftover first while a move is
        # recorded.  node-a restarts: its recovery abandons the aborted
        # move and removes the recorded ACL, which is the live one.
        self.b.down = True
        self.db_down(('volume_admin_metadata_delete',))
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.db_up()
        self.assertEqual(move.ABORTED, self.c.transfer().state)
        self.assertIn(move.EXPORT_KEY, self.c.transfer_keys())
        self.assertFalse(self.node_b_acl())
        self.c.multiattach = True
        owner = self.c.owner()
        info = owner.attach(self.c.volume(), dict(self.b.props))
        self.assertEqual('iscsi', info['driver_volume_type'])
        self.assertTrue(self.node_b_acl())
        self.c.restart(self.a)
        self.assertTrue(self.node_b_acl(),
                        'ending the aborted move removed node-b\'s live ACL')
        self.assertNotIn(move.EXPORT_KEY, self.c.transfer_keys())

    def test_ending_an_aborted_move_keeps_an_acl_an_attachment_names(self):
        # As above, with an attachment of node-b that did not take the
        # recorded ACL over (made by an older release): ending the
        # aborted move leaves the ACL and forgets the record of it.
        self.b.down = True
        self.db_down(('volume_admin_metadata_delete',))
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.db_up()
        self.assertEqual(move.ABORTED, self.c.transfer().state)
        self.c.multiattach = True
        self.mock_object(self.a.source, '_take_over_recorded_acl')
        self.c.attach(self.b)
        self.assertIn(move.EXPORT_KEY, self.c.transfer_keys())
        self.c.restart(self.a)
        self.assertTrue(self.node_b_acl())
        self.assertNotIn(move.EXPORT_KEY, self.c.transfer_keys())

    def test_restore_failing_at_start_keeps_the_record_of_the_acl(self):
        # After a reboot, the restore before the drop fails (it only
        # logs): the kernel has no target, so the ACL "is gone" and the
        # key is forgotten; Cinder's ensure_export then restores LIO's
        # saved configuration, node-b's ACL with it, with nothing left
        # to ever remove it.
        from cinder_dmclone import source as dmc_source
        self.failed_move_ended_by_node_b()
        self.mock_object(dmc_source.Source, '_restore_saved_exports')
        self.c.reboot = True
        self.c.restart(self.a)
        self.assertFalse(
            self.node_b_acl() and move.EXPORT_KEY
            not in self.c.transfer_keys(),
            'node-b admitted to the export, and no record of it is left')
        # (The key is kept: Cinder's ensure_export brought the ACL back;
        # the next tick removes it.)
        self.assertIn(move.EXPORT_KEY, self.c.transfer_keys())
        self.c.tick(self.a)
        self.assertFalse(self.node_b_acl())
        self.assertNotIn(move.EXPORT_KEY, self.c.transfer_keys())
        self.assertNotIn(VOLUME_ID, self.a.source.leftover_exports)


class UnrecordedMoveExportTestCase(DatabaseDownTestBase):
    """The database goes away as the source records a move (review 9).

    node-a has already admitted node-b's initiator to its export when
    it writes the move (with ``dmclone_move_export``): nothing records
    that ACL if the write fails.
    """

    def save_as_the_database_drops(self, lands=False):
        """node-a's Store.save raises, the database away after it.

        With ``lands``, the write reached the database although its
        answer was lost.
        """
        save = self.a.store.save

        def failing_save(*args, **kwargs):
            if lands:
                save(*args, **kwargs)
            self.db_down()
            raise db_exc.DBConnectionError('lost')
        self.mock_object(self.a.store, 'save', side_effect=failing_save)
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.db_up()
        self.mock_object(self.a.store, 'save', side_effect=save)

    def test_acl_of_a_move_the_database_never_recorded_goes(self):
        # Before: the failed attach left node-b's ACL on node-a's export
        # (Cinder's remove_export after the failed initialize_connection
        # could not read the record either) with no record of it: no
        # tick, restart or later step ever removed it, and node-b stayed
        # admitted to a volume that never moved.
        self.save_as_the_database_drops()
        self.assertIsNone(self.c.transfer())
        self.c.tick(self.a)
        self.c.restart(self.a)
        self.assertNotIn(self.b.props['initiator'], _acl(self.a))

    def test_a_move_recorded_unseen_is_given_up_without_its_acl(self):
        # The write landed: the move is 'preparing', node-b built nothing
        # (no prepare was sent).  It is ended as an outlived prepare, and
        # node-b's ACL is gone; the volume moves at the next attach.
        self.save_as_the_database_drops(lands=True)
        self.assertEqual(move.PREPARING, self.c.transfer().state)
        self.assertNotIn(self.b.props['initiator'], _acl(self.a))
        self.outlive_the_prepare()
        self.c.attach(self.b)
        self.c.settle()
        self.c.assert_completed()
